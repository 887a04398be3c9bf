"""The harness's rate search: per arm, the highest request rate that meets the SLO.

Rates are tried in ascending order until one fails, then bisected between the last pass and the first
failure (`Search`; midpoints rounded by `nice_rate` from workloads/serving/slo.py, as the load generator
rounds them); `interleaved_search` runs every arm's search one load test at a time so drift on a shared
machine hits all arms alike, and `aggregate` reduces one arm's repeats to medians and min-max.
The measurements themselves come from a `measure(label, rate)` function (workloads/serving/arms.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from genrec.workloads.serving.slo import nice_rate


@dataclass
class Search:
    """One arm's rate search: the highest rate meeting the SLO lies in [lo, hi)."""

    points: list[dict] = field(default_factory=list)
    lo: float | None = None  # highest rate that met the SLO (every lower tried rate met it too)
    hi: float | None = None  # lowest rate that failed it

    def add(self, point: dict) -> None:
        self.points.append(point)
        if point["slo_met"]:
            self.lo = max(self.lo or 0.0, point["rate"])
        else:
            self.hi = min(self.hi or math.inf, point["rate"])

    def midpoint(self) -> float | None:
        """The next rate to bisect at, or None (no pass and fail to bisect between, or they touch)."""
        if self.lo is None or self.hi is None:
            return None
        mid = nice_rate((self.lo + self.hi) / 2)
        return mid if self.lo < mid < self.hi else None


def interleaved_search(
    labels: Sequence[str],
    measure: Callable[[str, float], dict],
    rates: Sequence[float] | Mapping[str, Sequence[float]],
    refine: int,
) -> dict[str, Search]:
    """Every arm's rate search, interleaved one load test at a time so drift on a shared machine hits
    all arms alike: its rates in ascending order (`rates`, or `rates[label]`; an arm drops out at its
    first failure), then `refine` rounds of bisection between each arm's last pass and first failure."""
    searches = {label: Search() for label in labels}
    own = {label: sorted(set(rates[label] if isinstance(rates, Mapping) else rates)) for label in labels}
    for i in range(max(len(r) for r in own.values())):
        for label in labels:
            if searches[label].hi is None and i < len(own[label]):
                searches[label].add(measure(label, own[label][i]))
    for _ in range(refine):
        for label in labels:
            mid = searches[label].midpoint()
            if mid is not None:
                searches[label].add(measure(label, mid))
    return searches


def aggregate(searches: list[Search], token_budget: int) -> dict:
    """Medians and spread of one arm's repeats (a repeat with no passing rate counts as 0)."""
    best = [s.lo or 0.0 for s in searches]
    at_best = [next((p for p in s.points if p["rate"] == s.lo), None) for s in searches]
    p99 = [p["p99_ms"] for p in at_best if p]
    return {
        "best_rates": best,
        "best_rate_median": statistics.median(best),
        "best_rate_min": min(best),
        "best_rate_max": max(best),
        "p99_ms_at_best_median": statistics.median(p99) if p99 else math.nan,
        "hit_limit": any(s.hi is None for s in searches),
        "token_budget": token_budget,
        "repeats": [{"points": s.points, "best_rate": s.lo, "hit_limit": s.hi is None} for s in searches],
    }
