"""The NEZHA study's `benchmark:` entry (typed Params) and report page, registered into the core
registries (genrec.workloads.benchmark_registry, genrec.dashboards.registry)."""

from __future__ import annotations

from dataclasses import dataclass

from genrec.dashboards.registry import PageKind, register_page
from genrec.studies.nezha.nezha_arms import ARMS, arm_point
from genrec.workloads.benchmark_registry import Benchmark, check_at_least, check_choice, register_benchmark
from genrec.workloads.training.train_config import TrainConfig


@dataclass(frozen=True, kw_only=True)
class ArmParams:
    arm: str
    data: str = "runs/data/synth"
    models_dir: str = "runs/models/nezha_arms"
    model_size: str = "tiny"
    epochs: int = 8
    lr: float = 3e-3
    batch_size: int = 128
    patience: int = 3
    max_steps: int = 0
    beam_width: int = 10
    eval_batch_size: int = 32
    max_users: int = 0
    seed: int = 42
    threads: int = 1
    device: str = "cpu"
    head_batching: str = "packed"
    progress: bool = False

    def validate(self) -> None:
        check_choice(self, "arm", ARMS)
        minimums = {"epochs": 1, "batch_size": 1, "beam_width": 1, "eval_batch_size": 1}
        check_at_least(self, {**minimums, "max_steps": 0, "max_users": 0})
        TrainConfig(head_batching=self.head_batching).validate()  # the trainer's own rule, before Ray


METRICS = (
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
)

BENCHMARK = Benchmark(
    "nezha_arm",
    ArmParams,
    arm_point,
    METRICS,
    "one arm of the NEZHA comparison (beam, nezha, nezha-1..4, mtp): train for a seed, then evaluate",
    path_params=("data", "models_dir"),
    dataset_params=("data",),
)


def _page(df, out, title, options, context):
    from genrec.studies.nezha.report import build_nezha_report

    return build_nezha_report(df, out, title, context=context)


PAGE = PageKind("nezha", "NEZHA arms", _page, claims=(BENCHMARK.name,))

register_benchmark(BENCHMARK)
register_page(PAGE)
