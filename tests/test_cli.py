"""The `genrec` command line as a user meets it: -h and --version, numbers that are never silently
swapped for a default, --dry-run's resource check against the cluster the real run would use, a
missing results folder, [k/N] progress with elapsed/ETA, follow-up hints that carry a non-default
--results-dir, and progress bars only on a terminal."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer
import yaml
from conftest import run_cli
from typer.testing import CliRunner

from genrec.platform.cli import app
from genrec.workloads.errors import UserInputError
from genrec.workloads.progress import bar_enabled


# ---- -h and --version ------------------------------------------------------------------------------
def command_paths(cmd, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group below `genrec`, as the words typed after it (typer 0.29 ships its own
    click, so groups are told by their `commands`, not by click.Group)."""
    out = [path]
    if isinstance(getattr(cmd, "commands", None), dict):
        for name, sub in cmd.commands.items():
            out += command_paths(sub, (*path, name))
    return out


PATHS = command_paths(typer.main.get_command(app))


def test_the_command_tree_is_walked():
    assert {("eval",), ("sweep",), ("data", "import", "amazon"), ("rank", "train")} <= set(PATHS)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "genrec")
def test_dash_h_is_help_everywhere(path):
    runner = CliRunner()
    short = runner.invoke(app, [*path, "-h"])
    assert short.exit_code == 0, short.output
    assert "Usage:" in short.output
    assert short.output == runner.invoke(app, [*path, "--help"]).output


def test_version_prints_the_installed_distributions_version(capsys):
    assert run_cli(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"genrec {version('genrec-lab')}"


# ---- 0 is not a silent default -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "flag", "valid"),
    [
        (["eval", "--beam-width", "0"], "--beam-width 0", ">= 1"),
        (["eval", "--k", "0"], "--k 0", ">= 1"),
        (["eval", "--batch-size", "0"], "--batch-size 0", ">= 1"),
        (["eval", "--max-users", "-1"], "--max-users -1", ">= 0"),
        (["eval", "--threads", "-1"], "--threads -1", ">= 0"),
        (["train", "--patience", "0"], "--patience 0", ">= 1"),
        (["train", "--threads", "-1"], "--threads -1", ">= 0"),
        (["train", "--max-steps", "-1"], "--max-steps -1", ">= 0"),
        (["train", "--warmup-steps", "-1"], "--warmup-steps -1", ">= 0"),
        (["train", "--weight-decay", "-0.1"], "--weight-decay -0.1", ">= 0"),
        (["serve", "--port", "0"], "--port 0", "in 1..65535"),
        (["serve", "--replicas", "0"], "--replicas 0", ">= 1"),
        (["serve", "--num-cpus", "0"], "--num-cpus 0", ">= 1"),
        (["tokenize", "--epochs", "0"], "--epochs 0", ">= 1"),
        (["loadtest", "--find-max-rate", "--refine-steps", "-1"], "--refine-steps -1", ">= 0"),
    ],
)
def test_an_invalid_number_is_exit_2_naming_the_flag_and_range(argv, flag, valid, tmp_path, capsys):
    # checked before anything loads or connects: the paths and the URL need not exist
    missing = str(tmp_path / "missing")
    where = {
        "eval": ["--model", missing, "--quiet"],
        "train": ["--data", missing, "--out", str(tmp_path / "out"), "--quiet"],
        "serve": ["--model", missing],
        "tokenize": ["--data", missing, "--out", str(tmp_path / "out"), "--no-progress"],
        "loadtest": ["--url", "http://127.0.0.1:1"],
    }[argv[0]]
    assert run_cli([*argv, *where]) == 2
    err = capsys.readouterr().err
    assert f"{flag}: must be {valid}" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_beam_width_zero_is_refused_with_a_real_model(tiny_model_dir, capsys):
    """The issue's case: `--beam-width 0` used to evaluate width 10 without a word."""
    assert run_cli(["eval", "--model", str(tiny_model_dir), "--beam-width", "0", "--quiet"]) == 2
    assert "--beam-width 0: must be >= 1" in capsys.readouterr().err


def test_check_range_bounds_and_not_given():
    from genrec.platform.commands import common

    with pytest.raises(UserInputError, match=r"--port 65536: must be in 1\.\.65535"):
        common.check_range("--port", 65536, 1, 65535)
    common.check_range("--port", None, 1, 65535)  # not given: the default applies


