"""Load generator for the Serve app: open-loop (Poisson or bursty) and closed-loop HTTP load.

Open loop: request arrival times are drawn up front (`arrival_schedule`) and every request is sent at
its scheduled time whether or not earlier ones have answered, so an overloaded server sees its queue
grow instead of the client politely slowing down. Each request runs as its own asyncio task and the
connection pool is unbounded, so nothing waits on the client side; the gap between the scheduled and
the actual send time is recorded per request (`send_lag_ms`) so a client that falls behind is visible
in the summary instead of silently turning the test into a closed loop.

Closed loop: N workers, each sends its next request when its previous one has finished (fixed
concurrency; the offered rate is whatever the server sustains).

Requests are users' test histories from a dataset folder, drawn with a seeded RNG. Warm-up requests
(the first seconds and/or the first requests) are sent and recorded with `warmup=True` but left out of
the statistics. Every sent request ends in exactly one outcome (answered / rejected / error / timeout)
and the summary checks that the counts add up.

Outputs: per-request rows in `<results>/loadtest/<run_id>.parquet`, and one summary result row
(`kind = "loadtest"`) in the shared Parquet results (+ MLflow), keyed like `ResultRow.to_flat()`.
A rate sweep runs one load test per rate (each its own row in one experiment) and reports the highest
rate whose P99 latency meets the SLO with few unanswered requests, as in xGR's SLO-bounded throughput.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

from genrec.platform.tracking import DEFAULT_RESULTS_DIR, check_experiment_name, write_parquet_atomic
from genrec.workloads.errors import UserInputError
from genrec.workloads.metrics import latency_summary

OUTCOMES = ("answered", "rejected", "error", "timeout")
REJECT_STATUSES = frozenset({429, 503})  # the server shed load: it asks the client to retry later
TIMEOUT_STATUSES = frozenset({504, 408})  # 408: the body did not arrive in time (a client that stalls)
LOADTEST_KIND = "loadtest"
DEFAULT_MAX_UNANSWERED = 0.01

ProgressFn = Callable[[str], None]


# ------------------------------------------------------------------------------------------ config


@dataclass
class LoadConfig:
    """One load test: where to send, how (open/closed loop) and what."""

    url: str = "http://127.0.0.1:8000"
    mode: str = "open"  # open | closed
    rate: float = 10.0  # open loop: target requests per second
    concurrency: int = 1  # closed loop: outstanding requests
    burstiness: float = 1.0  # open loop: CV of inter-arrival times; 1 = Poisson, > 1 = bursty
    duration_s: float = 30.0  # measured part, after the warm-up
    warmup_s: float = 2.0
    warmup_requests: int = 0
    k: int = 10
    decoder: str | None = None
    beam_width: int | None = None
    constraint: str | None = None  # a set the deployment configures (GET /constraint-sets) or a rule
    seed: int = 0
    timeout_s: float = 10.0  # client-side limit per request; past it the request counts as a timeout
    slo_ms: float = 200.0
    max_unanswered_rate: float = DEFAULT_MAX_UNANSWERED  # SLO also needs rejected+errors+timeouts below it

    def validate(self) -> LoadConfig:
        checks = [
            (self.mode in ("open", "closed"), f"--mode {self.mode!r}: use open or closed"),
            (self.rate > 0 or self.mode == "closed", f"--rate {self.rate}: must be > 0 requests/s"),
            (self.concurrency >= 1, f"--concurrency {self.concurrency}: must be >= 1"),
            (self.burstiness > 0, f"--burstiness {self.burstiness}: must be > 0 (1 = Poisson)"),
            (self.duration_s > 0, f"--duration {self.duration_s}: must be > 0 seconds"),
            (self.warmup_s >= 0, f"--warmup-s {self.warmup_s}: must be >= 0"),
            (self.warmup_requests >= 0, f"--warmup-requests {self.warmup_requests}: must be >= 0"),
            (self.k >= 1, f"--k {self.k}: must be >= 1"),
            (
                self.beam_width is None or self.beam_width >= 1,
                f"--beam-width {self.beam_width}: must be >= 1",
            ),
            (self.timeout_s > 0, f"--timeout-s {self.timeout_s}: must be > 0"),
            (self.slo_ms > 0, f"--slo-ms {self.slo_ms}: must be > 0"),
            (0 <= self.max_unanswered_rate < 1, "--max-rejection must be in [0, 1)"),
            (self.url.startswith(("http://", "https://")), f"--url {self.url!r}: expected http://HOST:PORT"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserInputError(message)
        return self

    def payload_fields(self) -> dict:
        """The request fields every request carries besides its history."""
        out: dict = {"k": self.k}
        if self.decoder:
            out["decoder"] = self.decoder
        if self.beam_width:
            out["beam_width"] = self.beam_width
        if self.constraint:
            out["constraint"] = self.constraint
        return out


# -------------------------------------------------------------------------------------- schedule


def arrival_schedule(rate: float, duration_s: float, seed: int, burstiness: float = 1.0) -> np.ndarray:
    """Send times (seconds from the start, increasing) of an open-loop arrival process on [0, duration).

    Inter-arrival gaps are gamma distributed with mean 1/rate and coefficient of variation
    `burstiness`: shape 1/CV^2 makes CV = 1 exactly the exponential gaps of a Poisson process,
    CV > 1 clumps requests into bursts with idle gaps between, CV < 1 is smoother than Poisson.
    Drawn in chunks so a long run does not allocate rate * duration gaps at once on a guess.
    """
    if rate <= 0 or duration_s <= 0 or burstiness <= 0:
        raise ValueError("rate, duration_s and burstiness must be > 0")
    rng = np.random.default_rng(seed)
    shape = 1.0 / burstiness**2
    scale = 1.0 / (rate * shape)
    chunks, t = [], 0.0
    expected = rate * duration_s
    while t < duration_s:
        n = int(expected + 4 * math.sqrt(expected) * max(1.0, burstiness)) + 16
        gaps = rng.gamma(shape, scale, size=n)
        times = t + np.cumsum(gaps)
        chunks.append(times)
        t = float(times[-1])
    times = np.concatenate(chunks)
    return times[times < duration_s]


def inter_arrival_cv(times: np.ndarray) -> float:
    gaps = np.diff(np.concatenate([[0.0], np.asarray(times, dtype=np.float64)]))
    return float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else float("nan")


class RequestSource:
    """Request bodies from a dataset's test histories, drawn in index order with a seeded RNG
    (request i gets the same history in every run with the same seed, open or closed loop)."""

    def __init__(self, histories: Sequence[Sequence[int]], fields: dict, seed: int) -> None:
        if not histories:
            raise UserInputError("the dataset has no test users with a history to send")
        self.histories = histories
        self.fields = fields
        self.rng = np.random.default_rng(seed)
        self.index = 0

    def next(self) -> tuple[int, dict]:
        i = self.index
        self.index += 1
        history = self.histories[int(self.rng.integers(len(self.histories)))]
        return i, {"history": [int(x) for x in history], **self.fields}


# ------------------------------------------------------------------------------------------ records


@dataclass
class RequestRecord:
    """One sent request. Times are seconds from the start of the run."""

    index: int
    scheduled_s: float
    sent_s: float
    completed_s: float
    latency_ms: float  # from the actual send to the full response
    status: int  # HTTP status, 0 when no response came back
    outcome: str  # answered | rejected | error | timeout
    warmup: bool
    k: int
    history_len: int
    inflight_at_send: int  # requests outstanding when this one was sent (itself included)
    batch_size: float = math.nan  # size of the server-side dynamic batch it was decoded in
    decoder_ms: float = math.nan  # the decoder call for that batch (timings_ms.decoder_call)
    server_ms: float = math.nan  # time inside the app (timings_ms.server)
    queue_ms: float = math.nan
    retry_after_s: float = math.nan
    decoder: str = ""
    error: str = ""

    @property
    def send_lag_ms(self) -> float:
        return (self.sent_s - self.scheduled_s) * 1000.0


def classify_status(status: int) -> str:
    if status == 200:
        return "answered"
    if status in REJECT_STATUSES:
        return "rejected"
    if status in TIMEOUT_STATUSES:
        return "timeout"
    return "error"


def _float(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _error_text(body: bytes) -> str:
    try:
        detail = json.loads(body).get("detail", "")
    except (ValueError, AttributeError):
        detail = body[:200].decode("utf-8", "replace")
    return str(detail)[:300]


async def send_request(session, url: str, payload: dict, record: RequestRecord, t0: float) -> None:
    """POST one request and fill in its outcome; never raises, so no request is silently lost."""
    start = time.perf_counter()
    record.sent_s = start - t0
    try:
        async with session.post(url, json=payload) as resp:
            body = await resp.read()
            record.status = resp.status
            record.outcome = classify_status(resp.status)
            if resp.status == 200:
                data = json.loads(body)
                timings = data.get("timings_ms") or {}
                record.batch_size = _float(data.get("batch_size"))
                record.decoder_ms = _float(timings.get("decoder_call"))
                record.server_ms = _float(timings.get("server"))
                record.queue_ms = _float(timings.get("queue"))
                record.decoder = str(data.get("decoder", ""))
                if not isinstance(data.get("items"), list):
                    record.outcome, record.error = "error", "200 without an 'items' list"
            else:
                record.retry_after_s = _float(resp.headers.get("Retry-After"))
                record.error = _error_text(body)
    except TimeoutError:  # aiohttp's timeouts subclass asyncio.TimeoutError (= TimeoutError)
        record.outcome, record.error = "timeout", "client timeout"
    except Exception as e:  # connection refused/reset, bad JSON, ...: counted, never dropped
        record.outcome, record.error = "error", f"{type(e).__name__}: {e}"[:300]
    end = time.perf_counter()
    record.completed_s = end - t0
    record.latency_ms = (end - start) * 1000.0


# -------------------------------------------------------------------------------------------- runs


@dataclass
class _RunState:
    records: list[RequestRecord] = field(default_factory=list)
    inflight: int = 0

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(("sent", *OUTCOMES, "pending"), 0)
        for r in self.records:
            out["sent"] += 1
            out[r.outcome if r.outcome in OUTCOMES else "pending"] += 1
        return out


def _progress_line(state: _RunState, elapsed: float, total: float) -> str:
    c = state.counts()
    lags = [r.send_lag_ms for r in state.records[-500:]]
    lag = f"{np.percentile(lags, 99):.1f}" if lags else "-"
    return (
        f"[{elapsed:6.1f}/{total:.0f} s] sent {c['sent']}  answered {c['answered']}  "
        f"rejected {c['rejected']}  errors {c['error']}  timeouts {c['timeout']}  "
        f"in flight {state.inflight}  send lag p99 {lag} ms"
    )


async def _reporter(state: _RunState, t0: float, total: float, progress: ProgressFn, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        progress(_progress_line(state, time.perf_counter() - t0, total))


def _is_warmup(cfg: LoadConfig, index: int, at_s: float) -> bool:
    return index < cfg.warmup_requests or at_s < cfg.warmup_s


async def _tracked(session, url, payload, record, t0, state: _RunState) -> None:
    state.inflight += 1
    record.inflight_at_send = state.inflight
    try:
        await send_request(session, url, payload, record, t0)
    finally:
        state.inflight -= 1


def _new_record(index: int, payload: dict, scheduled_s: float, warmup: bool) -> RequestRecord:
    return RequestRecord(
        index=index,
        scheduled_s=scheduled_s,
        sent_s=math.nan,
        completed_s=math.nan,
        latency_ms=math.nan,
        status=0,
        outcome="pending",
        warmup=warmup,
        k=int(payload["k"]),
        history_len=len(payload["history"]),
        inflight_at_send=0,
    )


def open_loop_horizon(cfg: LoadConfig) -> float:
    """Length of the open-loop schedule: warm-up (seconds, or requests at the target rate) + duration."""
    return cfg.warmup_s + cfg.duration_s + cfg.warmup_requests / cfg.rate


async def _open_loop(session, cfg: LoadConfig, source: RequestSource, state: _RunState, t0: float) -> None:
    url = cfg.url.rstrip("/") + "/recommend"
    horizon = open_loop_horizon(cfg)
    schedule = arrival_schedule(cfg.rate, horizon, cfg.seed, cfg.burstiness)
    first_measured = schedule[cfg.warmup_requests] if cfg.warmup_requests < len(schedule) else horizon
    measure_start = max(cfg.warmup_s, float(first_measured))
    tasks = []
    for at in schedule:
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        index, payload = source.next()
        # warm-up by scheduled time so the split does not depend on how late the client is
        record = _new_record(index, payload, float(at), index < cfg.warmup_requests or at < measure_start)
        state.records.append(record)
        tasks.append(asyncio.create_task(_tracked(session, url, payload, record, t0, state)))
    await asyncio.gather(*tasks)


async def _closed_loop(session, cfg: LoadConfig, source: RequestSource, state: _RunState, t0: float) -> None:
    url = cfg.url.rstrip("/") + "/recommend"
    measure_start: list[float] = []  # set when the first measured request is issued

    async def worker() -> None:
        while True:
            now = time.perf_counter() - t0
            if measure_start and now - measure_start[0] >= cfg.duration_s:
                return
            index, payload = source.next()
            warmup = _is_warmup(cfg, index, now)
            if not warmup and not measure_start:
                measure_start.append(now)
            record = _new_record(index, payload, now, warmup)
            state.records.append(record)
            await _tracked(session, url, payload, record, t0, state)

    await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))


async def run_load(
    cfg: LoadConfig,
    histories: Sequence[Sequence[int]],
    progress: ProgressFn | None = None,
    progress_every_s: float = 5.0,
) -> tuple[list[RequestRecord], float]:
    """Run one load test against a live server; returns (records in send order, wall seconds)."""
    import aiohttp

    cfg.validate()
    source = RequestSource(histories, cfg.payload_fields(), cfg.seed)
    state = _RunState()
    # limit=0: no client-side connection cap, so an open-loop request never queues in the pool
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter() + 0.01
        total = cfg.warmup_s + cfg.duration_s
        reporter = (
            asyncio.create_task(_reporter(state, t0, total, progress, progress_every_s)) if progress else None
        )
        try:
            if cfg.mode == "open":
                await _open_loop(session, cfg, source, state, t0)
            else:
                await _closed_loop(session, cfg, source, state, t0)
        finally:
            if reporter:
                reporter.cancel()
        wall = time.perf_counter() - t0
    return state.records, wall


# ------------------------------------------------------------------------------------------ summary


@dataclass
class LoadSummary:
    sent: int
    answered: int
    rejected: int
    errors: int
    timeouts: int
    warmup: int  # sent during warm-up, excluded from everything below
    window_s: float  # from the end of warm-up to the last measured completion
    offered_rate_rps: float
    throughput_rps: float  # answered per second
    goodput_rps: float  # answered within the SLO per second
    slo_ms: float
    slo_attainment: float  # answered within the SLO / sent
    latency_ms: dict[str, float]  # mean, std, p50, p90, p95, p99 of answered requests
    error_rate: float
    rejection_rate: float
    timeout_rate: float
    unanswered_rate: float  # (rejected + errors + timeouts) / sent
    overhead_p50_ms: float  # end-to-end latency minus the decoder's time for its batch
    overhead_p99_ms: float
    decoder_p50_ms: float
    server_p50_ms: float
    queue_p50_ms: float
    batch_size_mean: float
    send_lag_p50_ms: float
    send_lag_p99_ms: float
    send_lag_max_ms: float
    max_inflight: int
    slo_met: bool
    max_unanswered_rate: float

    def check(self) -> None:
        total = self.answered + self.rejected + self.errors + self.timeouts
        if total != self.sent:
            raise AssertionError(f"lost requests: sent {self.sent} != outcomes {total}")


def _pct(values: Sequence[float], q: float) -> float:
    a = np.asarray(values, dtype=np.float64)
    a = a[~np.isnan(a)]
    return float(np.percentile(a, q)) if a.size else math.nan


def _mean(values: Sequence[float]) -> float:
    a = np.asarray(values, dtype=np.float64)
    a = a[~np.isnan(a)]
    return float(a.mean()) if a.size else math.nan


def meets_slo(p99_ms: float, unanswered_rate: float, slo_ms: float, max_unanswered_rate: float) -> bool:
    """P99 of answered requests within the SLO, and few enough requests shed, failed or timed out
    (a server that rejects half its load must not pass on the latency of the other half)."""
    return not math.isnan(p99_ms) and p99_ms <= slo_ms and unanswered_rate <= max_unanswered_rate


def summarize(records: Sequence[RequestRecord], cfg: LoadConfig) -> LoadSummary:
    """Statistics of the measured (non-warm-up) requests; checks no request went missing."""
    pending = [r.index for r in records if r.outcome not in OUTCOMES]
    if pending:
        raise AssertionError(f"requests without an outcome: {pending[:10]}")
    measured = [r for r in records if not r.warmup]
    answered = [r for r in measured if r.outcome == "answered"]
    n = len(measured)
    by = {o: sum(r.outcome == o for r in measured) for o in OUTCOMES}
    # the measured window opens where warm-up ends and closes at the last measured completion, so
    # requests still queued when sending stops count against throughput rather than vanish
    start = min((r.scheduled_s for r in measured), default=0.0)
    if cfg.mode == "open" and cfg.warmup_requests == 0:
        start = cfg.warmup_s
    end = max((r.completed_s for r in measured), default=start)
    window = max(end - start, 1e-9)
    if cfg.mode == "open":  # requests scheduled per second of the measured part of the schedule
        offered = n / max(open_loop_horizon(cfg) - start, 1e-9)
    else:
        offered = n / window
    lat = [r.latency_ms for r in answered]
    latency = latency_summary(lat)
    if latency:
        latency["p95"] = _pct(lat, 95)
    else:
        latency = dict.fromkeys(("mean", "std", "p50", "p90", "p95", "p99"), math.nan)
    within = sum(r.latency_ms <= cfg.slo_ms for r in answered)
    overhead = [r.latency_ms - r.decoder_ms for r in answered]
    lags = [r.send_lag_ms for r in measured]
    rate = (lambda c: c / n) if n else (lambda c: math.nan)
    unanswered = rate(by["rejected"] + by["error"] + by["timeout"])
    summary = LoadSummary(
        sent=n,
        answered=by["answered"],
        rejected=by["rejected"],
        errors=by["error"],
        timeouts=by["timeout"],
        warmup=len(records) - n,
        window_s=window if n else 0.0,
        offered_rate_rps=offered if n else 0.0,
        throughput_rps=len(answered) / window if n else 0.0,
        goodput_rps=within / window if n else 0.0,
        slo_ms=cfg.slo_ms,
        slo_attainment=rate(within),
        latency_ms=latency,
        error_rate=rate(by["error"]),
        rejection_rate=rate(by["rejected"]),
        timeout_rate=rate(by["timeout"]),
        unanswered_rate=unanswered,
        overhead_p50_ms=_pct(overhead, 50),
        overhead_p99_ms=_pct(overhead, 99),
        decoder_p50_ms=_pct([r.decoder_ms for r in answered], 50),
        server_p50_ms=_pct([r.server_ms for r in answered], 50),
        queue_p50_ms=_pct([r.queue_ms for r in answered], 50),
        batch_size_mean=_mean([r.batch_size for r in answered]),
        send_lag_p50_ms=_pct(lags, 50),
        send_lag_p99_ms=_pct(lags, 99),
        send_lag_max_ms=float(max(lags)) if lags else math.nan,
        max_inflight=max((r.inflight_at_send for r in records), default=0),
        slo_met=meets_slo(latency["p99"], unanswered, cfg.slo_ms, cfg.max_unanswered_rate) if n else False,
        max_unanswered_rate=cfg.max_unanswered_rate,
    )
    summary.check()
    return summary


# --------------------------------------------------------------------------------------------- rows


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
    return params


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
        "requests_path": str(requests_file) if requests_file else "",
    }
    row.update(asdict(current_environment(torch.device("cpu"))))
    row["device"] = "client:" + row["device"]  # this process only sends; the server's device is not known
    row["created_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    row["schema_version"] = RESULT_SCHEMA_VERSION
    return row


# ------------------------------------------------------------------------------------ server checks


async def fetch_health(url: str, timeout_s: float = 5.0) -> dict:
    """GET /health; unreachable or unhealthy servers become a clear UserInputError."""
    import aiohttp

    target = url.rstrip("/") + "/health"
    hint = "start it with `genrec serve --model DIR` or pass --url of a running app"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.get(target) as resp:
                body = await resp.read()
                status = resp.status
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        raise UserInputError(f"cannot reach the Serve app at {url} ({type(e).__name__}: {e}); {hint}") from e
    if status != 200:
        raise UserInputError(
            f"{target} answered HTTP {status}: {body[:200].decode('utf-8', 'replace')}; "
            + ("the app may still be starting: retry in a few seconds, or " if status in (404, 503) else "")
            + "check the `genrec serve` log"
        )
    try:
        health = json.loads(body)
    except ValueError:
        health = None
    if not isinstance(health, dict):
        raise UserInputError(f"{target}: not a JSON object; is {url} a genrec Serve app? {hint}")
    if health.get("status", "ok") != "ok":
        raise UserInputError(f"{target}: status {health.get('status')!r}; the app is not ready yet")
    return health


async def preflight(cfg: LoadConfig, history: Sequence[int]) -> None:
    """Send one request with the test's fields before any load: a request the app refuses (unknown
    decoder, beam width out of range, ...) would otherwise turn the whole run into errors."""
    import aiohttp

    payload = {"history": [int(x) for x in history], **cfg.payload_fields()}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=cfg.timeout_s)) as session:
            async with session.post(cfg.url.rstrip("/") + "/recommend", json=payload) as resp:
                status, body = resp.status, await resp.read()
    except (aiohttp.ClientError, TimeoutError, OSError):
        return  # reachability was checked by /health; slowness and failures are what the test measures
    if 400 <= status < 500 and status != 429:
        fields = ", ".join(f"{k}={v}" for k, v in cfg.payload_fields().items())
        raise UserInputError(
            f"{cfg.url}/recommend refused a request with {fields}: HTTP {status}: {_error_text(body)}; "
            "fix --decoder / --beam-width / --k / --constraint-set (see GET /decoders, /constraint-sets)"
        )


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


# -------------------------------------------------------------------------------------- rate sweep


@dataclass
class RatePoint:
    rate: float
    p99_ms: float
    unanswered_rate: float
    meets: bool
    result: object = None  # the LoadTestResult behind it (None in pure tests)


@dataclass
class RateSearch:
    points: list[RatePoint]
    best_rate: float | None  # highest rate meeting the SLO (None: not even the lowest one)
    hit_limit: bool = False  # every tried rate met the SLO up to max_rate: the true max may be higher


def nice_rate(rate: float) -> float:
    """Round to 3 significant digits so bisected rates read well in tables."""
    if rate <= 0:
        return rate
    digits = 2 - int(math.floor(math.log10(rate)))
    return round(rate, digits)


def best_of(points: Sequence[RatePoint]) -> float | None:
    """Highest tried rate that meets the SLO with every lower tried rate meeting it too (a lucky pass
    above a failure is noise, not capacity)."""
    best = None
    for p in sorted(points, key=lambda p: p.rate):
        if not p.meets:
            break
        best = p.rate
    return best


def sweep_rates(measure: Callable[[float], RatePoint], rates: Sequence[float]) -> RateSearch:
    """Measure every given rate (all of them, ascending: the curve is the point) and pick the best."""
    if not rates or any(r <= 0 for r in rates):
        raise UserInputError(f"--sweep-rates {list(rates)}: give positive rates, e.g. --sweep-rates 10,20,40")
    points = [measure(r) for r in sorted(set(rates))]
    best = best_of(points)
    return RateSearch(points, best, hit_limit=bool(points) and all(p.meets for p in points))


def find_max_rate(
    measure: Callable[[float], RatePoint],
    start_rate: float,
    max_rate: float,
    growth: float = 2.0,
    refine_steps: int = 3,
    tolerance: float = 0.05,
) -> RateSearch:
    """Grow the rate geometrically from start_rate until the SLO breaks (or max_rate passes), then
    bisect between the last passing and the first failing rate for refine_steps steps or until
    the gap is within `tolerance` of the failing rate. Assumes latency grows with load."""
    if start_rate <= 0 or max_rate < start_rate or growth <= 1 or refine_steps < 0:
        raise UserInputError(
            f"rate search needs 0 < --start-rate ({start_rate}) <= --max-rate ({max_rate}), "
            f"growth > 1 ({growth}) and refine steps >= 0 ({refine_steps})"
        )
    points: list[RatePoint] = []
    lo, hi = 0.0, None
    rate = start_rate
    while True:
        p = measure(rate)
        points.append(p)
        if not p.meets:
            hi = rate
            break
        lo = rate
        if rate >= max_rate:
            break
        rate = min(nice_rate(rate * growth), max_rate)
    if hi is None:
        return RateSearch(points, lo, hit_limit=True)
    for _ in range(refine_steps):
        if hi - lo <= tolerance * hi:
            break
        mid = nice_rate((lo + hi) / 2)
        if mid <= lo or mid >= hi:
            break
        p = measure(mid)
        points.append(p)
        if p.meets:
            lo = mid
        else:
            hi = mid
    return RateSearch(points, lo if lo > 0 else None)


def rate_measure(
    base: LoadConfig,
    histories: Sequence[Sequence[int]],
    ctx: RunContext,
    tracking: Tracking | None,
    progress: ProgressFn | None = None,
    sweep_id: str | None = None,
) -> Callable[[float], RatePoint]:
    """measure(rate): one recorded open-loop load test at that rate, as a RatePoint."""
    sweep_id = sweep_id or new_run_id("sweep")
    store = tracking.store(ctx.experiment) if tracking and tracking.mlflow else None

    def measure(rate: float) -> RatePoint:
        cfg = replace(base, rate=float(rate), mode="open")
        if progress:
            progress(f"rate {rate:g} req/s for {cfg.warmup_s:g} + {cfg.duration_s:g} s ...")
        res = run_one(cfg, histories, ctx, tracking, f"{sweep_id}-r{rate:g}", progress, store)
        s = res.summary
        return RatePoint(float(rate), s.latency_ms["p99"], s.unanswered_rate, s.slo_met, res)

    return measure


# --------------------------------------------------------------------------------------- formatting


def _ms(v: float) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _pc(v: float) -> str:
    return "-" if math.isnan(v) else f"{100 * v:.1f}%"


def format_summary(res: LoadTestResult) -> str:
    cfg, s = res.config, res.summary
    lat = s.latency_ms
    if cfg.mode == "open":
        shape = "Poisson" if cfg.burstiness == 1 else f"gamma CV {cfg.burstiness:g}"
        load = f"open loop, {cfg.rate:g} req/s offered ({shape})"
    else:
        load = f"closed loop, concurrency {cfg.concurrency}"
    warm = f"{cfg.warmup_s:g} s" + (f" / {cfg.warmup_requests} requests" if cfg.warmup_requests else "")
    lines = [
        f"loadtest {res.row['run_id']}: {cfg.url}, {load}, {cfg.duration_s:g} s after {warm} warm-up, "
        f"k={cfg.k}, decoder {res.row['decoder']}"
        + (f", beam_width={cfg.beam_width}" if cfg.beam_width else ""),
        f"sent {s.sent} = answered {s.answered} + rejected {s.rejected} + errors {s.errors} "
        f"+ timeouts {s.timeouts}   (warm-up: {s.warmup} more, not counted)",
        f"latency ms (answered): p50 {_ms(lat['p50'])}  p90 {_ms(lat['p90'])}  p95 {_ms(lat['p95'])}  "
        f"p99 {_ms(lat['p99'])}  mean {_ms(lat['mean'])} ± {_ms(lat['std'])}",
        f"throughput {s.throughput_rps:.1f} req/s (offered {s.offered_rate_rps:.1f}); goodput "
        f"{s.goodput_rps:.1f} req/s within {cfg.slo_ms:g} ms ({_pc(s.slo_attainment)} of sent)",
        f"error rate {_pc(s.error_rate)}  rejection rate {_pc(s.rejection_rate)}  "
        f"timeout rate {_pc(s.timeout_rate)}",
        f"serve overhead (latency - decoder call) p50 {_ms(s.overhead_p50_ms)} ms  "
        f"p99 {_ms(s.overhead_p99_ms)} ms; "
        f"decoder call p50 {_ms(s.decoder_p50_ms)} ms; mean batch size "
        + ("-" if math.isnan(s.batch_size_mean) else f"{s.batch_size_mean:.2f}"),
        f"client send lag p50 {_ms(s.send_lag_p50_ms)} ms  p99 {_ms(s.send_lag_p99_ms)} ms  "
        f"max {_ms(s.send_lag_max_ms)} ms; max in flight {s.max_inflight}",
        f"SLO (P99 <= {cfg.slo_ms:g} ms, unanswered <= {_pc(cfg.max_unanswered_rate)}): "
        + ("met" if s.slo_met else "NOT met"),
    ]
    if (
        cfg.mode == "open"
        and not math.isnan(s.send_lag_p99_ms)
        and s.send_lag_p99_ms > max(5.0, cfg.slo_ms / 20)
    ):
        lines.append(
            f"warning: the client sent requests late (send lag p99 {_ms(s.send_lag_p99_ms)} ms), so the "
            "server saw smoother or slower arrivals than scheduled: run the client on another machine "
            "or split the rate over several clients"
        )
    return "\n".join(lines)


def format_sweep(search: RateSearch, slo_ms: float, max_unanswered: float) -> str:
    headers = ["rate", "sent", "answered", "p50 ms", "p99 ms", "unanswered", "throughput", "goodput", "SLO"]
    rows = []
    for p in sorted(search.points, key=lambda p: p.rate):
        s = p.result.summary if isinstance(p.result, LoadTestResult) else None
        rows.append(
            [
                f"{p.rate:g}",
                str(s.sent) if s else "-",
                str(s.answered) if s else "-",
                _ms(s.latency_ms["p50"]) if s else "-",
                _ms(p.p99_ms),
                _pc(p.unanswered_rate),
                f"{s.throughput_rps:.1f}" if s else "-",
                f"{s.goodput_rps:.1f}" if s else "-",
                "ok" if p.meets else "fail",
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*r).rstrip() for r in [headers, ["-" * w for w in widths], *rows]]
    what = f"P99 <= {slo_ms:g} ms and unanswered <= {_pc(max_unanswered)}"
    if search.best_rate is None:
        out.append(f"no tried rate meets {what}")
    else:
        more = " (the highest rate tried: the limit may be higher)" if search.hit_limit else ""
        out.append(f"highest rate meeting {what}: {search.best_rate:g} req/s{more}")
    return "\n".join(out)
