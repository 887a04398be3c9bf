"""One open-loop load test in process: Poisson arrivals served by a batching policy and a decoder, one
worker, no Ray, no HTTP, no event loop (what the lent GPU machine can run).

Arrivals are drawn up front (`poisson_arrivals`, seeded); every request is admitted at its arrival time
or, when it arrives during a decode, right after that decode with its true arrival time (the latency
clock starts at arrival either way), and the free worker runs the policy's `next_batch()` or sleeps
until the next arrival or due time (`run_open_loop`, `OpenLoop`).

Per request (`Record`): answered (latency = answer time - arrival), rejected (admission: 503 in the
app) or timed out (still queued after `request_timeout_s`, dropped before decoding as the app does).
`summarize` gives latency percentiles of answered requests, goodput and the SLO verdict over the
measured part: the P99 latency within the SLO and at most `max_unanswered` (1 %) of the requests
rejected or timed out (`meets_slo` in workloads/serving/slo.py, the load generator's rule too), so a
policy cannot pass by turning half the load away.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from genrec.workloads.serving.slo import DEFAULT_MAX_UNANSWERED, DEFAULT_SLO_MS, meets_slo
from genrec.workloads.serving.xschedule import BatchPolicy

OUTCOMES = ("answered", "rejected", "timeout")
ServeBatch = Callable[[list[Any]], None]  # decodes a batch of payloads (blocking)


@dataclass(frozen=True)
class LoadSpec:
    """One open-loop load test."""

    rate: float  # requests per second (Poisson)
    duration_s: float  # arrivals are drawn on [0, duration)
    warmup_s: float = 2.0  # arrivals before this are served but not counted
    seed: int = 0
    slo_s: float = DEFAULT_SLO_MS / 1e3
    request_timeout_s: float = 10.0
    max_unanswered: float = DEFAULT_MAX_UNANSWERED


@dataclass
class Record:
    index: int
    arrival_s: float  # seconds from the start of the run
    tokens: int
    warmup: bool
    outcome: str = ""
    latency_s: float = math.nan
    queue_s: float = math.nan
    batch_size: int = 0
    predicted_s: float = 0.0  # the policy's prediction at admission (slo; 0 for fixed)
    replica: int = 0  # which replica served it (workloads/serving/replicas.py; 0 with one)


def poisson_arrivals(rate: float, duration_s: float, seed: int) -> np.ndarray:
    """Arrival times on [0, duration) of a Poisson process (exponential gaps with mean 1/rate)."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError("rate and duration_s must be > 0")
    rng = np.random.default_rng(seed)
    n = int(rate * duration_s + 6 * math.sqrt(rate * duration_s) + 16)
    times = np.cumsum(rng.exponential(1.0 / rate, size=n))
    while times[-1] < duration_s:  # a very unlikely short draw: extend it
        times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(1.0 / rate, size=n))])
    return times[times < duration_s]


# ------------------------------------------------------------------------------------------- run


