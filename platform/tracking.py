"""Tracking: result rows into a Parquet dataset (the source of truth for reports) and into MLflow.

Parquet layout under the results folder, one file per result row:

    RESULTS/parquet/experiment=<name>/<run_id>.parquet

Each file holds one row of `ResultRow.to_flat()` columns (schema_version included). Files are
written to a temporary name and renamed, so a reader never sees half a row, and writing the same
run id twice replaces the row instead of duplicating it (resumed sweeps rely on this).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from genrec.workloads.errors import UserInputError
from genrec.workloads.results import RESULT_SCHEMA_VERSION, ResultRow

DEFAULT_RESULTS_DIR = "runs/results"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def check_experiment_name(name: str) -> str:
    if not _NAME_RE.match(name or ""):
        raise UserInputError(
            f"experiment name {name!r}: use letters, digits, '_', '-', '.' (starting with a letter or digit)"
        )
    return name


def parquet_root(results_dir: str | os.PathLike) -> Path:
    return Path(results_dir).resolve() / "parquet"


def row_path(results_dir: str | os.PathLike, experiment: str, run_id: str) -> Path:
    return parquet_root(results_dir) / f"experiment={check_experiment_name(experiment)}" / f"{run_id}.parquet"


def write_result_row(results_dir: str | os.PathLike, row: ResultRow | dict) -> Path:
    """Write one result row atomically; the same (experiment, run_id) overwrites its own file."""
    flat = row.to_flat() if isinstance(row, ResultRow) else dict(row)
    flat.setdefault("schema_version", RESULT_SCHEMA_VERSION)
    path = row_path(results_dir, str(flat["experiment"]), str(flat["run_id"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([flat])
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_result_rows(results_dir: str | os.PathLike, rows: Iterable[ResultRow | dict]) -> list[Path]:
    return [write_result_row(results_dir, r) for r in rows]


def list_experiments(results_dir: str | os.PathLike) -> list[str]:
    root = parquet_root(results_dir)
    if not root.is_dir():
        return []
    return sorted(p.name.split("=", 1)[1] for p in root.glob("experiment=*") if p.is_dir())


def read_results(results_dir: str | os.PathLike, experiment: str | None = None) -> pd.DataFrame:
    """All result rows (optionally of one experiment) as a DataFrame, oldest first.

    Rows from different decoders have different parameter columns; missing ones are NaN.
    """
    root = parquet_root(results_dir)
    pattern = (
        f"experiment={check_experiment_name(experiment)}/*.parquet"
        if experiment
        else "experiment=*/*.parquet"
    )
    files = sorted(root.glob(pattern))
    if not files:
        return pd.DataFrame()
    frames = [pq.read_table(f).to_pandas() for f in files]
    df = pd.concat(frames, ignore_index=True, sort=False)
    newer = df["schema_version"] > RESULT_SCHEMA_VERSION
    if newer.any():
        found = int(df.loc[newer, "schema_version"].max())
        raise UserInputError(
            f"{root}: rows with schema_version {found} are newer than this genrec reads "
            f"({RESULT_SCHEMA_VERSION}); upgrade genrec-lab"
        )
    return df.sort_values("created_at", kind="stable").reset_index(drop=True)
