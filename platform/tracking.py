"""Tracking: result rows into a Parquet dataset (the source of truth for reports) and into MLflow.

Parquet layout under the results folder, one file per result row (the read side, the layout and the
experiment-name check live in genrec.workloads.results_store, which the dashboards read through too;
they are re-exported here for the platform's callers):

    RESULTS/parquet/experiment=<name>/<run_id>.parquet

Each file holds one row of `ResultRow.to_flat()` columns (schema_version included). Files are
written to a temporary name and renamed, so a reader never sees half a row, and writing the same
run id twice replaces the row instead of duplicating it (resumed sweeps rely on this).

The same rows go to MLflow (`MlflowStore`, below): an embedded sqlite store under the results
folder by default, or any tracking server named by URI. mlflow is imported only when used.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from genrec.workloads.errors import UserInputError
from genrec.workloads.io import clean_stale_temps, temp_prefix
from genrec.workloads.results import RESULT_SCHEMA_VERSION, ResultRow
from genrec.workloads.results_store import (
    DEFAULT_RESULTS_DIR,
    check_experiment_name,
    experiment_dir,
    list_experiments,
    parquet_root,
    read_results,
    read_row,
    read_rows,
    row_path,
)

# The store's read side stays importable from here for the platform's callers (sweeps, load tests).
__all__ = [
    "CREATED_TAG",
    "DEFAULT_RESULTS_DIR",
    "ExperimentBusy",
    "ExperimentLock",
    "KIND_TAG",
    "PARAM_COLUMNS",
    "RUN_ID_TAG",
    "TAG_COLUMNS",
    "MlflowStore",
    "check_experiment_name",
    "delete_rows",
    "list_experiments",
    "mlflow_name",
    "parquet_root",
    "prepare_mlflow",
    "read_results",
    "read_row",
    "read_rows",
    "row_identity",
    "row_path",
    "split_row_for_mlflow",
    "sqlite_uri",
    "write_parquet_atomic",
    "write_result_row",
]


def write_result_row(results_dir: str | os.PathLike, row: ResultRow | dict) -> Path:
    """Write one result row atomically; the same (experiment, run_id) overwrites its own file."""
    flat = row.to_flat() if isinstance(row, ResultRow) else dict(row)
    flat.setdefault("schema_version", RESULT_SCHEMA_VERSION)
    path = row_path(results_dir, str(flat["experiment"]), str(flat["run_id"]))
    return write_parquet_atomic(pa.Table.from_pylist([flat]), path)


def write_parquet_atomic(table: pa.Table, path: Path) -> Path:
    """Write a Parquet file under a temporary name and rename it: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(path)  # what a killed writer of this row left behind
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def delete_rows(results_dir: str | os.PathLike, experiment: str) -> int:
    """Remove every row of an experiment (`genrec sweep --overwrite`); returns how many."""
    files = list(experiment_dir(results_dir, experiment).glob("*.parquet"))
    for f in files:
        f.unlink()
    return len(files)


# --- one sweep per experiment --------------------------------------------------------------------
class ExperimentBusy(UserInputError):
    """Another process holds the experiment's lock (a second sweep of the same experiment)."""


class ExperimentLock:
    """An exclusive lock on one experiment of a results folder: RESULTS/locks/<experiment>.lock.

    A sweep takes it before it deletes or writes anything and keeps it until it ends, so two sweeps
    of one experiment never mix rows. `flock` is released by the kernel when the holder dies (even
    SIGKILL), so a killed sweep never leaves a stale lock behind, and `--resume` can take it at once.
    The file holds the holder's pid, host and start time for the message a second sweep prints.
    """

    def __init__(self, results_dir: str | os.PathLike, experiment: str) -> None:
        self.path = Path(results_dir).resolve() / "locks" / f"{check_experiment_name(experiment)}.lock"
        self.experiment = experiment
        self.fd: int | None = None

    def acquire(self, how_to_resume: str = "") -> ExperimentLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ExperimentBusy(self.busy_message(how_to_resume)) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        self.fd = fd
        return self

    def busy_message(self, how_to_resume: str) -> str:
        holder = self.holder()
        who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "another process"
        since = ""
        if holder.get("started_at"):
            since = f" since {time.strftime('%H:%M:%S', time.localtime(float(holder['started_at'])))}"
        resume = f", or stop it and run {how_to_resume}" if how_to_resume else ""
        return (
            f"experiment {self.experiment!r} is already being swept by {who}{since} (lock {self.path}); "
            f"wait for that sweep to finish{resume}"
        )

    def holder(self) -> dict:
        """The holder's record; it is written just after the lock is taken, so retry briefly."""
        for _ in range(20):
            try:
                text = self.path.read_text()
                if text.strip():
                    return json.loads(text)
            except (OSError, ValueError):
                pass
            time.sleep(0.025)
        return {}

    def release(self) -> None:
        if self.fd is not None:
            # the file stays: unlinking it would let a third sweep lock a new inode while a second
            # still waits on the old one
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> ExperimentLock:
        return self.acquire() if self.fd is None else self

    def __exit__(self, *exc: object) -> None:
        self.release()


