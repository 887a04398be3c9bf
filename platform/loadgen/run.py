"""One recorded load test: check the server and the dataset (`prepare`), then run, summarise and record
it (`run_one`).

`prepare` validates the options, asks GET /health, finds the dataset (--data or the one the server
reports), loads its test histories and sends one preflight request, all before any load is sent.
`run_one` runs the load (platform/loadgen/client.py), summarises it (platform/loadgen/stats.py) and
writes its per-request rows and result row (platform/loadgen/rows.py) and, with `Tracking.mlflow`, an
MLflow run.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from genrec.platform.loadgen.client import ProgressFn, RequestRecord, fetch_health, preflight, run_load
from genrec.platform.loadgen.requests import LoadConfig
from genrec.platform.loadgen.rows import RunContext, requests_path, summary_row, write_requests
from genrec.platform.loadgen.stats import LoadSummary, summarize
from genrec.workloads.errors import UserInputError
from genrec.workloads.results_store import DEFAULT_RESULTS_DIR, check_experiment_name

# ------------------------------------------------------------------------------------ before the load


def resolve_dataset(data: str | os.PathLike | None, health: dict) -> Path:
    """--data, else the dataset folder the server reports it was loaded with."""
    if data is not None:
        path, source = Path(data), "--data"
    elif health.get("dataset"):
        path, source = Path(str(health["dataset"])), "the server's /health"
    else:
        raise UserInputError("the server's /health names no dataset; pass --data DIR (the model's dataset)")
    if not path.is_dir():
        raise UserInputError(
            f"dataset folder {path} (from {source}) does not exist here; pass --data DIR with the "
            "dataset the served model was trained on"
        )
    return path


def load_histories(path: Path) -> list[list[int]]:
    from genrec.workloads.data.dataset import load_dataset

    return [ex.history for ex in load_dataset(path).eval_examples("test")]


# ----------------------------------------------------------------------------------------- one test


@dataclass
class LoadTestResult:
    config: LoadConfig
    summary: LoadSummary
    records: list[RequestRecord]
    row: dict
    requests_file: Path
    row_file: Path | None
    mlflow_run: str | None = None


@dataclass
class Tracking:
    results_dir: Path = Path(DEFAULT_RESULTS_DIR)
    mlflow: bool = True
    mlflow_uri: str | None = None  # None: the embedded sqlite store under results_dir

    def store(self, experiment: str):
        from genrec.platform.mlflow_store import MlflowStore, sqlite_uri

        return MlflowStore(self.mlflow_uri or sqlite_uri(self.results_dir), experiment)


def new_run_id(prefix: str = "lt") -> str:
    return f"{prefix}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"


def run_one(
    cfg: LoadConfig,
    histories: Sequence[Sequence[int]],
    ctx: RunContext,
    tracking: Tracking | None,
    run_id: str | None = None,
    progress: ProgressFn | None = None,
    store=None,
) -> LoadTestResult:
    """Run, summarise and record one load test (tracking None: nothing written)."""
    run_id = run_id or new_run_id()
    records, wall = asyncio.run(run_load(cfg, histories, progress))
    summary = summarize(records, cfg)
    req_file = requests_path(tracking.results_dir if tracking else ".", run_id)
    row_file = None
    mlflow_run = None
    if tracking:
        write_requests(records, req_file, run_id)
    row = summary_row(summary, cfg, ctx, run_id, records, wall, req_file if tracking else None)
    if tracking:
        from genrec.platform.tracking import write_result_row

        row_file = write_result_row(tracking.results_dir, row)
        if tracking.mlflow:
            mlflow_run = (store or tracking.store(ctx.experiment)).log_row(row)
    return LoadTestResult(cfg, summary, records, row, req_file, row_file, mlflow_run)


def prepare(cfg: LoadConfig, data: str | os.PathLike | None) -> tuple[dict, Path, list[list[int]]]:
    """Check the server and the dataset before any load is sent."""
    cfg.validate()
    health = asyncio.run(fetch_health(cfg.url, min(cfg.timeout_s, 10.0)))
    path = resolve_dataset(data, health)
    histories = load_histories(path)
    if not histories:
        raise UserInputError(f"{path}: no test users with a history to send; pass another --data")
    asyncio.run(preflight(cfg, histories[0]))
    return health, path, histories


def run_context(experiment: str, label: str, dataset: Path, health: dict) -> RunContext:
    check_experiment_name(experiment)
    return RunContext(experiment, label, dataset.name, str(health.get("model", "")), health)
