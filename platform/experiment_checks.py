"""Experiment checks that need no trial: decoder and benchmark names, parameter names and types, every
combination of the search space through the one parameter adapter, numbers in range, input files.

Every error is a `UserInputError` naming the key path (`search_space.beam_width.grid[2]`), raised
before Ray starts, so the CLI exits with code 2 and nothing is written.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import MISSING
from pathlib import Path
from typing import Any

from genrec.platform.experiment import MAX_COMBINATIONS_CHECKED, ExperimentConfig
from genrec.platform.experiment_sections import SpaceSpec, expand_range, range_size
from genrec.workloads.errors import UserInputError

# ---- the checks --------------------------------------------------------------------------
DEFAULT_MAX_TRIALS = 10_000  # `genrec sweep --max-trials N` raises it


def validate_experiment(
    cfg: ExperimentConfig, check_files: bool = True, max_trials: int = DEFAULT_MAX_TRIALS
) -> None:
    """Every check of a loaded experiment, by kind: a benchmark, a multi-decoder (arms), one decoder.
    The trial count is checked first, from the sizes alone: nothing is listed before it passes."""
    from genrec.workloads.results_store import check_experiment_name

    try:
        check_experiment_name(cfg.name)
    except UserInputError as e:
        raise UserInputError(f"`name`: {e}") from None
    check_trial_count(cfg, max_trials)
    if cfg.benchmark is not None:
        validate_benchmark_experiment(cfg)
        if check_files:
            check_benchmark_inputs(cfg)
    elif cfg.arms:
        validate_arms(cfg, check_files)
    else:
        validate_decoder_experiment(cfg, check_files)


def space_sizes(cfg: ExperimentConfig) -> dict[str, int]:
    """Values per grid dimension (grid and range kinds), counted without listing a range."""
    sizes = {}
    for name, spec in cfg.search_space.items():
        if spec.kind == "grid":
            sizes[name] = len(spec.grid or [])
        elif spec.kind == "range":
            try:
                sizes[name] = range_size(spec.range)
            except UserInputError as e:
                raise UserInputError(f"`search_space.{name}.range`: {e}") from None
    return sizes


def check_trial_count(cfg: ExperimentConfig, max_trials: int) -> None:
    """The sweep's trial count (grid sizes x seeds x num_samples, summed over arms) is at most
    `max_trials`, computed from the sizes alone."""
    subs = cfg.arm_configs() if cfg.arms else [cfg]
    per_seed = sum(math.prod(space_sizes(sub).values()) for sub in subs)
    trials = per_seed * len(cfg.seeds) * (1 if cfg.arms else max(cfg.num_samples, 1))
    if trials > max_trials:
        raise UserInputError(
            f"the experiment makes {trials:,} trials ({per_seed:,} points x {len(cfg.seeds):,} seeds"
            f"{'' if cfg.arms else f' x num_samples {cfg.num_samples}'}); the limit is {max_trials:,}: "
            "narrow the search space or pass --max-trials to raise it"
        )


def validate_arms(cfg: ExperimentConfig, check_files: bool) -> None:
    """Each arm like a one-decoder experiment (grid and range values only); the input files once, with
    the first arm, and again for an arm with its own checkpoint. Errors name the arm."""
    for i, sub in enumerate(cfg.arm_configs()):
        sampled = [n for n, spec in sub.search_space.items() if spec.kind not in ("grid", "range")]
        if sampled:
            raise UserInputError(
                f"`arms[{i}].search_space.{sampled[0]}`: an arm takes grid or range values only"
            )
        try:
            own_model = cfg.arms[i].model is not None
            validate_experiment(sub, check_files=check_files and (i == 0 or own_model), max_trials=1 << 62)
        except UserInputError as e:
            raise UserInputError(f"`arms[{i}]` ({sub.decoder}): {e}") from None


def validate_decoder_experiment(cfg: ExperimentConfig, check_files: bool) -> None:
    """A one-decoder experiment: the draft it needs, a known decoder, numbers in range, parameter names,
    every combination of the search space through the decoder's Params, the metric, the input files."""
    from genrec.workloads.decoding.base import decoder_names

    check_draft_given(cfg)  # read from the decoder class; an unknown name is reported next
    if cfg.decoder not in decoder_names():
        raise UserInputError(f"`decoder`: unknown decoder {cfg.decoder!r}; choose one of {decoder_names()}")
    _check_numbers(cfg)

    from genrec.platform.params import check_names, eval_params

    for section, names in (("params", cfg.params), ("search_space", cfg.search_space)):
        for name in names:
            try:
                check_names(cfg.decoder, [name])
            except UserInputError as e:
                hint = " (seeds go in `seeds:`)" if name == "seed" else ""
                raise UserInputError(f"`{section}.{name}`: {e}{hint}") from None
    both = sorted(set(cfg.params) & set(cfg.search_space))
    if both:
        raise UserInputError(f"`params.{both[0]}` is also in `search_space`; keep it in one place")

    candidates = {}
    for name, spec in cfg.search_space.items():
        _check_space(f"search_space.{name}", spec)
        candidates[name] = _candidate_values(f"search_space.{name}", spec)
    # types and rules by the one adapter that also checks `genrec eval --param` and POST /recommend
    _check_combinations(cfg, candidates, lambda values: eval_params(cfg.decoder, values, cfg.ks))

    if cfg.metric not in cfg.valid_metrics():
        raise UserInputError(f"`metric`: {cfg.metric!r} is not produced; choose one of {cfg.valid_metrics()}")
    if check_files:
        check_inputs(cfg)


