"""The MaRI study's `benchmark:` entries (typed Params) and report page, registered into the core
registries (genrec.workloads.benchmark_registry, genrec.dashboards.registry)."""

from __future__ import annotations

from dataclasses import dataclass

from genrec.dashboards.registry import PageKind, register_page
from genrec.studies.mari.mari_matmul import fragmented_point, matmul_point
from genrec.studies.mari.mari_model import model_point
from genrec.workloads.benchmark_registry import Benchmark, check_at_least, register_benchmark
from genrec.workloads.ranking.model import BENCH_CONFIG

# sizes of one request every MaRI benchmark takes: >= 1, except the optional cross block and warm-up
SIZES = {"b": 1, "d_user": 1, "d_item": 1, "d_hidden": 1, "reps": 1, "d_cross": 0, "warmup": 0}


@dataclass(frozen=True, kw_only=True)
class MatmulParams:
    b: int = 1000
    d_user: int = 4000
    d_item: int = 1000
    d_cross: int = 0
    d_hidden: int = 512
    reps: int = 20
    warmup: int = 3
    threads: int = 2
    device: str = "cpu"
    seed: int = 0
    with_concat: bool = False

    def validate(self) -> None:
        check_at_least(self, SIZES)


@dataclass(frozen=True, kw_only=True)
class FragmentedParams:
    chunk: int = 50
    b: int = 2000
    d_user: int = 4000
    d_item: int = 1000
    d_cross: int = 0
    d_hidden: int = 256
    reps: int = 20
    warmup: int = 3
    threads: int = 2
    device: str = "cpu"
    seed: int = 0

    def validate(self) -> None:
        check_at_least(self, {"chunk": 1, **SIZES})


@dataclass(frozen=True, kw_only=True)
class ModelParams:
    b: int = 1000
    d_user: int = BENCH_CONFIG.d_user
    d_item: int = BENCH_CONFIG.d_item
    d_cross: int = BENCH_CONFIG.d_cross
    d_hidden: int = BENCH_CONFIG.d_hidden
    experts: int = BENCH_CONFIG.experts
    tasks: int = BENCH_CONFIG.tasks
    seq_len: int = BENCH_CONFIG.seq_len
    train_steps: int = 100
    reps: int = 20
    warmup: int = 3
    threads: int = 2
    device: str = "cpu"
    seed: int = 0
    cuda_graph: bool = False

    def validate(self) -> None:
        check_at_least(self, {**SIZES, "experts": 1, "tasks": 1, "seq_len": 1, "train_steps": 0})


MATMUL_METRICS = (
    "time_speedup",
    "flops_speedup",
    "time_vanilla_ms",
    "time_mari_ms",
    "time_speedup_std",
    "max_abs_diff",
)
FRAGMENTED_METRICS = (
    "fragmented_over_neat",
    "degradation_vs_neat_pct",
    "degradation_vs_vanilla_pct",
    "time_mari_neat_ms",
    "time_mari_fragmented_ms",
    "time_vanilla_ms",
    "max_abs_diff",
)
MODEL_METRICS = (
    "speedup_mari_vs_vani",
    "speedup_mari_vs_uoi",
    "speedup_uoi_vs_vani",
    "time_vani_ms",
    "time_uoi_ms",
    "time_mari_ms",
    "max_abs_diff_mari",
)

BENCHMARKS = (
    Benchmark(
        "mari_matmul",
        MatmulParams,
        matmul_point,
        MATMUL_METRICS,
        "MaRI (eq. 7) vs the vanilla fusion MatMul at one (B, D_user, D_item, D_cross, D_hidden)",
    ),
    Benchmark(
        "mari_fragmented",
        FragmentedParams,
        fragmented_point,
        FRAGMENTED_METRICS,
        "fragmented (one MatMul per feature chunk) vs neat MaRI vs vanilla at one chunk size",
    ),
    Benchmark(
        "mari_model",
        ModelParams,
        model_point,
        MODEL_METRICS,
        "the trained ranking model in VanI / UOI / MaRI on one request of B candidates",
    ),
)


def _page(df, out, title, options, context):
    from genrec.studies.mari.report import build_mari_report

    return build_mari_report(df, out, title, context=context)


PAGE = PageKind("mari", "MaRI benchmarks", _page, claims=tuple(b.name for b in BENCHMARKS))

for _bench in BENCHMARKS:
    register_benchmark(_bench)
register_page(PAGE)
