"""Experiment definitions: `experiments/*.yaml` loaded into typed, validated config.

An experiment names a dataset, a model (a checkpoint, or a training step that creates one), optionally
a draft model (`draft: DIR`, a checkpoint on the same codec, for AtSpeed's decoders), a registered
decoder with fixed parameters and a search space over the others, seeds, the metric to optimise,
resources per trial and where results go. Everything that can be checked without running a trial
is checked before Ray starts (keys and types by the models, the rest in experiment_checks.py): unknown
keys, unknown decoders and parameter names (with the valid choices listed), every value of the search
space building valid decoder Params, missing dataset, checkpoint or draft folders, a metric the
evaluation does not produce. Errors are `UserInputError`s that name the key path
(`search_space.beam_width.grid[2]`), so the CLI exits with code 2 and nothing is written.

A multi-decoder experiment lists `arms:` (each a decoder, its fixed params, a grid over the others and
optionally its own checkpoint) instead of decoder / params / search_space: the trials of every arm
form one sweep, and each arm is validated like a one-decoder experiment.

Trials = product of grid sizes x len(seeds) x num_samples.

This module holds `ExperimentConfig` (the whole file, and what a sweep derives from it: arms, grid,
trial count, trial table, resume fingerprint) and `TrialSpec` (what every trial of a sweep shares).
Beside it:

    experiment_sections.py  the file's sections (DatasetSpec, ModelSpec, EvalSpec, ...) and the
                            search-space kinds (SpaceSpec, expand_range, describe_space)
    experiment_loading.py   load_experiment / experiment_from_dict: YAML -> config, paths made
                            absolute (resolve_paths), pydantic errors as key paths
    experiment_checks.py    validate_experiment: every check that needs no trial

Import their names from those modules.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from genrec.platform.experiment_sections import (
    ArmSpec,
    DatasetSpec,
    EvalSpec,
    ModelSpec,
    RaySpec,
    ResourcesSpec,
    SpaceSpec,
    StrictModel,
    TrackingSpec,
    describe_space,
    expand_range,
)

__all__ = [
    "MAX_COMBINATIONS_CHECKED",
    "OTHER_METRICS",
    "QUALITY_METRICS",
    "ExperimentConfig",
    "TrialSpec",
    "plain_scalar",
]


QUALITY_METRICS = ("hr", "ndcg", "recall")
OTHER_METRICS = (
    "invalid_rate",
    "missing_rate",
    "latency_mean_ms",
    "latency_p50_ms",
    "latency_p90_ms",
    "latency_p99_ms",
    "throughput_users_per_s",
    "memory_peak_mb",
    "trial_wall_s",
)
MAX_COMBINATIONS_CHECKED = 10_000


class ExperimentConfig(StrictModel):
    name: str
    description: str = ""
    # a model-free benchmark (genrec.workloads.benchmark_registry) instead of dataset + model + decoder;
    # params and search_space are then the benchmark function's keyword arguments
    benchmark: str | None = None
    dataset: DatasetSpec | None = None
    model: ModelSpec | None = None
    # AtSpeed's draft model: a checkpoint on the model's codec, loaded beside it once per trial (one
    # draft per experiment; compare drafts with one experiment file each)
    draft: Path | None = None
    decoder: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    search_space: dict[str, SpaceSpec] = Field(default_factory=dict)
    # several decoders side by side on one model and data set (instead of decoder/params/search_space):
    # each arm is swept like a one-decoder experiment, the trials of all arms form one sweep and report
    arms: list[ArmSpec] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=lambda: [0])
    eval: EvalSpec = Field(default_factory=EvalSpec)
    metric: str = "recall@10"
    mode: Literal["max", "min"] = "max"
    num_samples: int = 1
    max_concurrent: int = 0  # 0: as many as the resources allow
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    max_failures: int = 1  # retries of a failed trial
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    ray: RaySpec = Field(default_factory=RaySpec)
    _source: Path | None = PrivateAttr(default=None)  # the YAML file, set by the loader

    @model_validator(mode="after")
    def _benchmark_or_decoder(self) -> ExperimentConfig:
        if self.arms:
            return self._with_arms()
        if self.benchmark is None:
            missing = [k for k in ("dataset", "model", "decoder") if getattr(self, k) is None]
            if missing:
                raise ValueError(
                    "; ".join(f"missing required key `{k}`" for k in missing)
                    + " (or give `benchmark: NAME` for a model-free benchmark experiment)"
                )
            return self
        given = [k for k in ("dataset", "model", "draft", "decoder") if getattr(self, k) is not None]
        if given:
            raise ValueError(
                f"`benchmark: {self.benchmark}` runs without a dataset, model or decoder; remove {given}"
            )
        # the sweep driver reads cfg.decoder (labels) and cfg.model.train (nothing to train): give them
        # a label and an empty model spec rather than None
        self.decoder = f"benchmark:{self.benchmark}"
        self.model = ModelSpec.model_construct(checkpoint=None, train=None)
        return self

    def _with_arms(self) -> ExperimentConfig:
        mixed = [k for k in ("benchmark", "decoder") if getattr(self, k) is not None]
        mixed += [k for k in ("params", "search_space") if getattr(self, k)]
        if mixed:
            raise ValueError(f"`arms` replaces decoder, params and search_space; remove {mixed}")
        missing = [k for k in ("dataset", "model") if getattr(self, k) is None]
        if missing:
            raise ValueError("; ".join(f"missing required key `{k}`" for k in missing))
        # a label for summaries and dry runs; trials take their decoder from their arm
        self.decoder = "+".join(dict.fromkeys(a.decoder for a in self.arms))
        return self

    def arm_configs(self) -> list[ExperimentConfig]:
        """One single-decoder experiment per arm (same data, model, eval, tracking), for validation
        and for expanding the trials; an experiment without arms is its own only arm."""
        if not self.arms:
            return [self]
        out = []
        for arm in self.arms:
            sub = self.model_copy(
                update={"decoder": arm.decoder, "params": dict(arm.params), "search_space": arm.search_space}
            )
            if arm.model is not None:
                sub.model = ModelSpec(checkpoint=arm.model)
            sub.arms = []
            sub._source = self._source
            out.append(sub)
        return out

    def arm_points(self) -> list[dict[str, Any]]:
        """Every (decoder, params) point of a multi-decoder experiment, arm by arm, grid order."""
        points = []
        for sub in self.arm_configs():
            grid = sub.grid_values()
            model = str(sub.model.path)
            for combo in itertools.product(*grid.values()):
                point = {**sub.params, **dict(zip(grid, combo))}
                points.append({"decoder": sub.decoder, "params": point, "model": model})
        return points

    # ---- derived -----------------------------------------------------------------------------
    @property
    def source(self) -> Path | None:
        return self._source

    @property
    def results_dir(self) -> Path:
        return self.tracking.results_dir

    @property
    def storage_path(self) -> Path:
        return self.tracking.storage_path or self.tracking.results_dir / "ray"

    @property
    def mlflow_uri(self) -> str:
        return self.tracking.mlflow_uri or f"sqlite:///{self.tracking.results_dir / 'mlflow.db'}"

    @property
    def artifact_location(self) -> str | None:
        if self.tracking.artifact_location:
            return self.tracking.artifact_location
        if self.tracking.mlflow_uri is None:  # embedded store: artifacts next to the database
            return (self.tracking.results_dir / "mlflow-artifacts").as_uri()
        return None  # a real server decides

    @property
    def ks(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.eval.ks)))

    def valid_metrics(self) -> list[str]:
        if self.benchmark is not None:
            from genrec.platform.benchmarks import get_benchmark

            return list(get_benchmark(self.benchmark).metrics)
        return [f"{m}@{k}" for k in self.ks for m in QUALITY_METRICS] + list(OTHER_METRICS)

    def grid_values(self) -> dict[str, list[Any]]:
        """Parameters expanded into grid dimensions (grid and range kinds)."""
        return {
            name: expand_range(spec.range) if spec.kind == "range" else list(spec.grid or [])
            for name, spec in self.search_space.items()
            if spec.kind in ("grid", "range")
        }

    def num_trials(self) -> int:
        if self.arms:
            return len(self.arm_points()) * len(self.seeds)
        return math.prod(len(v) for v in self.grid_values().values()) * len(self.seeds) * self.num_samples

    def trial_grid(self) -> list[dict[str, Any]]:
        """The trials a sweep runs, in Tune's order up to sampling: grid values and seed per trial.

        Sampled dimensions (choice, uniform, ...) show as a description like 'choice[1, 2]'.
        """
        if self.arms:
            points = self.arm_points()
            return [{"decoder": p["decoder"], **p["params"], "seed": s} for s in self.seeds for p in points]
        grid = self.grid_values()
        sampled = {name: describe_space(spec) for name, spec in self.search_space.items() if name not in grid}
        rows = []
        for _ in range(self.num_samples):
            for seed in self.seeds:
                for combo in itertools.product(*grid.values()):
                    rows.append({**dict(zip(grid, combo)), **sampled, "seed": seed})
        return rows

    def fingerprint(self) -> str:
        """What a resumed sweep must not change: the search space, seeds, decoder and eval setup."""
        keys = ("name", "decoder", "params", "search_space", "seeds", "eval", "metric", "mode", "num_samples")
        keys += ("benchmark",) if self.benchmark else ()  # decoder-sweep fingerprints stay as they were
        keys += ("draft",) if self.draft else ()  # a changed draft changes every trial; draft-free: as before
        keys += ("arms",) if self.arms else ()
        return json.dumps(self.model_dump(mode="json", include=set(keys)), sort_keys=True)

    def trial_spec(self, cpu: float, device: str) -> TrialSpec:
        """What every trial of this experiment's sweep shares (paths, decoder, fixed params, eval setup)."""
        return TrialSpec(
            experiment=self.name,
            results_dir=str(self.results_dir),
            decoder=self.decoder,
            benchmark=self.benchmark,
            model=str(self.model.path) if self.benchmark is None else "",
            draft=str(self.draft) if self.draft is not None else "",
            data=str(self.dataset.path) if self.dataset is not None else "",
            params=dict(self.params),
            split=self.eval.split,
            ks=self.ks,
            batch_size=self.eval.batch_size,
            warmup_batches=self.eval.warmup_batches,
            max_users=self.eval.max_users,
            threads=self.eval.threads,
            device=device,
            cpu=cpu,
            repeats=self.eval.repeats,
        )


