"""What a load test leaves behind: per-request rows and the one summary result row.

`write_requests` writes one Parquet row per sent request (warm-up included and flagged) to
`<results>/loadtest/<run_id>.parquet`; `summary_row` flattens a `LoadSummary` into one result row
(`kind = "loadtest"`), keyed like `ResultRow.to_flat()`, for the shared Parquet results and MLflow.
`decoder_params` names the point a row measured (mode, rate or concurrency, and the server's batching
as GET /health reports it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from genrec.platform.loadgen.client import RequestRecord
from genrec.platform.loadgen.requests import LoadConfig
from genrec.platform.loadgen.stats import LoadSummary
from genrec.workloads.io import write_parquet_atomic

LOADTEST_KIND = "loadtest"


def requests_path(results_dir: str | os.PathLike, run_id: str) -> Path:
    return Path(results_dir).resolve() / "loadtest" / f"{run_id}.parquet"


def write_requests(records: Sequence[RequestRecord], path: Path, run_id: str) -> Path:
    """Per-request rows (one per sent request, warm-up included and flagged) to Parquet, atomically."""
    rows = []
    for r in records:
        d = asdict(r)
        d["send_lag_ms"] = r.send_lag_ms
        d["run_id"] = run_id
        rows.append(d)
    schema = pa.schema(
        [
            ("run_id", pa.string()),
            ("index", pa.int64()),
            ("scheduled_s", pa.float64()),
            ("sent_s", pa.float64()),
            ("send_lag_ms", pa.float64()),
            ("completed_s", pa.float64()),
            ("latency_ms", pa.float64()),
            ("status", pa.int32()),
            ("outcome", pa.string()),
            ("warmup", pa.bool_()),
            ("k", pa.int32()),
            ("history_len", pa.int32()),
            ("inflight_at_send", pa.int32()),
            ("batch_size", pa.float64()),
            ("decoder_ms", pa.float64()),
            ("server_ms", pa.float64()),
            ("queue_ms", pa.float64()),
            ("retry_after_s", pa.float64()),
            ("decoder", pa.string()),
            ("error", pa.string()),
        ]
    )
    table = pa.Table.from_pylist([{k: d[k] for k in schema.names} for d in rows], schema=schema)
    return write_parquet_atomic(table, path)


@dataclass
class RunContext:
    """What the load test ran against (from GET /health and the options), for the result row."""

    experiment: str = "loadtest"
    label: str = ""
    dataset: str = ""
    model: str = ""
    health: dict = field(default_factory=dict)


def decoder_params(cfg: LoadConfig, health: dict) -> dict:
    """The configuration that identifies a load-test point; becomes decoder_params + param_* columns."""
    params: dict = {"mode": cfg.mode, "k": cfg.k}
    if cfg.mode == "open":
        params["rate"] = cfg.rate
        params["burstiness"] = cfg.burstiness
    else:
        params["concurrency"] = cfg.concurrency
    if cfg.beam_width:
        params["beam_width"] = cfg.beam_width
    if cfg.constraint:
        params["constraint"] = cfg.constraint
    for key in ("max_batch_size", "batch_wait_timeout_s", "replicas"):
        if isinstance(health.get(key), int | float) and not isinstance(health.get(key), bool):
            params[key] = health[key]
    for key in ("ingress", "handler_loop"):  # Serve's per-request cost differs between them
        if isinstance(health.get(key), str):
            params[key] = health[key]
    return {**params, **batching_params(health.get("batching"))}


def batching_params(batching: object) -> dict:
    """The app's batching policy (fixed | slo) and, for slo, its token budget and wait quota: without
    them the rows of an slo app and a fixed one with the same max_batch_size look alike."""
    if not isinstance(batching, dict) or not isinstance(batching.get("policy"), str):
        return {}
    out: dict = {"batching_policy": batching["policy"]}
    if batching["policy"] == "slo":
        for key in ("token_budget", "wait_quota_ms"):
            if isinstance(batching.get(key), int | float) and not isinstance(batching.get(key), bool):
                out[key] = batching[key]
    return out


def _summary_columns(summary: LoadSummary) -> dict:
    """The measured columns of the summary row: latency, rates, counts, timings, send lag."""
    return {
        **{f"latency_{k}_ms": v for k, v in summary.latency_ms.items()},
        "throughput_rps": summary.throughput_rps,
        "throughput_users_per_s": summary.throughput_rps,  # one user per request: the generic report's axis
        "offered_rate_rps": summary.offered_rate_rps,
        "goodput_rps": summary.goodput_rps,
        "slo_ms": summary.slo_ms,
        "slo_met": summary.slo_met,
        "slo_attainment": summary.slo_attainment,
        "max_unanswered_rate": summary.max_unanswered_rate,
        "error_rate": summary.error_rate,
        "rejection_rate": summary.rejection_rate,
        "timeout_rate": summary.timeout_rate,
        "unanswered_rate": summary.unanswered_rate,
        "count_sent": summary.sent,
        "count_answered": summary.answered,
        "count_rejected": summary.rejected,
        "count_errors": summary.errors,
        "count_timeouts": summary.timeouts,
        "count_warmup": summary.warmup,
        "window_s": summary.window_s,
        "overhead_p50_ms": summary.overhead_p50_ms,
        "overhead_p99_ms": summary.overhead_p99_ms,
        "time_decoder_p50_ms": summary.decoder_p50_ms,
        "time_server_p50_ms": summary.server_p50_ms,
        "time_queue_p50_ms": summary.queue_p50_ms,
        "batch_size_mean": summary.batch_size_mean,
        "send_lag_p50_ms": summary.send_lag_p50_ms,
        "send_lag_p99_ms": summary.send_lag_p99_ms,
        "send_lag_max_ms": summary.send_lag_max_ms,
        "max_inflight": summary.max_inflight,
    }


def summary_row(
    summary: LoadSummary,
    cfg: LoadConfig,
    ctx: RunContext,
    run_id: str,
    records: Sequence[RequestRecord],
    wall_s: float,
    requests_file: Path | None,
) -> dict:
    """The summary as one flat result row (same key conventions as `ResultRow.to_flat`)."""
    import torch

    from genrec.workloads.results import RESULT_SCHEMA_VERSION, current_environment

    seen = [r.decoder for r in records if r.decoder]
    decoder = cfg.decoder or (seen[0] if seen else "default")
    params = decoder_params(cfg, ctx.health)
    row: dict = {
        "experiment": ctx.experiment,
        "run_id": run_id,
        "kind": LOADTEST_KIND,
        "label": ctx.label,
        "decoder": decoder,
        "decoder_params": json.dumps(params, sort_keys=True),
        **{f"param_{k}": v for k, v in params.items()},
        "dataset": ctx.dataset,
        "model": ctx.model,
        "split": "test",
        "seed": cfg.seed,
        "url": cfg.url,
        "mode": cfg.mode,
        "duration_s": cfg.duration_s,
        "warmup_s": cfg.warmup_s,
        "timeout_s": cfg.timeout_s,
        "wall_s": wall_s,
        **_summary_columns(summary),
        "requests_path": str(requests_file) if requests_file else "",
    }
    row.update(asdict(current_environment(torch.device("cpu"))))
    row["device"] = "client:" + row["device"]  # this process only sends; the server's device is not known
    row["created_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    row["schema_version"] = RESULT_SCHEMA_VERSION
    return row