def check_trial_capabilities(cfg: ExperimentConfig, device: str | None, levels: int) -> None:
    """Every trial's parameters (every arm's) against what the trials' device (None: unknown) and SIDs
    of `levels` levels can run (genrec.platform.capabilities), before the first trial starts; the
    error names the search-space value at fault. A benchmark checks its own parameters."""
    from genrec.platform.capabilities import check_capabilities
    from genrec.platform.params import eval_params

    if cfg.benchmark is not None:
        return
    for i, sub in enumerate(cfg.arm_configs() if cfg.arms else [cfg]):
        candidates = {
            name: _candidate_values(f"search_space.{name}", spec) for name, spec in sub.search_space.items()
        }

        def check(values: dict, sub: ExperimentConfig = sub) -> None:
            check_capabilities(eval_params(sub.decoder, values, sub.ks), device, levels)

        try:
            _check_combinations(sub, candidates, check)
        except UserInputError as e:
            raise UserInputError(f"`arms[{i}]` ({sub.decoder}): {e}" if cfg.arms else str(e)) from None


def validate_benchmark_experiment(cfg: ExperimentConfig) -> None:
    """A `benchmark:` experiment: known name, params/search_space named like the benchmark's Params
    fields, the required ones given, every grid combination through the one parameter adapter (types,
    then the Params' own rules), and a metric the benchmark reports."""
    from genrec.platform.benchmarks import benchmark_names, get_benchmark
    from genrec.platform.params import check_field_names, parse_benchmark_params
    from genrec.workloads.benchmark_registry import FILLED_BY_TRIAL

    if cfg.benchmark not in benchmark_names():
        raise UserInputError(
            f"`benchmark`: unknown benchmark {cfg.benchmark!r}; choose one of {benchmark_names()}"
        )
    bench = get_benchmark(cfg.benchmark)
    _check_numbers(cfg)
    defaults = bench.parameters()
    for section, names in (("params", cfg.params), ("search_space", cfg.search_space)):
        for name in names:
            if name == "seed":
                raise UserInputError(f"`{section}.seed`: seeds go in `seeds:` (each seed is one trial)")
            try:
                check_field_names(bench.Params, [name], f"benchmark {cfg.benchmark!r}")
            except UserInputError as e:
                raise UserInputError(f"`{section}.{name}`: {e}") from None
    both = sorted(set(cfg.params) & set(cfg.search_space))
    if both:
        raise UserInputError(f"`params.{both[0]}` is also in `search_space`; keep it in one place")
    given = {*cfg.params, *cfg.search_space, *FILLED_BY_TRIAL}
    required = [n for n, default in defaults.items() if default is MISSING and n not in given]
    if required:
        raise UserInputError(
            f"benchmark {cfg.benchmark!r} needs {required}: set them in `params` or `search_space`"
        )
    candidates = {}
    for name, spec in cfg.search_space.items():
        _check_space(f"search_space.{name}", spec)
        candidates[name] = _candidate_values(f"search_space.{name}", spec)
    _check_combinations(cfg, candidates, lambda values: parse_benchmark_params(cfg.benchmark, values))
    if cfg.metric not in cfg.valid_metrics():
        raise UserInputError(
            f"`metric`: {cfg.metric!r} is not reported by benchmark {cfg.benchmark!r}; "
            f"choose one of {cfg.valid_metrics()}"
        )