def plain_scalar(value: Any) -> Any:
    """A numpy scalar (from Tune's samplers) as the Python number it holds; anything else as is."""
    return value.item() if type(value).__module__ == "numpy" and hasattr(value, "item") else value


@dataclass(frozen=True)
class TrialSpec:
    """The constant part of every trial of a sweep, handed to the Tune trainable beside each trial's
    own point (search-space values and seed). Typed, so a trial reads fields, not dict keys."""

    experiment: str
    results_dir: str
    decoder: str  # a registered decoder, or "benchmark:NAME" for a benchmark experiment
    benchmark: str | None = None  # set: a model-free benchmark (genrec.platform.benchmark_trial)
    model: str = ""  # checkpoint folder (decoder experiments)
    draft: str = ""  # AtSpeed's draft checkpoint folder; empty: none loaded
    data: str = ""  # dataset folder (decoder experiments)
    params: dict[str, Any] = field(default_factory=dict)  # fixed: the decoder's or the benchmark's
    split: str = "test"
    ks: tuple[int, ...] = (5, 10)
    batch_size: int = 64
    warmup_batches: int = 1
    max_users: int = 0
    threads: int = 0  # torch threads; 0: the trial's CPU count
    device: str = "cpu"
    cpu: float = 1.0  # CPUs Ray gives each trial
    repeats: int = 1  # timed passes per trial (eval.repeats)

    @property
    def torch_threads(self) -> int:
        return self.threads or max(1, int(self.cpu))

    def values(self, point: Mapping[str, Any]) -> dict[str, Any]:
        """The fixed params with a trial's search-space point over them, as plain Python values
        (Tune's samplers may hand numpy scalars, which strict type checks reject)."""
        return {**self.params, **{k: plain_scalar(v) for k, v in point.items()}}

    def decoder_params(self, point: Mapping[str, Any]) -> Any:
        """A decoder trial's typed Params, through the same adapter that validated the experiment."""
        from genrec.platform.params import eval_params

        return eval_params(self.decoder, self.values(point), self.ks)

    def for_trial(self, config: Mapping[str, Any]) -> tuple[TrialSpec, dict[str, Any]]:
        """(this spec for the trial's decoder, the trial's search-space point): a multi-decoder
        experiment's trial carries its arm's decoder and whole parameter set under `arm`."""
        arm = config.get("arm")
        if not arm:
            return self, dict(config.get("params", {}))
        model = arm.get("model") or self.model
        return replace(self, decoder=arm["decoder"], params={}, model=model), dict(arm["params"])
