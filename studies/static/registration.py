"""The STATIC study's `benchmark:` entries (typed Params), registered into
genrec.workloads.benchmark_registry. Their rows are drawn by the generic benchmark-lines page."""

from __future__ import annotations

from dataclasses import dataclass

from genrec.studies.static.static_point import KERNELS, SCALING_BACKENDS, branch_point, scaling_point
from genrec.workloads.benchmark_registry import Benchmark, check_at_least, check_choice, register_benchmark
from genrec.workloads.errors import UserInputError

SIZES = {"constraint_size": 1, "vocab": 1, "levels": 1, "batch": 1, "beam": 1, "reps": 1, "dense_levels": 0}
SIZES |= {"warmup": 0}


def check_sid_space(params, size: str) -> None:
    """The rules both STATIC benchmarks share: d < L, and `size` (a set size) fits the SID space V^L."""
    levels, vocab = params.levels, params.vocab
    if params.dense_levels >= levels:
        raise UserInputError(
            f"`dense_levels` must be below levels ({levels}), got {params.dense_levels} (the paper uses 2)"
        )
    value = getattr(params, size)
    if value > vocab**levels:
        raise UserInputError(f"`{size}` = {value} exceeds the SID space vocab^levels = {vocab}^{levels}")


@dataclass(frozen=True, kw_only=True)
class ScalingParams:
    constraint_size: int
    vocab: int = 2048
    levels: int = 8
    batch: int = 2
    beam: int = 70
    backend: str = "static"
    dense_levels: int = 2
    reps: int = 20
    warmup: int = 3
    temp: float = 3.0
    baseline_max_size: int = 10**6
    threads: int = 2
    device: str = "cpu"
    seed: int = 0

    def validate(self) -> None:
        check_at_least(self, {**SIZES, "baseline_max_size": 0})
        check_choice(self, "backend", SCALING_BACKENDS)
        check_sid_space(self, "constraint_size")


@dataclass(frozen=True, kw_only=True)
class BranchParams:
    max_branch: int
    constraint_size: int = 100_000
    vocab: int = 2048
    levels: int = 8
    batch: int = 2
    beam: int = 70
    dense_levels: int = 2
    kernel: str = "torch"
    reps: int = 50
    warmup: int = 5
    threads: int = 2
    device: str = "cpu"
    seed: int = 0

    def validate(self) -> None:
        check_at_least(self, {"max_branch": 1, **SIZES})
        check_choice(self, "kernel", KERNELS)
        check_sid_space(self, "max_branch")
        if self.max_branch > self.vocab:
            raise UserInputError(
                f"`max_branch` = {self.max_branch} cannot exceed the codebook size vocab = {self.vocab}"
            )


SCALING_METRICS = (
    "step_ms",
    "unconstrained_step_ms",
    "overhead_ratio",
    "overhead_ms",
    "step_ms_p99",
    "build_s",
    "memory_mb",
    "mb_per_million",
    "compliance",
)
BRANCH_METRICS = ("kernel_ms", "mask_kernel_ms", "kernel_ms_p99", "kernel_us_per_beam", "max_branch_factor")

BENCHMARKS = (
    Benchmark(
        "static_scaling",
        ScalingParams,
        scaling_point,
        SCALING_METRICS,
        "STATIC / a baseline backend: per-step constrained decoding time vs unconstrained at one |C|, V",
    ),
    Benchmark(
        "static_branch",
        BranchParams,
        branch_point,
        BRANCH_METRICS,
        "the VNTK mask step alone at one maximum branch factor (last-level nodes with B children each)",
    ),
)

for _bench in BENCHMARKS:
    register_benchmark(_bench)
