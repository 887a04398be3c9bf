"""The async HTTP client of the load generator: per-request records, the open and closed loops, and the
two requests sent before any load (GET /health, one preflight POST /recommend).

Open loop: every request is sent at its scheduled time (platform/loadgen/requests.py draws the times)
as its own asyncio task, over a connection pool with no limit, so nothing waits on the client side; the
gap between the scheduled and the actual send time is kept per request (`RequestRecord.send_lag_ms`).
Closed loop: N workers, each sends its next request when its previous one has finished. Every sent
request ends in exactly one of `OUTCOMES`; `send_request` never raises, so no request is lost.
This is the only load-generator module that imports aiohttp (lazily, inside the functions that send).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from genrec.platform.loadgen.requests import LoadConfig, RequestSource, arrival_schedule, open_loop_horizon
from genrec.workloads.errors import UserInputError

OUTCOMES = ("answered", "rejected", "error", "timeout")
REJECT_STATUSES = frozenset({429, 503})  # the server shed load: it asks the client to retry later
TIMEOUT_STATUSES = frozenset({504, 408})  # 408: the body did not arrive in time (a client that stalls)

ProgressFn = Callable[[str], None]


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
