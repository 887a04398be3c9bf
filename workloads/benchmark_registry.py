"""Benchmarks a sweep can name (`benchmark: NAME` in an experiment file): name -> typed Params -> metrics.

A benchmark experiment needs no dataset, model or decoder. Each benchmark declares a frozen `Params`
dataclass: its fields are the function's keyword arguments (same names and defaults), its types are
checked by the platform's one parameter adapter (genrec.platform.params, the one decoders use), and
its `validate()` holds the range and cross-field rules, so a bad value gets the same message from an
experiment file as a bad decoder parameter does. `seed`, `threads` and `device`, when the benchmark
takes them, are filled by the trial (seeds from `seeds:`, threads from the trial's CPUs) unless the
experiment fixes them.

This module is the mechanism only: the studies (genrec.studies.<topic>.registration) register their
benchmarks here, and the platform loads them (genrec.studies.loader). Pure workloads code: no ray,
mlflow or pydantic, and nothing above workloads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

from genrec.workloads.errors import UserInputError

FILLED_BY_TRIAL = ("seed", "threads", "device")


@dataclass(frozen=True)
class Benchmark:
    name: str
    Params: type  # frozen dataclass of the function's keyword arguments, with a validate() method
    fn: Callable[..., dict]
    metrics: tuple[str, ...]  # numeric outputs an experiment may optimise / plot
    description: str
    # string parameters that are file paths: an experiment file's relative ones resolve against its
    # base directory before trials start (Tune runs trials in their own working directories)
    path_params: tuple[str, ...] = ()
    dataset_params: tuple[str, ...] = ()  # path parameters naming dataset folders the benchmark reads

    def parameters(self) -> dict[str, Any]:
        """Parameter name -> default (dataclasses.MISSING for a required one), in declaration order."""
        return {f.name: f.default for f in fields(self.Params)}

    def params(self, **values: Any) -> Any:
        """The validated Params of `values` (types are trusted here: the platform checked them)."""
        missing = [n for n, d in self.parameters().items() if d is MISSING and n not in values]
        if missing:
            raise UserInputError(f"benchmark {self.name!r} needs {missing}: set them in `params`")
        params = self.Params(**values)
        params.validate()
        return params

    def run(self, **values: Any) -> dict:
        params = self.params(**values)
        return self.fn(**{f.name: getattr(params, f.name) for f in fields(params)})


# ---- rules a Params.validate() is made of (one message format, as decoder Params use; each error
# names its parameter, so an experiment's error points at that key) ----------------------------------
def check_at_least(params: Any, minimums: Mapping[str, int | float]) -> None:
    """Each named field is >= its minimum."""
    for name, low in minimums.items():
        value = getattr(params, name)
        if value < low:
            raise UserInputError(f"`{name}` must be >= {low}, got {value!r}", name)


def check_choice(params: Any, name: str, choices: Iterable[str]) -> None:
    value, names = getattr(params, name), list(choices)
    if value not in names:
        raise UserInputError(f"`{name}` must be one of {names}, got {value!r}", name)


def check_open_unit(params: Any, *names: str) -> None:
    """Each named field is a share strictly between 0 and 1."""
    for name in names:
        value = getattr(params, name)
        if not 0 < value < 1:
            raise UserInputError(f"`{name}` must be in (0, 1), got {value!r}", name)


# ---- the registry --------------------------------------------------------------------------------
BENCHMARKS: dict[str, Benchmark] = {}


def register_benchmark(bench: Benchmark) -> Benchmark:
    """Add a benchmark; its Params fields must be exactly the function's keyword arguments."""
    if bench.name in BENCHMARKS:
        raise ValueError(f"benchmark {bench.name!r} registered twice")
    BENCHMARKS[bench.name] = bench
    return bench


def benchmark_names() -> list[str]:
    return sorted(BENCHMARKS)


def get_benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise UserInputError(f"unknown benchmark {name!r}; choose one of {benchmark_names()}")
    return BENCHMARKS[name]