def _check_numbers(cfg: ExperimentConfig) -> None:
    checks = [
        ("eval.ks", min(cfg.eval.ks, default=0) >= 1, "K values must be >= 1 (e.g. [5, 10])"),
        ("eval.batch_size", cfg.eval.batch_size >= 1, "must be >= 1"),
        ("eval.max_users", cfg.eval.max_users >= 0, "must be >= 0 (0 = every user)"),
        ("eval.warmup_batches", cfg.eval.warmup_batches >= 0, "must be >= 0"),
        ("eval.threads", cfg.eval.threads >= 0, "must be >= 0 (0 = the trial's CPU count)"),
        ("eval.repeats", cfg.eval.repeats >= 1, "must be >= 1 (3 or more to see run-to-run spread)"),
        ("seeds", len(cfg.seeds) >= 1, "give at least one seed"),
        ("num_samples", cfg.num_samples >= 1, "must be >= 1"),
        ("max_concurrent", cfg.max_concurrent >= 0, "must be >= 0 (0 = as resources allow)"),
        ("max_failures", cfg.max_failures >= 0, "must be >= 0"),
        ("resources.cpu", cfg.resources.cpu > 0, "must be > 0 (fractions like 0.5 are fine)"),
        (
            "resources.gpu",
            cfg.resources.gpu == "auto" or cfg.resources.gpu >= 0,
            "must be >= 0 or 'auto'",
        ),
        ("ray.num_cpus", cfg.ray.num_cpus is None or cfg.ray.num_cpus >= 1, "must be >= 1"),
    ]
    for key, ok, msg in checks:
        if not ok:
            raise UserInputError(f"`{key}`: {msg}, got {_get(cfg, key)!r}")
    if len(set(cfg.seeds)) != len(cfg.seeds):
        raise UserInputError(f"`seeds`: duplicates in {cfg.seeds}")
    if cfg.model.train is not None:
        try:
            cfg.model.train.to_train_config().validate()
        except UserInputError as e:
            raise UserInputError(f"`model.train`: {e}") from None


def _get(cfg: ExperimentConfig, dotted: str) -> Any:
    obj: Any = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _check_space(key: str, spec: SpaceSpec) -> None:
    kind = spec.kind
    value = getattr(spec, kind)
    if kind in ("grid", "choice"):
        if not value:
            raise UserInputError(f"`{key}.{kind}`: give at least one value")
        if len({json.dumps(v) for v in value}) != len(value):
            raise UserInputError(f"`{key}.{kind}`: duplicate values in {value}")
        return
    if kind == "range":
        if value.step <= 0:
            raise UserInputError(f"`{key}.range.step`: must be > 0, got {value.step}")
        if value.high < value.low:
            raise UserInputError(f"`{key}.range`: high ({value.high}) is below low ({value.low})")
        return
    if not value.low < value.high:
        raise UserInputError(f"`{key}.{kind}`: low ({value.low}) must be below high ({value.high})")
    if kind == "loguniform" and value.low <= 0:
        raise UserInputError(f"`{key}.loguniform.low`: must be > 0, got {value.low}")
    if kind == "randint" and not (float(value.low).is_integer() and float(value.high).is_integer()):
        raise UserInputError(f"`{key}.randint`: low and high must be integers")


def _candidate_values(key: str, spec: SpaceSpec) -> list[tuple[str, Any]]:
    """(key path, value) pairs to validate: every listed value, or the ends of a sampled range."""
    kind = spec.kind
    value = getattr(spec, kind)
    if kind in ("grid", "choice"):
        return [(f"{key}.{kind}[{i}]", v) for i, v in enumerate(value)]
    if kind == "range":
        try:
            return [(f"{key}.range", v) for v in expand_range(value)]
        except UserInputError as e:
            raise UserInputError(f"`{key}.range`: {e}") from None
    ends = [value.low, value.high]
    if kind == "randint":
        ends = [int(x) for x in ends]
    return [(f"{key}.{kind}.low", ends[0]), (f"{key}.{kind}.high", ends[1])]


def _check_combinations(
    cfg: ExperimentConfig, candidates: dict[str, list[tuple[str, Any]]], check: Callable[[dict], object]
) -> None:
    """Every combination of candidate values (with the fixed params) must pass `check` (the decoder's
    Params or the benchmark's own check); the error names the values that failed."""
    names = list(candidates)
    if math.prod(len(v) for v in candidates.values()) > MAX_COMBINATIONS_CHECKED:
        # too many combinations: check each value alone with the fixed params
        checks = [((name,), [kv]) for name in names for kv in candidates[name]]
    else:
        checks = [(tuple(names), list(c)) for c in itertools.product(*candidates.values())]
    for group, picked in checks:
        values = dict(cfg.params)
        values.update({name: v for name, (_, v) in zip(group, picked)})
        try:
            check(values)
        except (UserInputError, TypeError, ValueError) as e:
            raise UserInputError(f"{_where(cfg, group, picked, getattr(e, 'param', None))}: {e}") from None


