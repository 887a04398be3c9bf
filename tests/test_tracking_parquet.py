"""Parquet result store: atomic one-file-per-row writes, idempotent by run id, schema checks."""

import pytest

from genrec.platform.tracking import write_result_row
from genrec.workloads.errors import UserInputError
from genrec.workloads.results import Environment, ResultRow
from genrec.workloads.results_store import list_experiments, read_results

ENV = Environment("cpu:x", 2, "2.13", "none", "3.11", "abc", "host")


def row(exp, run_id, **quality):
    return ResultRow(
        decoder="beam",
        decoder_params={"beam_width": 4},
        dataset="d",
        model="m",
        split="test",
        env=ENV,
        quality=quality,
        experiment=exp,
        run_id=run_id,
    )


def test_rows_round_trip_and_rewrites_do_not_duplicate(tmp_path):
    write_result_row(tmp_path, row("a", "r1", **{"hr@10": 0.1}))
    write_result_row(tmp_path, row("a", "r2", **{"hr@10": 0.2}))
    write_result_row(tmp_path, row("b", "r3", **{"hr@10": 0.3}))
    write_result_row(tmp_path, row("a", "r1", **{"hr@10": 0.15}))  # a resumed trial writes again
    df = read_results(tmp_path, "a")
    assert sorted(df["run_id"]) == ["r1", "r2"]
    assert df.set_index("run_id").loc["r1", "hr@10"] == pytest.approx(0.15)
    assert df["param_beam_width"].tolist() == [4, 4]
    assert len(read_results(tmp_path)) == 3 and list_experiments(tmp_path) == ["a", "b"]
    assert not list(tmp_path.rglob("*.tmp"))


def test_empty_and_bad_names(tmp_path):
    assert read_results(tmp_path).empty and list_experiments(tmp_path) == []
    with pytest.raises(UserInputError, match="experiment name"):
        write_result_row(tmp_path, row("../evil", "r"))


def test_newer_schema_is_refused(tmp_path):
    flat = row("a", "r1").to_flat()
    flat["schema_version"] = 99
    write_result_row(tmp_path, flat)
    with pytest.raises(UserInputError, match="newer"):
        read_results(tmp_path)


# ---- exactly one FINISHED MLflow run per row, whatever was there before -------------------------------
@pytest.fixture(scope="module")
def mlflow_dir(tmp_path_factory):
    pytest.importorskip("mlflow")
    return tmp_path_factory.mktemp(
        "mlflow"
    )  # one sqlite store (its migrations take seconds), one experiment a test


def _store(root, name):
    from genrec.platform.mlflow_store import MlflowStore, sqlite_uri

    return MlflowStore(sqlite_uri(root), name)


def _flat(exp, run_id, recall, created="2026-01-01T00:00:00+00:00", started=1.0):
    flat = row(exp, run_id, **{"recall@10": recall}).to_flat()
    flat["created_at"], flat["trial_started_at"] = created, started
    return flat


def _raw_run(store, flat, status):
    """A run as a killed or a second driver leaves it: the row's tags and metrics, any status."""
    from mlflow.entities import Metric, RunTag

    from genrec.platform.mlflow_rows import split_row_for_mlflow

    _, metrics, tags = split_row_for_mlflow(flat)
    run = store.client.create_run(store.experiment_id, tags=tags)
    store.client.log_batch(
        run.info.run_id,
        metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()],
        tags=[RunTag(k, v) for k, v in tags.items()],
    )
    if status != "RUNNING":
        store.client.set_terminated(run.info.run_id, status)


def _only_run(store, run_id):
    runs = store.runs("trial", run_id)
    assert len(runs) == 1, [(r.info.status, r.data.tags) for r in runs]
    return runs[0]


@pytest.mark.parametrize(
    "left_behind", ["stale-finished", "running", "running-same-row", "duplicates", "failed"]
)
def test_relogging_a_row_leaves_one_finished_run_with_the_new_metrics(mlflow_dir, left_behind):
    exp = f"relog-{left_behind}"
    store = _store(mlflow_dir, exp)
    old, new = _flat(exp, "r1", 0.1), _flat(exp, "r1", 0.9, created="2026-01-02T00:00:00+00:00", started=2.0)
    if left_behind == "stale-finished":  # the trial was evaluated again after a resume
        _raw_run(store, old, "FINISHED")
    elif left_behind == "running":  # a driver killed between creating and finishing the run
        _raw_run(store, old, "RUNNING")
    elif left_behind == "running-same-row":  # ... of this very row
        _raw_run(store, old, "RUNNING")
        new = old
    elif left_behind == "duplicates":  # two drivers logged the same row
        _raw_run(store, new, "FINISHED")
        _raw_run(store, new, "FINISHED")
    else:
        _raw_run(store, new, "FAILED")
    store.log_row(new)
    run = _only_run(store, "r1")
    assert run.info.status == "FINISHED"
    assert run.data.metrics["recall_at_10"] == pytest.approx(new["recall@10"])


def test_sync_from_parquet_repairs_a_running_run_and_drops_orphans(mlflow_dir, tmp_path):
    store = _store(mlflow_dir, "sync")
    flat = _flat("sync", "r1", 0.4)
    write_result_row(tmp_path, flat)
    _raw_run(store, flat, "RUNNING")
    store.log_row(_flat("sync", "gone", 0.3))  # its Parquet row was deleted
    assert store.sync_from_parquet(tmp_path) == {"logged": 1, "deleted": 1}
    run = _only_run(store, "r1")
    assert run.info.status == "FINISHED" and run.data.metrics["recall_at_10"] == pytest.approx(0.4)
    assert store.runs("trial", "gone") == []
    assert store.sync_from_parquet(tmp_path) == {"logged": 0, "deleted": 0}  # idempotent


# ---- a row file does not depend on the process that wrote it ------------------------------------------
WRITE_ROW = """
import json, sys
from genrec.platform.tracking import write_result_row
print(write_result_row(sys.argv[1], json.loads(sys.argv[2])).relative_to(sys.argv[1]))
"""


def test_row_file_name_and_bytes_are_the_same_from_any_process(tmp_path):
    import json
    import subprocess
    import sys

    flat = _flat("exp", "exp-trial_0001", 0.5)
    here = write_result_row(tmp_path / "here", flat)
    written = []
    for i in range(2):
        out = subprocess.run(
            [sys.executable, "-c", WRITE_ROW, str(tmp_path / f"p{i}"), json.dumps(flat)],
            capture_output=True,
            text=True,
            check=True,
        )
        written.append(tmp_path / f"p{i}" / out.stdout.strip())
    assert here.relative_to(tmp_path / "here") == written[0].relative_to(tmp_path / "p0")
    assert {p.name for p in written} == {"exp-trial_0001.parquet"}
    assert here.read_bytes() == written[0].read_bytes() == written[1].read_bytes()
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()]  # no temporary file left
