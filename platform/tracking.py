"""Tracking: result rows into a Parquet dataset (the source of truth for reports), one sweep at a time.

Parquet layout under the results folder, one file per result row (the read side, the layout and the
experiment-name check live in genrec.workloads.results_store, which the dashboards read through too):

    RESULTS/parquet/experiment=<name>/<run_id>.parquet

Each file holds one row of `ResultRow.to_flat()` columns (schema_version included). Files are
written to a temporary name and renamed, so a reader never sees half a row, and writing the same
run id twice replaces the row instead of duplicating it (resumed sweeps rely on this).

The same rows go to MLflow: genrec.platform.mlflow_store (one run per row, nested under its
sweep's run and named by its configuration; docs/mlflow.md maps columns to params, metrics, tags).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

import pyarrow as pa

from genrec.workloads.errors import UserInputError
from genrec.workloads.io import write_parquet_atomic
from genrec.workloads.results import RESULT_SCHEMA_VERSION, ResultRow
from genrec.workloads.results_store import (
    check_experiment_name,
    experiment_dir,
    row_path,
)

__all__ = ["ExperimentBusy", "ExperimentLock", "delete_rows", "write_result_row"]


def write_result_row(results_dir: str | os.PathLike, row: ResultRow | dict) -> Path:
    """Write one result row atomically; the same (experiment, run_id) overwrites its own file."""
    flat = row.to_flat() if isinstance(row, ResultRow) else dict(row)
    flat.setdefault("schema_version", RESULT_SCHEMA_VERSION)
    path = row_path(results_dir, str(flat["experiment"]), str(flat["run_id"]))
    return write_parquet_atomic(pa.Table.from_pylist([flat]), path)


def delete_rows(results_dir: str | os.PathLike, experiment: str) -> int:
    """Remove every row of an experiment (`genrec sweep --overwrite`); returns how many."""
    from genrec.workloads.per_user import delete_per_user

    files = list(experiment_dir(results_dir, experiment).glob("*.parquet"))
    for f in files:
        f.unlink()
    delete_per_user(results_dir, experiment)  # the rows' per-user outcomes go with them
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
