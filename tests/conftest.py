"""Shared fixtures: the repo root, the optional real data, a tiny trained model built once."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load_studies() -> None:
    """The studies' benchmarks and report pages, registered as the platform registers them before it
    looks one up (tests call the registries and report builders directly; test_benchmark_registry.py
    checks in a fresh process that the platform's own entry points load them)."""
    from genrec.studies.loader import load_studies

    load_studies()


_load_studies()
BEAUTY = REPO.parent / "shared" / "datasets" / "beauty"


def require_beauty() -> Path:
    if not (BEAUTY / "sequential_train.txt").is_file():
        pytest.skip(f"real Beauty data not present at {BEAUTY} (only in checkouts with ../shared/datasets)")
    return BEAUTY


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory) -> Path:
    from genrec.workloads.data.synth import SynthConfig, synth_dataset

    out = tmp_path_factory.mktemp("data") / "synth"
    synth_dataset(SynthConfig(seed=0, num_users=400, num_items=200, levels=3, codebook_size=8), out)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(synth_dir, tmp_path_factory) -> Path:
    from genrec.workloads.training.train_config import TrainConfig
    from genrec.workloads.training.trainer import train

    out = tmp_path_factory.mktemp("models") / "tiny"
    train(
        synth_dir,
        out,
        TrainConfig(model_size="tiny", epochs=4, batch_size=64, warmup_steps=10),
        progress=False,
    )
    return out


def run_cli(argv: list[str]) -> int:
    """Exit code of `genrec ARGV` (click's standalone mode raises SystemExit even on success)."""
    from genrec.platform.cli import main

    try:
        main(argv)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance (2 CPUs) for every test that needs Ray; trials and replicas use fractions."""
    ray = pytest.importorskip("ray")
    from genrec.platform.serve.ingress import ingress_environment, started_with

    if not ray.is_initialized():
        # the Serve tests run through the same ingress `genrec serve` picks by default; Ray's processes
        # start without TRITON_INTERPRET (kernel test modules set it at import), so replicas refuse a
        # Triton backend on the CPU as a real deployment does
        env = {**ingress_environment("auto"), "TRITON_INTERPRET": "0"}
        with started_with(env):
            ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


# ---- the fault suite's counts (tests/faults): printed at the end of any run that includes it ------------
# Modules whose cases are bad inputs (each should be answered as documented: a 4xx or exit 2 naming the
# problem); every other fault-suite module injects faults (killed replicas, stalled clients, poison
# requests, concurrent sweeps) that the platform should survive.
FAULT_INPUT_MODULES = {
    "test_bad_requests.py",
    "test_bad_files.py",
    "test_bad_where.py",
    "test_hostile_files.py",
    "test_hostile_cli.py",
    "test_unused_params.py",
}
_fault_counts: dict[str, list[int]] = {"inputs": [0, 0], "faults": [0, 0]}  # [tried, as documented]


def pytest_runtest_logreport(report):
    path = Path(str(report.fspath))
    if path.parent.name != "faults" or report.skipped:
        return
    if report.when != "call" and report.passed:
        return
    kind = "inputs" if path.name in FAULT_INPUT_MODULES else "faults"
    if report.when == "call" or report.failed:  # a failed setup or call counts once as tried and failed
        _fault_counts[kind][0] += 1
        _fault_counts[kind][1] += report.passed


def pytest_terminal_summary(terminalreporter):
    (inputs, answered), (faults, survived) = _fault_counts["inputs"], _fault_counts["faults"]
    if inputs or faults:
        terminalreporter.write_line(
            f"fault suite: {answered}/{inputs} bad inputs answered as documented; "
            f"{survived}/{faults} faults survived"
        )


@pytest.fixture(autouse=True)
def no_triton_interpreter_in_the_fault_suite(request, monkeypatch):
    """The fault suite checks what a CPU deployment refuses, so it runs without the Triton interpreter
    that kernel test modules switch on at import (collection imports every module: a full run has it)."""
    if "faults" in request.path.parts:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
