"""Statistics of one load test: `summarize` turns the request records into a `LoadSummary`.

Warm-up requests are left out; the rest are counted by outcome (the counts must add up to the sent
requests), and latency percentiles, throughput, goodput within the SLO, the serve overhead over the
decoder call and the client's send lag are computed over the measured window. The verdict `slo_met`,
which the rate search (platform/loadgen/capacity.py) reads, is `meets_slo` (P99 of answered requests
within the SLO, few requests unanswered) from workloads/serving/slo.py, the one definition the
in-process serving harness (workloads/serving/open_loop.py) applies too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from genrec.platform.loadgen.client import OUTCOMES, RequestRecord
from genrec.platform.loadgen.requests import LoadConfig, open_loop_horizon
from genrec.workloads.metrics import latency_summary
from genrec.workloads.serving.slo import meets_slo


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


def _measured_window(measured: Sequence[RequestRecord], cfg: LoadConfig) -> tuple[float, float]:
    """(window seconds, offered requests per second) of the measured requests.

    The measured window opens where warm-up ends and closes at the last measured completion, so
    requests still queued when sending stops count against throughput rather than vanish."""
    n = len(measured)
    start = min((r.scheduled_s for r in measured), default=0.0)
    if cfg.mode == "open" and cfg.warmup_requests == 0:
        start = cfg.warmup_s
    end = max((r.completed_s for r in measured), default=start)
    window = max(end - start, 1e-9)
    if cfg.mode == "open":  # requests scheduled per second of the measured part of the schedule
        offered = n / max(open_loop_horizon(cfg) - start, 1e-9)
    else:
        offered = n / window
    return window, offered


def _latency_ms(answered: Sequence[RequestRecord]) -> dict[str, float]:
    """mean, std, p50, p90, p95, p99 of the answered requests' latency (all NaN when none answered)."""
    lat = [r.latency_ms for r in answered]
    latency = latency_summary(lat)
    if latency:
        latency["p95"] = _pct(lat, 95)
    else:
        latency = dict.fromkeys(("mean", "std", "p50", "p90", "p95", "p99"), math.nan)
    return latency


def summarize(records: Sequence[RequestRecord], cfg: LoadConfig) -> LoadSummary:
    """Statistics of the measured (non-warm-up) requests; checks no request went missing."""
    pending = [r.index for r in records if r.outcome not in OUTCOMES]
    if pending:
        raise AssertionError(f"requests without an outcome: {pending[:10]}")
    measured = [r for r in records if not r.warmup]
    answered = [r for r in measured if r.outcome == "answered"]
    n = len(measured)
    by = {o: sum(r.outcome == o for r in measured) for o in OUTCOMES}
    window, offered = _measured_window(measured, cfg)
    latency = _latency_ms(answered)
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
