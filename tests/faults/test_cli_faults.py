"""Fault suite, faults without Ray: an existing `train --out`, a device this torch cannot use, leftovers
of killed writers, a second sweep of a running experiment, Ctrl-C during a sweep, and duplicate rows of
one seed in a report."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import run_cli
from experiment_files import cpu_sweep, write_experiment
from fault_helpers import wait_until

from genrec.platform.tracking import ExperimentBusy, ExperimentLock
from genrec.workloads.results_store import read_rows


# ---- train --out ----------------------------------------------------------------------------------
def test_train_refuses_an_existing_out_without_overwrite(tiny_model_dir, synth_dir, tmp_path, capsys):
    import shutil

    out = tmp_path / "model"
    shutil.copytree(tiny_model_dir, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert run_cli(["train", "--data", str(synth_dir), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "--overwrite" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the trained model is untouched


# ---- devices ---------------------------------------------------------------------------------------
needs_cpu_only_torch = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


@needs_cpu_only_torch
@pytest.mark.parametrize("command", ["train", "eval", "serve"])
def test_unavailable_device_is_one_line_exit_2(command, tiny_model_dir, synth_dir, tmp_path, capsys):
    argv = {
        "train": ["train", "--data", str(synth_dir), "--out", str(tmp_path / "new"), "--device", "cuda"],
        "eval": ["eval", "--model", str(tiny_model_dir), "--device", "cuda", "--quiet"],
        "serve": ["serve", "--model", str(tiny_model_dir), "--device", "cuda", "--port", "1"],
    }[command]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "--device cuda" in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not (tmp_path / "new").exists()


# ---- leftovers of killed writers -------------------------------------------------------------------
def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # exited and reaped: no process has it (until the pid wraps around)


def test_stale_temporary_siblings_are_removed_on_the_next_write(synth_dir, tmp_path):
    from genrec.workloads.data.dataset import load_dataset
    from genrec.workloads.data.synth import SynthConfig, synth_dataset
    from genrec.workloads.io import _HOST, STALE_AFTER_S, atomic_write_text

    out = tmp_path / "synth"
    dead = tmp_path / f".synth.tmp-{dead_pid()}@{_HOST}-abc123"
    legacy = tmp_path / ".synth.tmp-k2j3h4"  # an older genrec's name, no pid: judged by age
    old_swap = tmp_path / f".synth.old-{dead_pid()}"
    live = tmp_path / f".synth.tmp-{os.getpid()}@{_HOST}-inuse"  # a writer that still runs
    other_host = tmp_path / f".synth.tmp-{dead_pid()}@elsewhere-x"  # maybe another machine's write
    for d in (dead, legacy, old_swap, live, other_host):
        d.mkdir()
        (d / "half.parquet").write_bytes(b"PAR1")
    ancient = time.time() - STALE_AFTER_S - 60
    for d in (legacy, old_swap):
        os.utime(d, (ancient, ancient))
    synth_dataset(SynthConfig(seed=1, num_users=40, num_items=30, levels=2, codebook_size=8), out)
    assert load_dataset(out).num_items == 30
    assert not dead.exists() and not legacy.exists() and not old_swap.exists()
    assert live.exists() and other_host.exists()

    report = tmp_path / "report.html"
    stale_file = tmp_path / f".report.html.tmp-{dead_pid()}@{_HOST}-zz"
    stale_file.write_text("half")
    atomic_write_text(report, "<html></html>")
    assert report.read_text() == "<html></html>" and not stale_file.exists()


def test_checkpoint_writes_clean_their_leftovers_too(tiny_model_dir, tmp_path):
    from genrec.workloads.io import _HOST
    from genrec.workloads.models.checkpoint import load_checkpoint, save_checkpoint

    stale = tmp_path / f".ck.tmp-{dead_pid()}@{_HOST}-q"
    stale.mkdir()
    save_checkpoint(tmp_path / "ck", load_checkpoint(tiny_model_dir))
    assert not stale.exists() and (tmp_path / "ck" / "model.safetensors").is_file()


# ---- one sweep per experiment ----------------------------------------------------------------------
def sweep_file(tmp_path: Path, model: Path, data: Path, name: str = "locked") -> Path:
    raw = cpu_sweep(name, data, model, tmp_path / "results", k=5, widths=[5, 10])
    raw |= {"metric": "recall@5", "eval": {"ks": [5], "max_users": 5, "threads": 1}}
    return write_experiment(tmp_path / f"{name}.yaml", raw)


HOLD_LOCK = """
import sys, time
from genrec.platform.tracking import ExperimentLock
ExperimentLock(sys.argv[1], sys.argv[2]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def test_a_second_sweep_of_a_running_experiment_exits_2_naming_its_pid(
    tiny_model_dir, synth_dir, tmp_path, capsys
):
    path = sweep_file(tmp_path, tiny_model_dir, synth_dir)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path / "results"), "locked"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        assert run_cli(["sweep", str(path), "--overwrite", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"pid {holder.pid} on {socket.gethostname()}" in err and "--resume" in err
        assert time.monotonic() - t0 < 10
        assert not (tmp_path / "results" / "parquet").exists()  # nothing deleted or written
        assert not (tmp_path / "results" / "ray").exists()
    finally:
        holder.kill()  # SIGKILL: the kernel releases the lock, no stale lock file blocks a resume
        holder.wait()
    with ExperimentLock(tmp_path / "results", "locked"):
        with pytest.raises(ExperimentBusy, match=f"pid {os.getpid()}"):
            ExperimentLock(tmp_path / "results", "locked").acquire()


# ---- Ctrl-C ----------------------------------------------------------------------------------------
def test_ctrl_c_during_a_sweep_prints_the_genrec_resume_command_and_exits_130(
    tiny_model_dir, synth_dir, tmp_path, capsys, monkeypatch
):
    from genrec.platform import sweep

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "run_sweep", interrupted)
    path = sweep_file(tmp_path, tiny_model_dir, synth_dir)
    assert run_cli(["sweep", str(path), "--results-dir", str(tmp_path / "r2"), "--quiet"]) == 130
    err = capsys.readouterr().err
    assert f"genrec sweep {path} --resume --results-dir {tmp_path / 'r2'}" in err
    assert "Tuner.restore" not in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_during_a_sweep_stop_it_as_ctrl_c_does(
    sig, tiny_model_dir, synth_dir, tmp_path, capsys, monkeypatch
):
    """Stopped as by Ctrl-C, exit 128 + the signal (the real sweep under SIGTERM: test_sweep_signals.py);
    the handlers the command replaced are back afterwards."""
    from genrec.platform import sweep

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the handler interrupts this
        raise AssertionError("the signal did not stop the sweep")

    monkeypatch.setattr(sweep, "run_sweep", signalled)
    before = signal.getsignal(sig)
    path = sweep_file(tmp_path, tiny_model_dir, synth_dir)
    assert run_cli(["sweep", str(path), "--results-dir", str(tmp_path / "r2"), "--quiet"]) == 128 + sig
    assert f"genrec sweep {path} --resume --results-dir {tmp_path / 'r2'}" in capsys.readouterr().err
    assert signal.getsignal(sig) is before


def test_tunes_own_interrupt_message_is_replaced_and_noticed():
    from genrec.platform.sweep.interrupt import _TuneInterruptWatch

    watch = _TuneInterruptWatch()
    log = logging.getLogger("ray.tune.tune")
    log.addFilter(watch)
    try:
        seen = []
        handler = logging.Handler()
        handler.emit = seen.append
        log.addHandler(handler)
        log.warning("Experiment has been interrupted ... Resume experiment with: Tuner.restore(path=...)")
        log.warning("an ordinary message")
    finally:
        log.removeFilter(watch)
        log.removeHandler(handler)
    assert watch.interrupted and [r.getMessage() for r in seen] == ["an ordinary message"]


# ---- the report counts seeds, not rows ---------------------------------------------------------------
def test_duplicate_rows_of_one_seed_count_once():
    from genrec.dashboards.analysis import aggregate_over_seeds

    def row(seed, recall, run_id):
        return {
            "decoder": "beam",
            "param_beam_width": 10,
            "seed": seed,
            "recall@10": recall,
            "run_id": run_id,
        }

    twice = pd.DataFrame([row(0, 0.50, "a"), row(0, 0.52, "b")])  # one seed swept twice into one folder
    agg = aggregate_over_seeds(twice)
    assert agg.loc[0, "n"] == 1 and agg.loc[0, "seeds"] == "0"
    assert agg.loc[0, "recall@10"] == pytest.approx(0.52) and pd.isna(agg.loc[0, "recall@10_std"])
    two_seeds = pd.DataFrame([row(0, 0.50, "a"), row(1, 0.60, "b"), row(1, 0.62, "c")])
    agg = aggregate_over_seeds(two_seeds)
    assert agg.loc[0, "n"] == 2 and agg.loc[0, "seeds"] == "0,1"
    assert agg.loc[0, "recall@10"] == pytest.approx((0.50 + 0.62) / 2)


def test_lock_file_is_released_by_a_killed_holder(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path), "exp"], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(ExperimentBusy):
        ExperimentLock(tmp_path, "exp").acquire()
    holder.kill()
    holder.wait()
    assert wait_until(lambda: _can_lock(tmp_path, "exp"), 5.0)
    assert read_rows(tmp_path, "exp") == []


def _can_lock(root: Path, name: str) -> bool:
    try:
        ExperimentLock(root, name).acquire().release()
    except ExperimentBusy:
        return False
    return True
