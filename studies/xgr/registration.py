"""The xGR study's `benchmark:` entry (typed Params), registered into genrec.workloads.benchmark_registry.
Its rows are drawn by the generic benchmark-lines page (no page of its own)."""

from __future__ import annotations

from dataclasses import dataclass

from genrec.studies.xgr.xgr_serving import METRICS, parse_rates, serving_point
from genrec.workloads.benchmark_registry import (
    Benchmark,
    check_at_least,
    check_choice,
    check_open_unit,
    register_benchmark,
)
from genrec.workloads.serving.slo import DEFAULT_SLO_MS
from genrec.workloads.serving.xschedule import POLICIES


@dataclass(frozen=True, kw_only=True)
class ServingParams:
    model: str
    data: str = ""
    decoder: str = "xgr"
    beam_width: int = 32
    k: int = 10
    policy: str = "slo"
    max_batch_size: int = 16
    token_budget: int = 0
    wait_share: float = 0.3
    budget_share: float = 0.35
    slo_ms: float = DEFAULT_SLO_MS
    rates: str = "5,10,20,40,80"
    refine: int = 2
    duration_s: float = 15.0
    warmup_s: float = 2.0
    seed: int = 0
    threads: int = 1
    device: str = "cpu"
    replicas: int = 1

    def validate(self) -> None:
        """Before Ray starts: known policy, positive sizes, shares in (0, 1), a readable rate list."""
        check_choice(self, "policy", POLICIES)
        check_at_least(self, {"beam_width": 1, "k": 1, "max_batch_size": 1, "replicas": 1})
        check_open_unit(self, "wait_share", "budget_share")
        parse_rates(self.rates)


BENCHMARK = Benchmark(
    "xgr_serving",
    ServingParams,
    serving_point,
    METRICS,
    "highest open-loop rate meeting a P99 SLO for one decoder x batching policy (in-process harness)",
    path_params=("model", "data"),
    dataset_params=("data",),
)

register_benchmark(BENCHMARK)
