"""Fault suite, faults against `genrec sweep`: two sweeps of one experiment started together (both with
--overwrite, as in the issue): the second exits 2 naming the first one's pid and touches nothing; the
first writes every row exactly once (Parquet and MLflow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from experiment_files import cpu_sweep, write_experiment
from fault_helpers import wait_until

from genrec.platform.mlflow_rows import KIND_TAG
from genrec.workloads.results_store import read_rows

ray = pytest.importorskip("ray")
pytest.importorskip("mlflow")

CLI = "from genrec.platform.cli import main; main()"


def experiment(tmp_path: Path, model: Path, data: Path) -> Path:
    raw = cpu_sweep("twice", data, model, tmp_path / "results", k=5, widths=[5, 10])
    raw |= {"metric": "recall@5", "eval": {"ks": [5], "max_users": 20, "batch_size": 20, "threads": 1}}
    return write_experiment(tmp_path / "twice.yaml", raw)


def holder_pid(lock: Path) -> int | None:
    try:
        return json.loads(lock.read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


@pytest.mark.slow
def test_two_concurrent_sweeps_one_exits_2_and_rows_are_written_once(
    ray_session, tiny_model_dir, synth_dir, tmp_path
):
    path = experiment(tmp_path, tiny_model_dir, synth_dir)
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}  # both on the session's Ray
    argv = [sys.executable, "-c", CLI, "sweep", str(path), "--overwrite", "--quiet"]
    lock = tmp_path / "results" / "locks" / "twice.lock"
    first = subprocess.Popen(
        argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert wait_until(lambda: holder_pid(lock) == first.pid, 30), (
            first.stdout.read() if first.poll() else ""
        )
        t0 = time.monotonic()
        second = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"pid {first.pid}" in second.stderr and "--resume" in second.stderr
        assert time.monotonic() - t0 < 30
        out, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, out[-3000:]
    assert "2/2 trials done, 0 failed" in out
    rows = read_rows(tmp_path / "results", "twice")
    assert sorted(r["param_beam_width"] for r in rows) == [5, 10] and len({r["run_id"] for r in rows}) == 2

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("twice")
    runs = client.search_runs([exp.experiment_id], f"tags.`{KIND_TAG}` = 'trial'")
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