def _where(cfg: ExperimentConfig, group: tuple, picked: list, param: str | None) -> str:
    """The key path of a failed check: the one value at fault when the error names its parameter
    (genrec.platform.params.ParamError), else every search-space value of the combination."""
    for name, (key, value) in zip(group, picked):
        if name == param:
            return f"`{key}` = {value!r}"
    if param is not None and param in cfg.params:
        return f"`params.{param}`"
    return ", ".join(f"`{k}` = {v!r}" for k, v in picked) or "`params`"


def check_benchmark_inputs(cfg: ExperimentConfig) -> None:
    """The dataset folders a benchmark reads (its `dataset_params`) exist, before Ray starts."""
    from genrec.platform.benchmarks import get_benchmark

    for name in get_benchmark(cfg.benchmark).dataset_params:
        data = cfg.params.get(name)
        if isinstance(data, str) and not (Path(data) / "manifest.json").is_file():
            raise UserInputError(
                f"`params.{name}`: {data} is not a dataset folder (no manifest.json); create it with "
                f"`genrec data synth --out {data}` or `genrec data import ...`"
            )


def check_draft_given(cfg: ExperimentConfig) -> None:
    """A decoder that decodes with a draft model (AtSpeed's) needs `draft:` in the file."""
    from genrec.workloads.decoding.draft import draft_needed_message, needs_draft

    if needs_draft(cfg.decoder) and cfg.draft is None:
        raise UserInputError(
            "`draft`: " + draft_needed_message(cfg.decoder, "add `draft: DIR` beside `model:`")
        )


def check_draft_input(cfg: ExperimentConfig, target: Path, sizes: list[int], role: str) -> None:
    """The draft folder holds a checkpoint on the target's codes (config.json only: the trials load it):
    the dataset's codebook sizes, or an imported model's SID table's (which may skip unused codes)."""
    from genrec.workloads.decoding.draft import check_same_codec, checkpoint_codebook_sizes

    try:
        draft_sizes = checkpoint_codebook_sizes(cfg.draft)
        check_same_codec(cfg.draft, draft_sizes, target, tuple(sizes), target_role=role)
    except UserInputError as e:
        raise UserInputError(f"`draft`: {e}") from None


def check_inputs(cfg: ExperimentConfig) -> None:
    """The dataset exists; the checkpoint exists (or will be trained) and fits the dataset; so does the
    draft, if any."""
    data = cfg.dataset.path
    if not (data / "manifest.json").is_file():
        raise UserInputError(
            f"`dataset.path`: {data} is not a dataset folder (no manifest.json); create it with "
            f"`genrec data synth --out {data}` or `genrec data import ...`"
        )
    try:
        sizes = json.loads((data / "manifest.json").read_text())["codebook_sizes"]
    except (ValueError, KeyError) as e:
        raise UserInputError(
            f"`dataset.path`: {data}/manifest.json is unreadable ({e}); rebuild it"
        ) from None
    if cfg.model.checkpoint is None:
        if cfg.draft is not None:
            check_draft_input(cfg, data, sizes, "dataset")
        return  # trained by the sweep from this dataset
    ckpt = cfg.model.checkpoint
    if not ((ckpt / "config.json").is_file() and (ckpt / "model.safetensors").is_file()):
        raise UserInputError(
            f"`model.checkpoint`: {ckpt} holds no checkpoint (config.json + model.safetensors); create it "
            f"with `genrec train --data {data} --model tiny --out {ckpt}`, or use `model: {{train: ...}}`"
        )
    from genrec.workloads.models.checkpoint import read_checkpoint_config

    try:  # the loader's own checks and messages (the pre-flight loads the weights before Ray starts)
        config = read_checkpoint_config(ckpt / "config.json")
        ckpt_sizes = (config["codec"] or {})["codebook_sizes"]
    except UserInputError as e:
        raise UserInputError(f"`model.checkpoint`: {e}") from None
    except (TypeError, KeyError) as e:
        raise UserInputError(
            f"`model.checkpoint`: {ckpt}/config.json: `codec` holds no codebook_sizes ({e!r}); retrain it"
        ) from None
    if "imported" in config:  # its SID table may skip codes no item uses: the pre-flight's load_context
        if cfg.draft is not None:  # checks the dataset's items against the table itself
            check_draft_input(cfg, ckpt, ckpt_sizes, "model")
        return
    if cfg.draft is not None:
        check_draft_input(cfg, data, sizes, "dataset")
    if list(ckpt_sizes) != list(sizes):
        raise UserInputError(
            f"`model.checkpoint`: {ckpt} was trained for codebook sizes {ckpt_sizes}, but the dataset "
            f"{data} has {sizes}; use the dataset the model was trained on"
        )