# --- MLflow --------------------------------------------------------------------------------------
# The same flat row goes to MLflow, split into params (what was run), metrics (what was measured)
# and tags (where and with what it ran). Column names are kept, except that MLflow forbids '@' in
# names: 'recall@10' is logged as 'recall_at_10'. A run carries the row's run id in the tag
# `genrec.run_id`; every write first looks runs up by that tag, so writing a row again never adds a
# second run (see MlflowStore.log_row). Parquet is the source of truth: `sync_from_parquet`
# repairs MLflow from it (a driver killed between the two writes, runs left RUNNING).

KIND_TAG = "genrec.kind"  # "trial" (one per result row) or "sweep" (one per experiment)
RUN_ID_TAG = "genrec.run_id"
CREATED_TAG = "genrec.created_at"  # with trial_started_at: tells a re-evaluated row from the same one
PARAM_COLUMNS = (
    "decoder",
    "decoder_params",
    "dataset",
    "model",
    "draft",
    "split",
    "seed",
    "batch_size",
    "users",
)
TAG_COLUMNS = (
    "experiment",
    "device",
    "threads",
    "torch_version",
    "triton_version",
    "python_version",
    "git_commit",
    "host",
    "schema_version",
    "ray_trial_id",
    "trial_started_at",
)
_BAD_NAME_CHARS = re.compile(r"[^\w./\- ]")


def sqlite_uri(results_dir: str | os.PathLike) -> str:
    """The embedded MLflow store: an absolute sqlite path under the results folder."""
    return f"sqlite:///{Path(results_dir).resolve() / 'mlflow.db'}"


def mlflow_name(column: str) -> str:
    return _BAD_NAME_CHARS.sub("_", column.replace("@", "_at_"))


def split_row_for_mlflow(flat: dict) -> tuple[dict[str, str], dict[str, float], dict[str, str]]:
    """(params, metrics, tags) of one flat result row."""
    params, metrics, tags = {}, {}, {}
    for key, value in flat.items():
        if value is None or key in ("run_id", "created_at"):
            continue
        if key in PARAM_COLUMNS or key.startswith("param_"):
            params[mlflow_name(key)] = str(value)
        elif key in TAG_COLUMNS:
            tags[key] = str(value)
        elif isinstance(value, bool):
            params[mlflow_name(key)] = str(value)
        elif isinstance(value, int | float):
            metrics[mlflow_name(key)] = float(value)
        else:
            tags[key] = str(value)
    tags[RUN_ID_TAG] = str(flat["run_id"])
    tags[CREATED_TAG] = row_identity(flat)
    tags[KIND_TAG] = "trial"
    if flat.get("git_commit"):
        tags["mlflow.source.git.commit"] = str(flat["git_commit"]).removesuffix("+dirty")
    return params, metrics, tags


def row_identity(flat: dict) -> str:
    return f"{flat.get('created_at', '')}|{flat.get('trial_started_at', '')}"


def prepare_mlflow(tracking_uri: str, experiment: str, artifact_location: str | None = None) -> str:
    """Create the store (sqlite schema migrations run here, once) and the experiment, in the driver,
    before any trial starts. Returns the experiment id."""
    from mlflow.tracking import MlflowClient

    if tracking_uri.startswith("sqlite:///"):
        Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return client.create_experiment(experiment, artifact_location=artifact_location)
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    return exp.experiment_id