# ---- missing input folders -------------------------------------------------------------------------
def test_runs_with_a_missing_results_dir_is_exit_2(tmp_path, capsys):
    assert run_cli(["runs", "--results-dir", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert f"--results-dir {tmp_path / 'nope'}: no such folder" in err


def test_runs_with_an_empty_results_dir_still_says_no_rows(tmp_path, capsys):
    assert run_cli(["runs", "--results-dir", str(tmp_path)]) == 0
    assert "no result rows" in capsys.readouterr().err


def test_loadtest_checks_its_data_folder_before_contacting_the_app(tmp_path, capsys):
    assert run_cli(["loadtest", "--url", "http://127.0.0.1:1", "--data", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "--data" in err and "no such folder" in err and "cannot reach" not in err


# ---- --dry-run checks the resources ----------------------------------------------------------------
def benchmark_experiment(tmp_path: Path, name: str, cpu: float, num_cpus: int | None = 2) -> Path:
    """A model-free experiment (MaRI MatMul timings at toy sizes): no dataset or checkpoint needed."""
    raw = {
        "name": name,
        "benchmark": "mari_matmul",
        "params": {"d_cross": 0, "reps": 1, "warmup": 0, "d_item": 8, "d_hidden": 8},
        "search_space": {"b": {"grid": [4, 8, 16]}, "d_user": {"grid": [8]}},
        "seeds": [0],
        "eval": {"threads": 1},
        "metric": "time_speedup",
        "mode": "max",
        "resources": {"cpu": cpu, "gpu": 0},
        "tracking": {"results_dir": str(tmp_path / "results"), "mlflow": False, "report": False},
    }
    if num_cpus is not None:
        raw["ray"] = {"num_cpus": num_cpus}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_check_trial_resources():
    from genrec.platform.sweep.ray_start import check_trial_resources

    check_trial_resources(2, 0, 2, 0)
    check_trial_resources(1, 0.25, 4, 1)
    with pytest.raises(UserInputError, match=r"asks for 64 CPU / 0 GPU but this machine's Ray has 2 CPU"):
        check_trial_resources(64, 0, 2, 0)
    with pytest.raises(UserInputError, match="lower resources.cpu or resources.gpu"):
        check_trial_resources(1, 1, 8, 0)


def test_dry_run_refuses_a_trial_larger_than_the_local_instance(tmp_path, capsys):
    path = benchmark_experiment(tmp_path, "too_big", cpu=64)  # ray.num_cpus: 2
    assert run_cli(["sweep", str(path), "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert "local Ray: 2 CPU / " in captured.out and "does not fit" in captured.out
    assert "`resources`: a trial asks for 64 CPU / 0 GPU but this machine's Ray has 2 CPU" in captured.err
    assert not (tmp_path / "results").exists()  # a dry run writes nothing


def test_dry_run_without_ray_num_cpus_uses_the_machines_cpu_count(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 3)
    path = benchmark_experiment(tmp_path, "fits", cpu=1, num_cpus=None)
    assert run_cli(["sweep", str(path), "--dry-run"]) == 0
    assert "local Ray: 3 CPU / " in capsys.readouterr().out
    path = benchmark_experiment(tmp_path, "fits4", cpu=4, num_cpus=None)
    assert run_cli(["sweep", str(path), "--dry-run"]) == 2
    assert "this machine's Ray has 3 CPU" in capsys.readouterr().err


def test_dry_run_against_a_remote_cluster_says_it_did_not_check(tmp_path, capsys):
    import socket

    path = benchmark_experiment(tmp_path, "remote", cpu=64)
    with socket.create_server(("127.0.0.1", 0)) as cluster:  # it answers; its resources are not asked
        address = f"127.0.0.1:{cluster.getsockname()[1]}"
        assert run_cli(["sweep", str(path), "--dry-run", "--ray-address", address]) == 0
    out = capsys.readouterr().out
    assert f"{address}: resources not checked" in out and f"ok ray address: {address} (answers)" in out


# ---- sweep progress: [k/N], elapsed, ETA -----------------------------------------------------------
def test_eta():
    from genrec.platform.sweep.callbacks import clock, eta_s

    assert eta_s(remaining=0, done_now=3, elapsed_s=12.0, trial_s_mean=4.0, slots=1, round_s=5.0) == 0.0
    assert eta_s(remaining=5, done_now=0, elapsed_s=12.0, trial_s_mean=0.0, slots=1) is None
    # first round of 4 side by side, one done: 11 left = 3 more rounds of the mean trial, not 11 x 5 s
    assert eta_s(remaining=11, done_now=1, elapsed_s=5.0, trial_s_mean=4.0, slots=4) == 12.0
    # one slot, the first trial done at 10 s (6 s of it worker start-up): 9 left x the 4 s trial
    assert eta_s(remaining=9, done_now=1, elapsed_s=10.0, trial_s_mean=4.0, slots=1, round_s=10.0) == 36.0
    # then the pace since the first round, start-up left out: 2 more in 8 s -> 4 s each, 7 left
    assert eta_s(remaining=7, done_now=3, elapsed_s=18.0, trial_s_mean=3.5, slots=1, round_s=10.0) == 28.0
    # 4 slots: the first round ended at 20 s, 4 more done by 30 s -> 2.5 s a trial at 4 at once
    assert eta_s(remaining=4, done_now=8, elapsed_s=30.0, trial_s_mean=9.0, slots=4, round_s=20.0) == 10.0
    assert [clock(s) for s in (0, 12, 65, 3723)] == ["0:00", "0:12", "1:05", "1:02:03"]


def fake_trials(*statuses: str) -> list:
    return [SimpleNamespace(status=s, trial_id=f"t{i}", path="/x") for i, s in enumerate(statuses)]


def row_result(width: int, wall: float, reused: bool = False) -> dict:
    flat = {
        "decoder": "beam",
        "decoder_params": json.dumps({"beam_width": width}),
        "seed": 0,
        "recall@10": 0.5,
        "trial_wall_s": wall,
    }
    return {"genrec_row": json.dumps(flat), "genrec_reused": int(reused)}


def test_progress_lines_count_k_of_n_with_eta(monkeypatch, capsys):
    from genrec.platform.sweep import callbacks as sweep

    monkeypatch.setattr(sweep, "write_result_row", lambda *a: None)
    cb = sweep.ParquetRowCallback("unused", "recall@10", progress=True)
    cb.setup(total_num_samples=4)
    cb.t0 -= 2.0  # the first trial took 2 s: 3 more of them, one at a time
    trials = fake_trials("RUNNING", "PENDING", "PENDING", "PENDING")
    cb.on_trial_result(0, trials, trials[0], row_result(10, 2.0))
    trials = fake_trials("TERMINATED", "RUNNING", "PENDING", "PENDING")
    cb.on_trial_result(0, trials, trials[1], row_result(20, 2.0))
    cb.on_trial_error(0, trials, trials[2])
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(
        r"\[1/4\] beam beam_width=10 seed=0 recall@10=0\.5000 \(2\.0 s\) elapsed 0:\d\d eta 0:0[56]", lines[0]
    ), lines[0]
    assert lines[1].startswith("[2/4] beam beam_width=20 ")
    assert lines[2].startswith("[3/4] trial t2 failed: see /x/error.txt elapsed ")


def test_progress_of_a_resumed_sweep_counts_earlier_trials(monkeypatch, capsys):
    """Tune restores finished trials as TERMINATED; a re-reported stored row takes no time (no ETA)."""
    from genrec.platform.sweep import callbacks as sweep

    monkeypatch.setattr(sweep, "write_result_row", lambda *a: None)
    cb = sweep.ParquetRowCallback("unused", "recall@10", progress=True)
    cb.setup(total_num_samples=3)
    trials = fake_trials("TERMINATED", "RUNNING", "PENDING")
    cb.on_trial_result(0, trials, trials[1], row_result(20, 9.0, reused=True))
    first = capsys.readouterr().out
    assert first.startswith("[2/3] beam beam_width=20 ") and "(stored row)" in first and "eta ?" in first


def test_starting_ray_is_announced(monkeypatch, capsys, tmp_path):
    from genrec.platform import sweep
    from genrec.platform.experiment_loading import load_experiment

    cfg = load_experiment(benchmark_experiment(tmp_path, "announce", cpu=1, num_cpus=2))
    calls = []
    monkeypatch.setattr(sweep.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(sweep.ray, "init", lambda **kw: calls.append(kw))
    assert sweep.init_ray(cfg, "local", progress=True)
    assert capsys.readouterr().out == "starting Ray (local, 2 CPUs)...\n"
    assert calls[0]["num_cpus"] == 2
    assert calls[0]["_system_config"] == {"worker_niceness": 0}  # trials at the driver's priority
    sweep.init_ray(cfg, "local", progress=False)
    assert capsys.readouterr().out == ""


TRIAL_NICENESS = """
import os, sys
import ray
from genrec.platform import sweep
from genrec.platform.experiment_loading import load_experiment

cfg = load_experiment(sys.argv[1])
sweep.init_ray(cfg, "local")
print("niceness", ray.get(ray.remote(lambda: os.nice(0)).remote()))
ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.parametrize("niceness", [None, 7])
def test_a_local_sweeps_ray_workers_run_at_the_configured_niceness(tmp_path, niceness):
    """Ray's own default is 15 for every worker (so every trial); a sweep's local Ray uses 0 unless the
    experiment says otherwise. A real Ray start, in its own process (the test session may hold one)."""
    path = benchmark_experiment(tmp_path, "nice", cpu=1, num_cpus=1)
    if niceness is not None:
        raw = yaml.safe_load(path.read_text())
        raw["ray"]["worker_niceness"] = niceness
        path.write_text(yaml.safe_dump(raw))
    run = subprocess.run(
        [sys.executable, "-c", TRIAL_NICENESS, str(path)], capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"niceness {niceness or 0}" in run.stdout


def test_worker_niceness_outside_0_to_19_is_refused(tmp_path):
    from genrec.platform.experiment_loading import load_experiment

    path = benchmark_experiment(tmp_path, "nice", cpu=1, num_cpus=1)
    raw = yaml.safe_load(path.read_text())
    raw["ray"]["worker_niceness"] = -5
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserInputError, match="worker_niceness"):
        load_experiment(path)


# ---- hints carry the non-default results dir -------------------------------------------------------
def test_sweep_summary_hint_names_a_non_default_results_dir(tmp_path, monkeypatch):
    from genrec.platform.sweep.results import SweepSummary

    monkeypatch.chdir(tmp_path)
    other = tmp_path / "elsewhere"
    lines = SweepSummary("x", parquet_dir=other / "parquet" / "experiment=x").lines()
    assert f"(genrec runs --experiment x --results-dir {other})" in "\n".join(lines)
    default = tmp_path / "runs" / "results"
    lines = SweepSummary("x", parquet_dir=default / "parquet" / "experiment=x").lines()
    assert "(genrec runs --experiment x)" in "\n".join(lines)


def test_results_dir_args():
    from genrec.platform.commands.common import command_hint, results_dir_args

    assert results_dir_args(None) == [] and results_dir_args("runs/results") == []
    assert results_dir_args(Path("my results")) == ["--results-dir", "my results"]
    assert command_hint("genrec", "runs", *results_dir_args("my results")) == (
        "genrec runs --results-dir 'my results'"
    )


# ---- a real sweep on the shared local Ray (2 CPUs) -------------------------------------------------
def test_sweep_refuses_resources_and_prints_progress_and_hints(ray_session, tmp_path, capsys):
    too_big = benchmark_experiment(tmp_path, "big", cpu=64)
    assert run_cli(["sweep", str(too_big)]) == 2
    real = capsys.readouterr().err.strip().splitlines()[-1]
    assert run_cli(["sweep", str(too_big), "--dry-run"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == real  # one check, one message

    path = benchmark_experiment(tmp_path, "small", cpu=1)
    results = tmp_path / "results"
    assert run_cli(["sweep", str(path), "--results-dir", str(results)]) == 0
    out = capsys.readouterr().out
    done = [line for line in out.splitlines() if line.startswith("[")]
    assert [line.split()[0] for line in done] == ["[1/3]", "[2/3]", "[3/3]"], out
    assert all(re.search(r"elapsed \d+:\d\d eta (\d+:\d\d|\?)$", line) for line in done), done
    assert done[-1].endswith("eta 0:00")
    assert f"genrec runs --experiment small --results-dir {results}" in out


# ---- progress bars only on a terminal --------------------------------------------------------------
def test_bar_enabled():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert bar_enabled(True, Tty()) and not bar_enabled(False, Tty())
    assert not bar_enabled(True, io.StringIO())
    closed = open(os.devnull)  # noqa: SIM115 - closed at once: isatty() then raises ValueError
    closed.close()
    assert not bar_enabled(True, closed) and not bar_enabled(True, object())


def test_redirected_train_and_eval_logs_hold_no_bar_redraws(synth_dir, tmp_path):
    """stderr to a pipe (a redirected log): no tqdm carriage returns, the result lines still print."""
    genrec = [sys.executable, "-c", "from genrec.platform.cli import main; main()"]
    model = tmp_path / "m"
    train = [*genrec, "train", "--data", str(synth_dir), "--out", str(model), "--epochs", "1"]
    done = subprocess.run([*train, "--max-steps", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr + done.stdout and "trained tiny" in done.stdout
    ev = [*genrec, "eval", "--model", str(model), "--max-users", "20", "--batch-size", "5"]
    done = subprocess.run(ev, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr + done.stdout and "recall" in done.stdout.lower()


def test_train_quiet_prints_only_the_summary_line(synth_dir, tmp_path, capsys):
    """--quiet drops the per-epoch lines (tqdm.write goes to stdout); the one-line summary stays."""
    argv = ["train", "--data", str(synth_dir), "--out", str(tmp_path / "m"), "--epochs", "1"]
    assert run_cli([*argv, "--max-steps", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert not [line for line in out.splitlines() if line.startswith("epoch ")], out
    assert out.count("trained tiny: best val loss") == 1, out


def test_sigusr1_prints_every_threads_stack_and_the_command_goes_on():
    """A hung command can be asked where it is: SIGUSR1 dumps all threads' stacks (faulthandler)."""
    code = (
        "import os, signal, sys, time\n"
        "from genrec.platform.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\ntime.sleep(0.5)\nprint('still here')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "still here" in out.stdout, out.stderr[-2000:]
    assert "Current thread" in out.stderr or "Thread 0x" in out.stderr, out.stderr[-2000:]
