"""The SLO rule and the rate rounding, shared by the HTTP load generator (platform/loadgen/) and the
in-process serving harness (workloads/serving/open_loop.py, rate_search.py), so both call a rate's
verdict and round a bisected rate the same way.

The rule (`meets_slo`): the P99 latency of answered requests within the SLO, and at most
`max_unanswered_rate` of the measured requests left unanswered (rejected, failed or timed out), so a
server or policy cannot pass by turning half its load away. A run with no answered request (P99 NaN)
never meets it. Each caller computes P99 and the unanswered share from its own records.

Standard library only: the lent GPU machine (no Ray, mlflow or pydantic) imports this through the harness.
"""

from __future__ import annotations

import math

DEFAULT_SLO_MS = 200.0  # the latency objective when none is given (xGR's P99 <= 200 ms)
DEFAULT_MAX_UNANSWERED = 0.01  # share of measured requests that may go unanswered and still meet the SLO


def meets_slo(p99_ms: float, unanswered_rate: float, slo_ms: float, max_unanswered_rate: float) -> bool:
    """P99 of answered requests within the SLO, and few enough requests shed, failed or timed out
    (a server that rejects half its load must not pass on the latency of the other half)."""
    return bool(not math.isnan(p99_ms) and p99_ms <= slo_ms and unanswered_rate <= max_unanswered_rate)


def nice_rate(rate: float) -> float:
    """Round to 3 significant digits so bisected rates read well in tables (rates <= 0 unchanged)."""
    if rate <= 0:
        return rate
    digits = 2 - int(math.floor(math.log10(rate)))
    return round(rate, digits)