class MlflowStore:
    """Result rows of one experiment as MLflow runs, idempotent by `genrec.run_id`."""

    def __init__(self, tracking_uri: str, experiment: str, artifact_location: str | None = None) -> None:
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.experiment_id = prepare_mlflow(tracking_uri, experiment, artifact_location)
        self.client = MlflowClient(tracking_uri=tracking_uri)

    def runs(self, kind: str = "trial", run_id: str | None = None) -> list:
        """Active runs of this experiment of one kind (optionally one genrec run id), all pages."""
        query = f"tags.`{KIND_TAG}` = '{kind}'"
        if run_id is not None:
            query += f" and tags.`{RUN_ID_TAG}` = '{run_id}'"
        out, token = [], None
        while True:
            page = self.client.search_runs([self.experiment_id], query, max_results=1000, page_token=token)
            out += list(page)
            token = page.token
            if not token:
                return out

    def log_row(self, flat: dict, existing: list | None = None) -> str:
        """Exactly one FINISHED run per row: an identical run (same run id and created_at) is kept,
        anything else under that run id (stale, duplicate or left RUNNING by a killed driver) is
        deleted and the row logged afresh. Returns the MLflow run id."""
        from mlflow.entities import Metric, Param, RunTag

        run_id = str(flat["run_id"])
        existing = self.runs("trial", run_id) if existing is None else existing
        created = row_identity(flat)
        keep = [
            r for r in existing if r.info.status == "FINISHED" and r.data.tags.get(CREATED_TAG) == created
        ]
        for r in existing:
            if not keep or r.info.run_id != keep[0].info.run_id:
                self.client.delete_run(r.info.run_id)
        if keep:
            return keep[0].info.run_id
        params, metrics, tags = split_row_for_mlflow(flat)
        run = self.client.create_run(
            self.experiment_id, tags={KIND_TAG: "trial", RUN_ID_TAG: run_id}, run_name=run_id
        )
        ts = int(time.time() * 1000)
        self.client.log_batch(
            run.info.run_id,
            metrics=[Metric(k, v, ts, 0) for k, v in metrics.items()],
            params=[Param(k, v[:6000]) for k, v in params.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        self.client.set_terminated(run.info.run_id, "FINISHED")
        return run.info.run_id

    def sync_from_parquet(self, results_dir: str | os.PathLike) -> dict[str, int]:
        """Make MLflow hold exactly the experiment's Parquet rows: one FINISHED run per row, runs
        whose row is gone deleted. Idempotent; returns counts of runs logged and deleted."""
        by_id: dict[str, list] = {}
        for r in self.runs("trial"):
            by_id.setdefault(r.data.tags.get(RUN_ID_TAG, ""), []).append(r)
        rows = {str(row["run_id"]): row for row in read_rows(results_dir, self.experiment)}
        logged = deleted = 0
        for run_id, row in rows.items():
            runs = by_id.get(run_id, [])
            ok = [r for r in runs if r.info.status == "FINISHED"]
            if len(runs) == 1 and ok and ok[0].data.tags.get(CREATED_TAG) == row_identity(row):
                continue
            self.log_row(row, existing=runs)
            logged += 1
        for run_id, runs in by_id.items():
            if run_id not in rows:
                for r in runs:
                    self.client.delete_run(r.info.run_id)
                    deleted += 1
        return {"logged": logged, "deleted": deleted}

    def delete_all(self) -> int:
        """Delete every run of the experiment (trials and sweep summaries), for --overwrite."""
        runs = self.runs("trial") + self.runs("sweep")
        for r in runs:
            self.client.delete_run(r.info.run_id)
        return len(runs)

    def log_sweep(
        self,
        metrics: dict[str, float],
        params: dict[str, object],
        artifacts: list[Path],
        tags: dict[str, str] | None = None,
    ) -> str:
        """One experiment-level run (kind 'sweep') holding the sweep's summary and the report;
        an earlier one is replaced."""
        for r in self.runs("sweep"):
            self.client.delete_run(r.info.run_id)
        run = self.client.create_run(
            self.experiment_id,
            tags={KIND_TAG: "sweep", **(tags or {})},
            run_name=f"{self.experiment}-sweep",
        )
        rid = run.info.run_id
        for k, v in params.items():
            self.client.log_param(rid, mlflow_name(k), str(v)[:6000])
        for k, v in metrics.items():
            self.client.log_metric(rid, mlflow_name(k), float(v))
        for path in artifacts:
            if Path(path).is_file():
                self.client.log_artifact(rid, str(path))
        self.client.set_terminated(rid, "FINISHED")
        return rid
