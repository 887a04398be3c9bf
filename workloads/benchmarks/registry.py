"""Benchmarks a sweep can name (`benchmark: NAME` in an experiment file): name -> fn(**params) -> metrics.

A benchmark experiment needs no dataset, model or decoder: its `params` and `search_space` are the
function's keyword arguments, checked against its signature before Ray starts. `seed`, `threads` and
`device`, when the function takes them, are filled by the trial (seeds from `seeds:`, threads from the
trial's CPUs) unless the experiment fixes them. Pure workloads code: no ray, mlflow or pydantic.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

from genrec.workloads.benchmarks.atspeed_arms import OBJECTIVES, VERIFICATIONS
from genrec.workloads.benchmarks.atspeed_arms import arm_point as atspeed_point
from genrec.workloads.benchmarks.mari_matmul import fragmented_point, matmul_point
from genrec.workloads.benchmarks.mari_model import model_point
from genrec.workloads.benchmarks.nezha_arms import ARMS, arm_point
from genrec.workloads.benchmarks.static_point import KERNELS, SCALING_BACKENDS, branch_point, scaling_point
from genrec.workloads.benchmarks.xgr_serving import METRICS as SERVING_METRICS
from genrec.workloads.benchmarks.xgr_serving import check as serving_check
from genrec.workloads.benchmarks.xgr_serving import serving_point
from genrec.workloads.errors import UserInputError
from genrec.workloads.training.trainer import TrainConfig

FILLED_BY_TRIAL = ("seed", "threads", "device")


def _positive(*names: str, zero_ok: tuple[str, ...] = ()) -> Callable[[dict], None]:
    """A params check: the named ints must be >= 1 (>= 0 for zero_ok)."""

    def check(params: dict) -> None:
        for name in (*names, *zero_ok):
            if name not in params:
                continue
            low = 0 if name in zero_ok else 1
            v = params[name]
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise UserInputError(f"{name} must be an integer >= {low}, got {v!r}")

    return check


@dataclass(frozen=True)
class Benchmark:
    name: str
    fn: Callable[..., dict]
    metrics: tuple[str, ...]  # numeric outputs an experiment may optimise / plot
    description: str
    check: Callable[[dict], None] = field(default=lambda params: None)
    # string parameters that are file paths: an experiment file's relative ones resolve against its
    # base directory before trials start (Tune runs trials in their own working directories)
    path_params: tuple[str, ...] = ()
    dataset_params: tuple[str, ...] = ()  # path parameters naming dataset folders the benchmark reads

    def parameters(self) -> dict[str, inspect.Parameter]:
        return dict(inspect.signature(self.fn).parameters)

    def run(self, **params) -> dict:
        self.check(params)
        return self.fn(**params)


_INTS = ("b", "d_user", "d_item", "d_hidden", "reps")
_STATIC_INTS = ("vocab", "levels", "batch", "beam", "reps")


def _static_check(size: str, choices: tuple[str, str, tuple[str, ...]]) -> Callable[[dict], None]:
    """A STATIC params check: positive ints, a known backend / kernel, d < L, and a set that fits V^L."""
    positive = _positive(
        size, "constraint_size", *_STATIC_INTS, zero_ok=("dense_levels", "warmup", "baseline_max_size")
    )
    key, default, names = choices

    def check(params: dict) -> None:
        positive(params)
        value = params.get(key, default)
        if value not in names:
            raise UserInputError(f"{key} must be one of {list(names)}, got {value!r}")
        levels, vocab = params.get("levels", 8), params.get("vocab", 2048)
        if params.get("dense_levels", 2) >= levels:
            raise UserInputError(
                f"dense_levels must be below levels ({levels}), got {params.get('dense_levels', 2)} "
                "(the paper uses 2)"
            )
        if size in params and params[size] > vocab**levels:
            raise UserInputError(
                f"{size} = {params[size]} exceeds the SID space vocab^levels = {vocab}^{levels}"
            )
        if "max_branch" in params and params["max_branch"] > vocab:
            raise UserInputError(
                f"max_branch = {params['max_branch']} cannot exceed the codebook size vocab = {vocab}"
            )

    return check


def _nezha_check(params: dict) -> None:
    _positive("epochs", "batch_size", "beam_width", "eval_batch_size", zero_ok=("max_steps", "max_users"))(
        params
    )
    if params.get("arm") not in ARMS:
        raise UserInputError(f"arm must be one of {list(ARMS)}, got {params.get('arm')!r}")
    if "head_batching" in params:  # TrainConfig's own check, before Ray starts
        TrainConfig(head_batching=params["head_batching"]).validate()


def _atspeed_check(params: dict) -> None:
    _positive("epochs", "k", "draft_beams", "gamma", "teacher_k", "users", "batch_size", "repeats")(params)
    for key, names in (("objective", OBJECTIVES), ("verification", VERIFICATIONS)):
        if key in params and params[key] not in names:
            raise UserInputError(f"{key} must be one of {list(names)}, got {params[key]!r}")
    if not 0.0 <= params.get("alpha", 0.5) <= 1.0:
        raise UserInputError(f"alpha must be in [0, 1], got {params['alpha']!r}")


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            "mari_matmul",
            matmul_point,
            (
                "time_speedup",
                "flops_speedup",
                "time_vanilla_ms",
                "time_mari_ms",
                "time_speedup_std",
                "max_abs_diff",
            ),
            "MaRI (eq. 7) vs the vanilla fusion MatMul at one (B, D_user, D_item, D_cross, D_hidden)",
            _positive(*_INTS, "warmup", zero_ok=("d_cross", "warmup")),
        ),
        Benchmark(
            "mari_fragmented",
            fragmented_point,
            (
                "fragmented_over_neat",
                "degradation_vs_neat_pct",
                "degradation_vs_vanilla_pct",
                "time_mari_neat_ms",
                "time_mari_fragmented_ms",
                "time_vanilla_ms",
                "max_abs_diff",
            ),
            "fragmented (one MatMul per feature chunk) vs neat MaRI vs vanilla at one chunk size",
            _positive("chunk", *_INTS, zero_ok=("d_cross", "warmup")),
        ),
        Benchmark(
            "mari_model",
            model_point,
            (
                "speedup_mari_vs_vani",
                "speedup_mari_vs_uoi",
                "speedup_uoi_vs_vani",
                "time_vani_ms",
                "time_uoi_ms",
                "time_mari_ms",
                "max_abs_diff_mari",
            ),
            "the trained ranking model in VanI / UOI / MaRI on one request of B candidates",
            _positive(*_INTS, "experts", "tasks", "seq_len", zero_ok=("d_cross", "warmup", "train_steps")),
        ),
        Benchmark(
            "nezha_arm",
            arm_point,
            (
                "hr@10",
                "ndcg@10",
                "hr@5",
                "ndcg@5",
                "valid_share",
                "users_with_k_valid",
                "drafts_valid_share",
                "latency_p50_ms",
                "prefill_ms",
                "decode_ms",
                "train_seconds",
                "train_steps",
            ),
            "one arm of the NEZHA comparison (beam, nezha, nezha-1..4, mtp): train for a seed, then evaluate",
            _nezha_check,
            path_params=("data", "models_dir"),
            dataset_params=("data",),
        ),
        Benchmark(
            "atspeed_arm",
            atspeed_point,
            (
                "ws",
                "accepted_steps",
                "target_calls",
                "reference_ms",
                "atspeed_ms",
                "draft_ms",
                "verify_ms",
                "free_draft_ceiling",
                "identical_share",
                "reference_recall@10",
                "atspeed_recall@10",
                "reference_ndcg@10",
                "atspeed_ndcg@10",
            ),
            "one AtSpeed cell (draft objective x verification): train target + draft, then WS@K and AS@K",
            _atspeed_check,
            path_params=("data", "models_dir"),
            dataset_params=("data",),
        ),
        Benchmark(
            "static_scaling",
            scaling_point,
            (
                "step_ms",
                "unconstrained_step_ms",
                "overhead_ratio",
                "overhead_ms",
                "step_ms_p99",
                "build_s",
                "memory_mb",
                "mb_per_million",
                "compliance",
            ),
            "STATIC / a baseline backend: per-step constrained decoding time vs unconstrained at one |C|, V",
            _static_check("constraint_size", ("backend", "static", SCALING_BACKENDS)),
        ),
        Benchmark(
            "static_branch",
            branch_point,
            ("kernel_ms", "mask_kernel_ms", "kernel_ms_p99", "kernel_us_per_beam", "max_branch_factor"),
            "the VNTK mask step alone at one maximum branch factor (last-level nodes with B children each)",
            _static_check("max_branch", ("kernel", "torch", KERNELS)),
        ),
        Benchmark(
            "xgr_serving",
            serving_point,
            SERVING_METRICS,
            "highest open-loop rate meeting a P99 SLO for one decoder x batching policy (in-process harness)",
            serving_check,
            path_params=("model", "data"),
            dataset_params=("data",),
        ),
    )
}


def benchmark_names() -> list[str]:
    return sorted(BENCHMARKS)


def get_benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise UserInputError(f"unknown benchmark {name!r}; choose one of {benchmark_names()}")
    return BENCHMARKS[name]
