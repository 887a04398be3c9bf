"""The sections of an experiment file, one strict pydantic model each (unknown keys are errors), and
the search space's kinds with their expansion into grid values.

`ExperimentConfig` (genrec.platform.experiment) puts them together: `dataset: DatasetSpec`,
`model: ModelSpec` (a checkpoint, or `train: TrainSpec`), `eval: EvalSpec`, `arms: [ArmSpec]`,
`resources: ResourcesSpec`, `tracking: TrackingSpec`, `ray: RaySpec`, and `search_space:` one
`SpaceSpec` per parameter.

Search space kinds (one per parameter):

    grid:       [v, ...]                 every value (tune.grid_search); multiplies the trial count
    choice:     [v, ...]                 one value drawn per sample (tune.choice)
    range:      {low, high, step}        a grid low, low+step, ... <= high (inclusive)
    uniform:    {low, high}              drawn per sample (tune.uniform)
    loguniform: {low, high}              drawn per sample (tune.loguniform)
    randint:    {low, high}              drawn per sample, both ends inclusive

`expand_range` lists a range's grid values; `describe_space` names a sampled dimension in a dry run's
trial table (`choice[1, 2]`, `uniform(0.1, 0.9)`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from genrec.workloads.errors import UserInputError


class StrictModel(BaseModel):
    """An experiment file's model: an unknown key is an error (named with the valid keys)."""

    model_config = ConfigDict(extra="forbid", frozen=False)


class DatasetSpec(StrictModel):
    path: Path = Field(description="dataset folder from `genrec data synth` / `genrec data import`")


class TrainSpec(StrictModel):
    """Train a checkpoint before the sweep (skipped when `out` already holds one)."""

    out: Path
    size: str = "tiny"
    epochs: int = 8
    batch_size: int = 128
    lr: float = 3e-3
    max_items: int = 20
    seed: int = 0
    threads: int = 0
    objective: str = "next_item"  # next_item | nezha | mtp (a draft head's loss; issue 6)
    head_variant: str = "full"  # a NEZHA ablation: full | no_context | no_placeholder | add
    head_batching: str = "packed"  # packed | per_example (how a head objective batches its targets)

    def to_train_config(self):  # -> genrec.workloads.training.train_config.TrainConfig (imported lazily)
        from genrec.workloads.training.train_config import TrainConfig

        return TrainConfig(
            model_size=self.size,
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            max_items=self.max_items,
            seed=self.seed,
            threads=self.threads,
            objective=self.objective,
            head_variant=self.head_variant,
            head_batching=self.head_batching,
        )


class ModelSpec(StrictModel):
    checkpoint: Path | None = None
    train: TrainSpec | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.checkpoint is None) == (self.train is None):
            raise ValueError("give exactly one of `checkpoint: PATH` or `train: {out: PATH, size: ...}`")
        return self

    @property
    def path(self) -> Path:
        return self.checkpoint if self.checkpoint is not None else self.train.out  # type: ignore[union-attr]


class Bounds(StrictModel):
    low: float
    high: float


class RangeSpec(StrictModel):
    low: float
    high: float
    step: float = 1


class SpaceSpec(StrictModel):
    grid: list[Any] | None = None
    choice: list[Any] | None = None
    range: RangeSpec | None = None
    uniform: Bounds | None = None
    loguniform: Bounds | None = None
    randint: Bounds | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> SpaceSpec:
        kinds = [k for k in SPACE_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"give exactly one of {list(SPACE_KINDS)}, got {kinds or 'none'}")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in SPACE_KINDS if getattr(self, k) is not None)


SPACE_KINDS = ("grid", "choice", "range", "uniform", "loguniform", "randint")


class EvalSpec(StrictModel):
    split: Literal["valid", "test"] = "test"
    ks: list[int] = Field(default_factory=lambda: [5, 10])
    batch_size: int = 64
    max_users: int = 0  # 0 = every user with a target in the split
    warmup_batches: int = 1
    threads: int = 0  # torch threads per trial; 0 = the trial's CPU count (at least 1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # timed passes per trial: latency is their median, with the fastest and slowest pass beside it
    repeats: int = 1


class ArmSpec(StrictModel):
    """One decoder of a multi-decoder experiment: its fixed params and a grid over the others."""

    decoder: str
    params: dict[str, Any] = Field(default_factory=dict)
    search_space: dict[str, SpaceSpec] = Field(default_factory=dict)
    # a checkpoint of its own (e.g. NEZHA's, trained with its draft head), on the experiment's dataset
    model: Path | None = None


class ResourcesSpec(StrictModel):
    cpu: float = 1.0
    gpu: float | Literal["auto"] = "auto"  # auto: 0.25 of a GPU per trial when the cluster has GPUs


class TrackingSpec(StrictModel):
    results_dir: Path = Path("runs/results")
    mlflow: bool = True
    mlflow_uri: str | None = None  # None: sqlite:///<results_dir>/mlflow.db (embedded, no server)
    artifact_location: str | None = None  # None: <results_dir>/mlflow-artifacts for the embedded store
    storage_path: Path | None = None  # Ray Tune experiment state; None: <results_dir>/ray
    report: bool = True  # build the Plotly report after the sweep when genrec.dashboards has it


class RaySpec(StrictModel):
    address: str | None = None  # None: RAY_ADDRESS if set, else a local instance
    num_cpus: int | None = None  # local instance only; None: every core
    # local instance only. Ray runs its workers, and so every trial, at nice 15 by default: any
    # ordinary process on the machine then takes the CPU first, which skews timing trials (a serving
    # trial lost 8x of its rate to three nice-19 training jobs). 0 runs trials at the driver's priority.
    worker_niceness: int = Field(default=0, ge=0, le=19)


MAX_RANGE_VALUES = 10_000  # a range lists its values; past this it is a typo or an attack


def range_size(r: RangeSpec) -> int:
    """How many values `r` lists, computed without listing them; UserInputError past MAX_RANGE_VALUES
    (a range to 1e12 or a step of 1e-12 is refused before any list is built)."""
    if not all(math.isfinite(x) for x in (r.low, r.high, r.step)) or r.step <= 0 or r.high < r.low:
        raise UserInputError(
            f"range low={r.low} high={r.high} step={r.step}: needs finite numbers, step > 0 and high >= low"
        )
    span = (r.high - r.low) / r.step
    if span >= MAX_RANGE_VALUES:
        raise UserInputError(
            f"range low={r.low} high={r.high} step={r.step} lists about {span:.3g} values; the limit is "
            f"{MAX_RANGE_VALUES}: use a larger step, or a sampled kind (uniform, randint)"
        )
    return int(math.floor(span + 1e-9)) + 1


def expand_range(r: RangeSpec) -> list[float | int]:
    n = range_size(r)
    values = [r.low + i * r.step for i in range(n)]
    if all(float(x).is_integer() for x in (r.low, r.step)):
        return [int(round(v)) for v in values]
    return [round(v, 12) for v in values]


def describe_space(spec: SpaceSpec) -> str:
    kind = spec.kind
    value = getattr(spec, kind)
    if kind in ("grid", "choice"):
        return f"{kind}{value}"
    return f"{kind}({value.low}, {value.high})"
