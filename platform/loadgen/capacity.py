"""SLO-bounded capacity: the highest request rate whose P99 latency meets the SLO with few requests
left unanswered, as in xGR's SLO-bounded throughput.

`sweep_rates` measures every given rate; `find_max_rate` grows the rate geometrically until the SLO
breaks, then bisects (rates rounded by `nice_rate`, workloads/serving/slo.py, shared with the
in-process harness). Both take a `measure(rate) -> RatePoint` function, so they are pure and testable
without a server; `rate_measure` builds the real one, one recorded open-loop load test per rate
(platform/loadgen/run.py), each its own result row in one experiment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from genrec.platform.loadgen.client import ProgressFn
from genrec.platform.loadgen.requests import LoadConfig
from genrec.platform.loadgen.rows import RunContext
from genrec.platform.loadgen.run import Tracking, new_run_id, run_one
from genrec.workloads.errors import UserInputError
from genrec.workloads.serving.slo import nice_rate


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
