"""The read side of the Parquet result store: where rows live and how they are read back.

One module both the reports (genrec.dashboards) and the platform (sweeps resuming, `genrec runs`,
MLflow repair) read through. Layout under the results folder, one file per result row:

    RESULTS/parquet/experiment=<name>/<run_id>.parquet

Each file holds one row of `ResultRow.to_flat()` columns (schema_version included). The writer
(`genrec.platform.tracking.write_result_row`) writes to a temporary name and renames, so a reader
never sees half a row. It lives in workloads (pandas and pyarrow only) so that the dashboards need not
import the platform, and GPU machines without Ray can read results too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from genrec.workloads.errors import UserInputError
from genrec.workloads.results import RESULT_SCHEMA_VERSION

DEFAULT_RESULTS_DIR = "runs/results"
MAX_NAME_CHARS = 100  # a folder name (experiment=NAME) and an MLflow experiment name
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def check_experiment_name(name: str) -> str:
    if len(name or "") > MAX_NAME_CHARS:
        raise UserInputError(
            f"experiment name {name[:40]!r}... has {len(name)} characters; use at most {MAX_NAME_CHARS}"
        )
    if not _NAME_RE.match(name or ""):
        raise UserInputError(
            f"experiment name {name!r}: use letters, digits, '_', '-', '.' (starting with a letter or digit)"
        )
    return name


def parquet_root(results_dir: str | os.PathLike) -> Path:
    return Path(results_dir).resolve() / "parquet"


def experiment_dir(results_dir: str | os.PathLike, experiment: str) -> Path:
    return parquet_root(results_dir) / f"experiment={check_experiment_name(experiment)}"


def row_path(results_dir: str | os.PathLike, experiment: str, run_id: str) -> Path:
    return experiment_dir(results_dir, experiment) / f"{run_id}.parquet"


def list_experiments(results_dir: str | os.PathLike) -> list[str]:
    root = parquet_root(results_dir)
    if not root.is_dir():
        return []
    return sorted(p.name.split("=", 1)[1] for p in root.glob("experiment=*") if p.is_dir())


def row_files(results_dir: str | os.PathLike, experiment: str | None = None) -> list[Path]:
    """The row files of one experiment (None: of all), in path order."""
    if experiment is not None:
        return sorted(experiment_dir(results_dir, experiment).glob("*.parquet"))
    return sorted(parquet_root(results_dir).glob("experiment=*/*.parquet"))


def unified_schema(files: list[Path]) -> pa.Schema | None:
    """One schema over row files whose columns differ (each decoder or benchmark has its own `param_*`
    columns): ints widen to doubles and all-null columns take the other files' type. None when a column
    holds types Arrow cannot merge (e.g. a number in one row, a string in another)."""
    try:
        return pa.unify_schemas([pq.read_schema(f) for f in files], promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        return None


def read_frame(files: list[Path]) -> pd.DataFrame:
    """The rows of `files` as one DataFrame, in file order; a column a file lacks is missing there."""
    schema = unified_schema(files)
    if schema is None:  # mixed types in a column: pandas keeps it as an object column
        return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True, sort=False)
    return ds.dataset([str(f) for f in files], schema=schema, format="parquet").to_table().to_pandas()


def check_schema_version(df: pd.DataFrame, where: Path) -> None:
    newer = df["schema_version"] > RESULT_SCHEMA_VERSION
    if newer.any():
        found = int(df.loc[newer, "schema_version"].max())
        raise UserInputError(
            f"{where}: rows with schema_version {found} are newer than this genrec reads "
            f"({RESULT_SCHEMA_VERSION}); upgrade genrec-lab"
        )


def read_results(results_dir: str | os.PathLike, experiment: str | None = None) -> pd.DataFrame:
    """All result rows (optionally of one experiment) as a DataFrame, oldest first.

    Rows from different decoders have different parameter columns; missing ones are NaN/None.
    """
    files = row_files(results_dir, experiment or None)
    if not files:
        return pd.DataFrame()
    df = read_frame(files)
    check_schema_version(df, parquet_root(results_dir))
    return df.sort_values("created_at", kind="stable").reset_index(drop=True)


def read_rows(results_dir: str | os.PathLike, experiment: str) -> list[dict]:
    """The stored rows of one experiment exactly as written (one dict per file, no NaN filling)."""
    return [pq.read_table(f).to_pylist()[0] for f in row_files(results_dir, experiment)]


def read_row(results_dir: str | os.PathLike, experiment: str, run_id: str) -> dict | None:
    """One stored row, or None when that run id has no row yet."""
    path = row_path(results_dir, experiment, run_id)
    return pq.read_table(path).to_pylist()[0] if path.is_file() else None
