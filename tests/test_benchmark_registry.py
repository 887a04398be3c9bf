"""The benchmark registry: core mechanism (genrec.workloads.benchmark_registry), entries registered by the
studies, typed Params checked by the same adapter as decoder Params, and loaded by the platform."""

from __future__ import annotations

import inspect
import subprocess
import sys
import typing
from dataclasses import MISSING, fields, is_dataclass

import pytest
from conftest import REPO

from genrec.platform.benchmarks import benchmark_names, get_benchmark
from genrec.platform.params import parse_benchmark_params, parse_decoder_params
from genrec.workloads.benchmark_registry import Benchmark, register_benchmark
from genrec.workloads.errors import UserInputError

EXPECTED = {
    "atspeed_arm",
    "mari_fragmented",
    "mari_matmul",
    "mari_model",
    "nezha_arm",
    "static_branch",
    "static_scaling",
    "xgr_serving",
}


def test_every_study_benchmark_is_registered():
    assert set(benchmark_names()) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_params_are_the_functions_keyword_arguments(name):
    """One source per benchmark: its frozen Params has the function's parameters, defaults and types."""
    bench = get_benchmark(name)
    assert is_dataclass(bench.Params) and bench.Params.__dataclass_params__.frozen
    sig = inspect.signature(bench.fn).parameters
    assert list(sig) == [f.name for f in fields(bench.Params)]
    hints, fn_hints = typing.get_type_hints(bench.Params), typing.get_type_hints(bench.fn)
    for f in fields(bench.Params):
        p = sig[f.name]
        assert (p.default is p.empty) == (f.default is MISSING), f.name  # required in both or neither
        if p.default is not p.empty:
            assert f.default == p.default, f.name
        assert hints[f.name] == fn_hints[f.name], f.name
    assert set(bench.path_params) <= set(sig) and set(bench.dataset_params) <= set(bench.path_params)


def test_a_bad_type_reads_the_same_for_a_benchmark_and_a_decoder():
    with pytest.raises(UserInputError) as bench_err:
        parse_benchmark_params("nezha_arm", {"arm": "beam", "beam_width": "5"})
    with pytest.raises(UserInputError) as decoder_err:
        parse_decoder_params("beam", {"beam_width": "5"})
    assert str(bench_err.value) == str(decoder_err.value) == "`beam_width` takes an int, got '5' (str)"
    assert bench_err.value.param == decoder_err.value.param == "beam_width"


@pytest.mark.parametrize(
    ("name", "values", "message", "param"),
    [
        ("nezha_arm", {"arm": "beam", "bogus": 1}, "benchmark 'nezha_arm' has no parameter 'bogus'", "bogus"),
        ("nezha_arm", {"epochs": 2}, "benchmark 'nezha_arm' needs ['arm']", "arm"),
        ("mari_matmul", {"d_cross": -1}, "`d_cross` must be >= 0, got -1", "d_cross"),
        (
            "xgr_serving",
            {"model": "m", "wait_share": 1.0},
            "`wait_share` must be in (0, 1), got 1.0",
            "wait_share",
        ),
        ("xgr_serving", {"model": "m", "rates": "fast"}, "rates must be positive requests/s", None),
        ("atspeed_arm", {"objective": "sft", "alpha": 2.0}, "`alpha` must be in [0, 1], got 2.0", None),
        (
            "static_branch",
            {"max_branch": 64, "vocab": 32},
            "cannot exceed the codebook size vocab = 32",
            None,
        ),
    ],
)
def test_bad_values_name_the_problem_and_the_parameter(name, values, message, param):
    with pytest.raises(UserInputError) as err:
        parse_benchmark_params(name, values)
    assert message in str(err.value) and err.value.param == param


def test_run_validates_without_the_platform():
    """On the lent GPU machine (no pydantic) `Benchmark.run` still applies the Params' rules."""
    with pytest.raises(UserInputError, match="`b` must be >= 1, got 0"):
        get_benchmark("mari_matmul").run(b=0)
    with pytest.raises(UserInputError, match=r"needs \['max_branch'\]"):
        get_benchmark("static_branch").run()


def test_a_name_registers_once():
    with pytest.raises(ValueError, match="registered twice"):
        register_benchmark(Benchmark("nezha_arm", object, print, (), "a second nezha_arm"))


def _fresh(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_layers_below_the_studies_register_none_and_the_platform_loads_them():
    """In a fresh process (a CLI run, a Tune worker): the core registries hold only the toolkit's own
    entries until the platform looks one up, which loads every study's registration module."""
    core = (
        "from genrec.workloads.benchmark_registry import BENCHMARKS; from genrec.dashboards.registry "
        "import PAGES; print(sorted(BENCHMARKS), sorted(PAGES))"
    )
    assert _fresh(core) == "[] ['benchmark', 'decoders', 'loadtest']"
    platform = (
        "from genrec.platform.benchmarks import get_benchmark, load_report_pages; "
        "from genrec.dashboards.registry import PAGES; get_benchmark('nezha_arm'); load_report_pages(); "
        "print(sorted(PAGES))"
    )
    assert _fresh(platform) == "['atspeed', 'benchmark', 'decoders', 'loadtest', 'mari', 'nezha']"
