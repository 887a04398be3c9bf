"""Ray Tune sweeps end to end on one local Ray instance (num_cpus=2) shared by the session:
rows in Parquet and MLflow exactly once per trial, `genrec runs` equal to the Parquet rows, a driver
killed mid-sweep and resumed, and ray_cluster.yaml checked with Ray's own schema validation."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_cli
from experiment_files import cpu_sweep, write_experiment

from genrec.platform.mlflow_rows import KIND_TAG, RUN_ID_TAG
from genrec.workloads.results_store import read_results, read_rows

ray = pytest.importorskip("ray")
mlflow = pytest.importorskip("mlflow")


def experiment(tmp_path: Path, synth_dir, tiny_model_dir, name: str, widths: list[int], users: int) -> Path:
    raw = cpu_sweep(name, synth_dir, tiny_model_dir, tmp_path / "results", k=10, widths=widths)
    raw["eval"] = {"ks": [5, 10], "max_users": users, "batch_size": 50, "threads": 1}
    return write_experiment(tmp_path / f"{name}.yaml", raw)


def trial_runs(results_dir: Path, name: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{results_dir / 'mlflow.db'}")
    exp = client.get_experiment_by_name(name)
    return client.search_runs([exp.experiment_id], f"tags.`{KIND_TAG}` = 'trial'")


@pytest.fixture(scope="module")
def small_sweep(ray_session, synth_dir, tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    path = experiment(tmp, synth_dir, tiny_model_dir, "bw_small", [10, 20, 30], users=60)
    assert run_cli(["sweep", str(path), "--quiet"]) == 0
    return tmp / "results", path


def test_sweep_writes_one_row_and_one_mlflow_run_per_trial(small_sweep):
    results, _ = small_sweep
    df = read_results(results, "bw_small")
    assert sorted(df["param_beam_width"]) == [10, 20, 30]
    assert df["run_id"].is_unique and all(df["run_id"].str.startswith("bw_small-"))
    assert (df["users"] == 60).all() and (df["trial_wall_s"] > 0).all()
    assert (df["experiment"] == "bw_small").all() and (df["threads"] == 1).all()
    from genrec.workloads.per_user import read_per_user

    for run_id in df["run_id"]:  # every trial's per-user outcomes beside its row, on the same users
        users = read_per_user(results, "bw_small", run_id)
        assert users is not None and len(users) == 60

    runs = trial_runs(results, "bw_small")
    assert sorted(r.data.tags[RUN_ID_TAG] for r in runs) == sorted(df["run_id"])
    by_id = df.set_index("run_id")
    for r in runs:
        row = by_id.loc[r.data.tags[RUN_ID_TAG]]
        assert r.info.status == "FINISHED"
        assert r.data.params["param_beam_width"] == str(row["param_beam_width"])
        assert r.data.params["decoder"] == "beam" and r.data.params["seed"] == "0"
        assert r.data.metrics["recall_at_10"] == pytest.approx(row["recall@10"])
        for tag in ("git_commit", "device", "torch_version", "python_version", "host", "ray_trial_id"):
            assert r.data.tags[tag] == str(row[tag])


def test_sweep_summary_run_and_refusal_to_mix_sweeps(small_sweep, capsys):
    from mlflow.tracking import MlflowClient

    results, path = small_sweep
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bw_small")
    assert exp.artifact_location == (results / "mlflow-artifacts").as_uri()
    (sweep_run,) = client.search_runs([exp.experiment_id], f"tags.`{KIND_TAG}` = 'sweep'")
    assert sweep_run.data.metrics["trials_done"] == 3 and sweep_run.data.metrics["own_time_ratio"] > 0
    assert sweep_run.info.status == "FINISHED"
    # trials nested under the sweep's run, named by their configuration, with their own times
    rows = {r["run_id"]: r for r in read_rows(results, "bw_small")}
    runs = trial_runs(results, "bw_small")
    assert {r.info.run_name for r in runs} == {"beam_width=10", "beam_width=20", "beam_width=30"}
    for r in runs:
        row = rows[r.data.tags[RUN_ID_TAG]]
        assert r.data.tags["mlflow.parentRunId"] == sweep_run.info.run_id
        assert r.info.start_time == round(row["trial_started_at"] * 1000)
        assert r.info.end_time - r.info.start_time == pytest.approx(row["trial_wall_s"] * 1000, abs=1)
    best = {r.info.run_id: r for r in runs}[sweep_run.data.tags["best.mlflow_run_id"]]
    assert sweep_run.data.tags["best.run_name"] == best.info.run_name
    # the run's description opens with the report's decision, and its best trial is the one deployed
    decision = sweep_run.data.tags["genrec.decision"]
    assert sweep_run.data.tags["mlflow.note.content"].startswith(decision) and decision.startswith("Within ")
    assert f"deploy beam({best.info.run_name})" in decision, decision
    assert [a.path for a in client.list_artifacts(sweep_run.info.run_id)] == [path.name]
    before = sorted(read_results(results, "bw_small")["run_id"])
    assert run_cli(["sweep", str(path)]) == 2  # a second fresh sweep would mix with the first
    assert "--resume" in capsys.readouterr().err
    assert sorted(read_results(results, "bw_small")["run_id"]) == before


def test_runs_command_shows_the_parquet_rows(small_sweep, capsys):
    results, _ = small_sweep
    df = read_results(results, "bw_small")
    capsys.readouterr()
    argv = ["runs", "--experiment", "bw_small", "--results-dir", str(results)]
    assert run_cli([*argv, "--format", "json", "--columns", "all"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert shown == json.loads(df.to_json(orient="records"))
    assert run_cli(argv) == 0
    table = capsys.readouterr().out
    assert all(run_id in table for run_id in df["run_id"]) and "recall@10" in table
    header = table.splitlines()[0].split()
    assert [c for c in header if c.startswith("param_")] == ["param_beam_width"]  # only what varies
    assert run_cli([*argv, "--all-params"]) == 0
    wide = capsys.readouterr().out.splitlines()[0].split()
    assert len([c for c in wide if c.startswith("param_")]) > 1
    assert run_cli([*argv, "--where", "param_beam_width >= 20", "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 1 + 2
    assert run_cli([*argv, "--where", "`recall@10` >", "--format", "csv"]) == 2
    assert "--where" in capsys.readouterr().err
    assert run_cli(["runs", "--experiment", "nope", "--results-dir", str(results)]) == 2


@pytest.mark.slow
def test_killed_sweep_resumes_with_every_trial_exactly_once(ray_session, synth_dir, tiny_model_dir, tmp_path):
    """Kill the driver (SIGKILL) once the first rows exist, resume, count rows and MLflow runs."""
    from genrec.platform.experiment_loading import load_experiment
    from genrec.platform.sweep import run_sweep

    widths = [10, 20, 30, 40, 50, 60]
    path = experiment(tmp_path, synth_dir, tiny_model_dir, "bw_resume", widths, users=300)
    results = tmp_path / "results"
    rows_dir = results / "parquet" / "experiment=bw_resume"
    code = "import sys\nfrom genrec.platform.cli import main\nmain(sys.argv[1:])\n"
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    with open(tmp_path / "driver.log", "w") as log:  # a second driver on the session's Ray
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "sweep", str(path)], env=env, cwd=tmp_path, stdout=log, stderr=log
        )
        deadline = time.time() + 120
        while not list(rows_dir.glob("*.parquet")) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = {r["run_id"]: (r["created_at"], r["trial_started_at"]) for r in read_rows(results, "bw_resume")}
    assert 1 <= len(before) < len(widths), (tmp_path / "driver.log").read_text()[-3000:]

    summary = run_sweep(load_experiment(path), resume=True, progress=False)
    assert summary.resumed and summary.trials_failed == 0
    assert summary.trials_done == len(widths) == summary.trials_ran + summary.trials_reused
    rows = read_rows(results, "bw_resume")
    assert len(rows) == len(widths) and sorted(r["param_beam_width"] for r in rows) == widths
    for r in rows:  # finished trials kept as they were: not evaluated again
        if r["run_id"] in before:
            assert (r["created_at"], r["trial_started_at"]) == before[r["run_id"]]
    runs = trial_runs(results, "bw_resume")
    assert sorted(r.data.tags[RUN_ID_TAG] for r in runs) == sorted(r["run_id"] for r in rows)
    assert all(r.info.status == "FINISHED" for r in runs)
    # one sweep run, opened by the killed driver and reused by the resumed one, holds every trial
    assert len({r.data.tags["mlflow.parentRunId"] for r in runs}) == 1


class FakeTuner:
    """Stands in for tune.Tuner (no Ray): `fit` is interrupted as `interrupt` says, or returns no results."""

    interrupt: str | None = None

    def __init__(self, *args, **kwargs) -> None:
        pass

    @classmethod
    def restore(cls, *args, **kwargs) -> FakeTuner:
        return cls()

    def fit(self) -> list:
        if self.interrupt == "tune":  # Tune's first SIGINT: it logs, saves its state and returns
            logging.getLogger("ray.tune.tune").warning("Stop signal received (e.g. via SIGINT/Ctrl+C)")
        elif self.interrupt == "keyboard":  # a second Ctrl-C, or one outside Tune's handler
            raise KeyboardInterrupt
        return []


@pytest.mark.parametrize("interrupt", ["tune", "keyboard"])
def test_ctrl_c_ends_the_sweeps_mlflow_run_killed_and_resume_finishes_it(interrupt, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from genrec.platform import sweep
    from genrec.platform.experiment import ExperimentConfig
    from genrec.platform.sweep.interrupt import SweepInterrupted

    raw = cpu_sweep("ctrl_c", tmp_path, tmp_path, tmp_path / "results", k=10, widths=[10, 20])
    cfg = ExperimentConfig.model_validate(raw)
    for name in ("ensure_model", "preflight", "init_ray"):
        monkeypatch.setattr(sweep, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(sweep, "plan_storage", lambda cfg, resume, overwrite: resume)
    monkeypatch.setattr(sweep.ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(sweep.tune, "Tuner", FakeTuner)
    monkeypatch.setattr(FakeTuner, "interrupt", interrupt)

    def sweep_runs() -> list:
        client = MlflowClient(cfg.mlflow_uri)
        exp = client.get_experiment_by_name(cfg.name)
        return client.search_runs([exp.experiment_id], f"tags.`{KIND_TAG}` = 'sweep'")

    with pytest.raises((SweepInterrupted, KeyboardInterrupt)):
        sweep.run_sweep(cfg, progress=False)
    (killed,) = sweep_runs()
    assert killed.info.status == "KILLED"

    monkeypatch.setattr(FakeTuner, "interrupt", None)
    assert sweep.run_sweep(cfg, resume=True, progress=False).resumed
    (finished,) = sweep_runs()
    assert finished.info.run_id == killed.info.run_id and finished.info.status == "FINISHED"


def test_ray_cluster_yaml_passes_rays_schema_check():
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((REPO / "ray_cluster.yaml").read_text())
    config = prepare_config(raw)  # what `ray up` does before contacting the cloud
    validate_config(config)
    nodes = config["available_node_types"]
    assert config["head_node_type"] in nodes
    assert any(n["resources"].get("GPU", 0) >= 1 for n in nodes.values())
    setup = " ".join(config["head_setup_commands"] + config["worker_setup_commands"])
    assert "pip install" in setup and "genrec-lab" in setup
    raw["available_node_types"]["gpu_worker"]["bogus"] = 1
    with pytest.raises(Exception, match="bogus"):
        validate_config(prepare_config(raw))


def test_tune_state_saved_before_the_sweep_package_still_unpickles():
    """tuner.pkl from before platform/sweep/ became a package names genrec.platform.sweep_callbacks."""
    import pickle

    from genrec.platform.sweep.callbacks import ParquetRowCallback

    old_reference = b"cgenrec.platform.sweep_callbacks\nParquetRowCallback\n."
    assert pickle.loads(old_reference) is ParquetRowCallback
