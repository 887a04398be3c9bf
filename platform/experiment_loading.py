"""Experiment files into validated `ExperimentConfig`s: reading the YAML, typing it, resolving its
paths, running the checks (genrec.platform.experiment_checks), and turning pydantic's errors into one
line that names the key path.

Relative paths resolve against the current directory (the repo root for `make demo`), not the YAML's
folder, and are stored absolute: Ray workers and resumed sweeps see the same paths.

`format_validation_error` and `valid_keys_at` also serve other strict configs (the Serve config passes
its own root model); their default root is `ExperimentConfig`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from genrec.workloads.errors import UserInputError

if TYPE_CHECKING:
    from genrec.platform.experiment import ExperimentConfig


def _experiment_config() -> type[ExperimentConfig]:
    """ExperimentConfig, imported when first needed: genrec.platform.experiment imports this
    module's functions, so this module cannot import it at the top."""
    from genrec.platform.experiment import ExperimentConfig

    return ExperimentConfig


def load_experiment(
    path: str | os.PathLike,
    base_dir: str | os.PathLike | None = None,
    check_files: bool = True,
    max_trials: int | None = None,
) -> ExperimentConfig:
    """Read (within yaml_limits' bounds), type-check and validate an experiment file; relative paths
    resolve against base_dir (default: the current directory). Raises UserInputError naming the key
    path. `max_trials`: the trial limit (default experiment_checks.DEFAULT_MAX_TRIALS)."""
    from genrec.platform.yaml_limits import load_bounded_yaml

    path = Path(path)
    if not path.is_file():
        raise UserInputError(
            f"{path}: no such experiment file (see experiments/*.yaml and studies/*/experiments/*.yaml "
            "for examples)"
        )
    raw = load_bounded_yaml(path, "experiment file")
    if not isinstance(raw, dict):
        raise UserInputError(f"{path}: expected a mapping of keys (name, dataset, model, decoder, ...)")
    return experiment_from_dict(
        raw, source=path, base_dir=base_dir, check_files=check_files, max_trials=max_trials
    )


def experiment_from_dict(
    raw: dict,
    source: Path | None = None,
    base_dir: str | os.PathLike | None = None,
    check_files: bool = True,
    max_trials: int | None = None,
) -> ExperimentConfig:
    where = f"{source}: " if source else ""
    try:
        cfg = _experiment_config().model_validate(raw)
    except ValidationError as e:
        raise UserInputError(where + format_validation_error(e)) from None
    cfg._source = source.resolve() if source else None
    resolve_paths(cfg, Path(base_dir) if base_dir else Path.cwd())
    from genrec.platform.experiment_checks import DEFAULT_MAX_TRIALS, validate_experiment

    try:
        validate_experiment(cfg, check_files=check_files, max_trials=max_trials or DEFAULT_MAX_TRIALS)
    except UserInputError as e:
        raise UserInputError(where + str(e)) from None
    return cfg


def resolve_paths(cfg: ExperimentConfig, base: Path) -> None:
    from genrec.workloads.models.hf_cache import HF_PREFIX, resolve_model

    def absolute(p: Path) -> Path:
        p = p.expanduser()
        return (p if p.is_absolute() else base / p).resolve()

    def model_path(p: Path, key: str) -> Path:
        """hf:DIR -> its cached import, with the experiment's dataset as the items (hf_cache.py)."""
        if not str(p).startswith(HF_PREFIX):
            return absolute(p)
        spec = HF_PREFIX + str(absolute(Path(str(p)[len(HF_PREFIX) :])))
        return resolve_model(spec, cfg.dataset.path if cfg.dataset else None, role=key).resolve()

    if cfg.dataset is not None:
        cfg.dataset.path = absolute(cfg.dataset.path)
    if cfg.model.checkpoint is not None:
        cfg.model.checkpoint = model_path(cfg.model.checkpoint, "model.checkpoint")
    if cfg.model.train is not None:
        cfg.model.train.out = absolute(cfg.model.train.out)
    if cfg.draft is not None:
        cfg.draft = model_path(cfg.draft, "draft")
    for i, arm in enumerate(cfg.arms):
        if arm.model is not None:
            arm.model = model_path(arm.model, f"arms[{i}].model")
    if cfg.benchmark is not None:  # a benchmark's path arguments (trials run in another directory)
        from genrec.platform.benchmarks import find_benchmark

        for name in getattr(find_benchmark(cfg.benchmark), "path_params", ()):
            if isinstance(cfg.params.get(name), str):
                cfg.params[name] = str(absolute(Path(cfg.params[name])))
    cfg.tracking.results_dir = absolute(cfg.tracking.results_dir)
    if cfg.tracking.storage_path is not None:
        cfg.tracking.storage_path = absolute(cfg.tracking.storage_path)


def format_validation_error(
    e: ValidationError, root: type[BaseModel] | None = None, what: str = "experiment"
) -> str:
    """One line per problem: the key path, what is wrong, and the valid keys for unknown ones (looked up
    from `root`, the model that was validated: ExperimentConfig unless another, e.g. ServeConfig)."""
    lines = []
    for err in e.errors():
        loc = [str(part) for part in err["loc"]]
        key = ".".join(loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            valid = valid_keys_at(loc[:-1], root or _experiment_config())
            lines.append(f"unknown key `{key}`" + (f"; valid keys here: {valid}" if valid else ""))
        elif err["type"] == "missing":
            lines.append(f"missing required key `{key}`")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"`{key}`: {msg} (got {err.get('input')!r})")
    return f"invalid {what}: " + "; ".join(lines)


def valid_keys_at(loc: list[str], root: type[BaseModel] | None = None) -> list[str]:
    """Field names of the model found by walking `loc` from `root` (default ExperimentConfig; dict
    keys skipped)."""
    model: type[BaseModel] | None = root or _experiment_config()
    i = 0
    while model is not None and i < len(loc):
        field = model.model_fields.get(loc[i])
        if field is None:
            return []
        model, is_mapping = _model_of(field.annotation)
        i += 2 if is_mapping else 1
    if model is None:
        return []
    return list(model.model_fields)


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    from typing import get_args, get_origin

    origin = get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if origin is dict:
        inner, _ = _model_of(get_args(annotation)[1])
        return inner, True
    for arg in get_args(annotation):  # Optional[Model] / unions
        inner, mapping = _model_of(arg)
        if inner is not None:
            return inner, mapping
    return None, False