class OpenLoop:
    """One worker serving a fixed arrival schedule through a policy (see `run_open_loop`)."""

    def __init__(
        self, policy: BatchPolicy, serve_batch: ServeBatch, requests, spec: LoadSpec, clock, start_s=None
    ) -> None:
        self.policy, self.serve_batch, self.spec, self.clock = policy, serve_batch, spec, clock
        self.records = [Record(i, off, tok, off < spec.warmup_s) for i, (off, _, tok) in enumerate(requests)]
        self.payloads = [p for _, p, _ in requests]
        self.next = 0  # the first request not yet admitted
        self.t0 = clock() if start_s is None else start_s  # the clock's time at arrival offset 0

    def admit_arrived(self, now: float) -> None:
        """Admit every request that has arrived by `now`, each with its own arrival time."""
        while self.next < len(self.records) and self.t0 + self.records[self.next].arrival_s <= now:
            rec = self.records[self.next]
            admission = self.policy.admit(rec, rec.tokens, arrival_s=self.t0 + rec.arrival_s)
            rec.predicted_s = admission.predicted_s
            if not admission.admitted:
                rec.outcome = "rejected"
            self.next += 1

    def run_batch(self, batch: list) -> None:
        """Decode one batch; requests already past their timeout are dropped first (as the app does).
        Requests that arrived meanwhile are admitted before the policy hears the batch has ended, so
        they see the queue and the running batch as the app's event loop would have at their arrival."""
        start = self.clock()
        live = []
        for q in batch:
            if start - (self.t0 + q.key.arrival_s) > self.spec.request_timeout_s:
                q.key.outcome = "timeout"
            else:
                live.append(q)
        if live:
            self.serve_batch([self.payloads[q.key.index] for q in live])
        end = self.clock()
        self.admit_arrived(end)
        self.policy.record(live, end - start)
        for q in live:
            rec = q.key
            rec.outcome, rec.batch_size = "answered", len(live)
            rec.latency_s = end - (self.t0 + rec.arrival_s)
            rec.queue_s = start - (self.t0 + rec.arrival_s)
            self.policy.answered(rec.predicted_s, rec.latency_s)

    def wait_s(self, now: float) -> float | None:
        """How long the free worker may sleep: until the next arrival or due time (None: all done)."""
        due = self.policy.due_in()
        upcoming = (
            self.t0 + self.records[self.next].arrival_s - now if self.next < len(self.records) else None
        )
        if due is None and upcoming is None:
            return None
        return min(w for w in (due, upcoming) if w is not None)


def run_open_loop(
    policy: BatchPolicy,
    serve_batch: ServeBatch,
    requests: Sequence[tuple[float, Any, int]],
    spec: LoadSpec,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
    start_s: float | None = None,
) -> list[Record]:
    """Serve `requests` ((arrival offset s, payload, tokens), ascending) with one worker; returns one
    Record per request, each with its outcome. The policy must use the same `clock`. Arrival offset 0
    is `start_s` on that clock (default: now); replicas in other processes share one (replicas.py)."""
    run = OpenLoop(policy, serve_batch, requests, spec, clock, start_s)
    while True:
        now = clock()
        run.admit_arrived(now)
        batch = policy.next_batch()
        if batch:
            run.run_batch(batch)
            continue
        wait = run.wait_s(now)
        if wait is None:
            return run.records
        if wait > 0:
            sleep(wait)


def summarize(records: Sequence[Record], spec: LoadSpec) -> dict:
    """Latency percentiles of answered requests, goodput and the SLO verdict, over the measured part."""
    measured = [r for r in records if not r.warmup]
    missing = [r.index for r in records if r.outcome not in OUTCOMES]
    if missing:
        raise AssertionError(f"requests without an outcome: {missing[:10]}")
    n = len(measured)
    by = {o: sum(r.outcome == o for r in measured) for o in OUTCOMES}
    answered = [r for r in measured if r.outcome == "answered"]
    lat = np.array([r.latency_s for r in answered]) * 1e3
    end = max([r.arrival_s + r.latency_s for r in answered] + [spec.duration_s])
    window = max(end - spec.warmup_s, 1e-9)
    pct = {f"p{q}_ms": float(np.percentile(lat, q)) if len(lat) else math.nan for q in (50, 90, 99)}
    unanswered = (by["rejected"] + by["timeout"]) / n if n else math.nan
    slo_ms = spec.slo_s * 1e3
    return {
        "rate": spec.rate,
        "sent": n,
        **by,
        **pct,
        "mean_ms": float(lat.mean()) if len(lat) else math.nan,
        "queue_p50_ms": float(np.median([r.queue_s for r in answered]) * 1e3) if answered else math.nan,
        "batch_size_mean": float(np.mean([r.batch_size for r in answered])) if answered else math.nan,
        "offered_rps": n / max(spec.duration_s - spec.warmup_s, 1e-9),
        "throughput_rps": len(answered) / window,
        "goodput_rps": float((lat <= slo_ms).sum()) / window,
        "rejection_rate": by["rejected"] / n if n else math.nan,
        "unanswered_rate": unanswered,
        # no measured request: unanswered and P99 are NaN, which never meets the SLO
        "slo_met": meets_slo(pct["p99_ms"], unanswered, slo_ms, spec.max_unanswered),
    }
