"""The AtSpeed study's `benchmark:` entry (typed Params) and report page, registered into the core
registries (genrec.workloads.benchmark_registry, genrec.dashboards.registry)."""

from __future__ import annotations

from dataclasses import dataclass

from genrec.dashboards.registry import PageKind, register_page
from genrec.studies.atspeed.atspeed_arms import OBJECTIVES, VERIFICATIONS, arm_point
from genrec.workloads.benchmark_registry import Benchmark, check_at_least, check_choice, register_benchmark
from genrec.workloads.errors import UserInputError


@dataclass(frozen=True, kw_only=True)
class ArmParams:
    objective: str
    verification: str = "strict"
    data: str = "runs/data/synth"
    models_dir: str = "runs/models/atspeed_arms"
    target_size: str = "small"
    draft_size: str = "tiny"
    epochs: int = 8
    k: int = 10
    draft_beams: int = 40
    gamma: int = 3
    tree_attention: bool = True
    teacher_k: int = 10
    alpha: float = 0.5
    users: int = 128
    batch_size: int = 1
    repeats: int = 1
    seed: int = 42
    threads: int = 1
    device: str = "cpu"

    def validate(self) -> None:
        check_choice(self, "objective", OBJECTIVES)
        check_choice(self, "verification", VERIFICATIONS)
        sizes = ("epochs", "k", "draft_beams", "gamma", "teacher_k", "users", "batch_size", "repeats")
        check_at_least(self, dict.fromkeys(sizes, 1))
        if not 0.0 <= self.alpha <= 1.0:
            raise UserInputError(f"`alpha` must be in [0, 1], got {self.alpha!r}")


METRICS = (
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
)

BENCHMARK = Benchmark(
    "atspeed_arm",
    ArmParams,
    arm_point,
    METRICS,
    "one AtSpeed cell (draft objective x verification): train target + draft, then WS@K and AS@K",
    path_params=("data", "models_dir"),
    dataset_params=("data",),
)


def _page(df, out, title, options, context):
    from genrec.studies.atspeed.report import build_atspeed_report

    return build_atspeed_report(df, out, title, context=context)


PAGE = PageKind("atspeed", "AtSpeed arms", _page, claims=(BENCHMARK.name,))

register_benchmark(BENCHMARK)
register_page(PAGE)
