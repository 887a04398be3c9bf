"""Per-user outcomes of one evaluated trial, stored beside its result row so that two configurations
evaluated on the same users compare PAIRED (a paired test on per-user hits separates differences that
unpaired intervals over 2000 users cannot).

Layout under the results folder (a sibling of the row store, so row readers never glob these files):

    RESULTS/per_user/experiment=<name>/<run_id>.parquet

One row per evaluated user: `user_id`, `target_ranks` (the 1-based rank of each of the user's targets
in the returned list, 0 = not returned: a miss), `batch` (which decode call held the user) and
`batch_latency_ms` (that call's time in the first timed pass: per-user latency is the latency of the
batch the user was decoded in). Any HR/Recall/NDCG@K is recomputed exactly from the ranks
(`metric_from_ranks`, checked against `metrics.user_metrics`). Written atomically (temp + rename).
Only numpy, pandas and pyarrow: GPU machines write these too.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from genrec.workloads.io import write_parquet_atomic
from genrec.workloads.results_store import check_experiment_name

PER_USER_DIR = "per_user"
COLUMNS = ("user_id", "target_ranks", "batch", "batch_latency_ms")


def per_user_path(results_dir: str | os.PathLike, experiment: str, run_id: str) -> Path:
    root = Path(results_dir).resolve() / PER_USER_DIR
    return root / f"experiment={check_experiment_name(experiment)}" / f"{run_id}.parquet"


def target_ranks(ranked: Sequence[int], targets: Sequence[int]) -> list[int]:
    """1-based rank of each target in `ranked` at its first occurrence (0 = missing); a repeated id
    counts once, at its best rank, and a repeated target is one target, exactly as
    `metrics.user_metrics` counts them."""
    first: dict[int, int] = {}
    for i, item in enumerate(ranked):
        first.setdefault(int(item), i + 1)
    unique = dict.fromkeys(int(t) for t in targets)
    return [first.get(t, 0) if t >= 0 else 0 for t in unique]


def metric_from_ranks(ranks: Sequence[Sequence[int]], metric: str) -> np.ndarray:
    """Per-user 'hr@K', 'recall@K' or 'ndcg@K' from stored target ranks."""
    name, k_text = metric.split("@")
    k = int(k_text)
    out = np.empty(len(ranks), dtype=np.float64)
    for u, rs in enumerate(ranks):
        rs = [int(r) for r in rs]
        hits = sorted({r for r in rs if 1 <= r <= k})
        if name == "hr":
            out[u] = float(bool(hits))
        elif name == "recall":
            out[u] = len(hits) / len(rs)
        elif name == "ndcg":
            idcg = sum(1.0 / math.log2(i + 2) for i in range(min(len(rs), k)))
            out[u] = sum(1.0 / math.log2(r + 1) for r in hits) / idcg
        else:
            raise ValueError(f"per-user metric {metric!r}: use hr@K, recall@K or ndcg@K")
    return out


def per_user_table(
    user_ids: Sequence[int],
    ranked: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    batch_size: int,
    batch_latency_ms: Sequence[float],
) -> pa.Table:
    """The per-user table of one evaluation (users in decode order, `batch_size` per decode call)."""
    batches = [i // batch_size for i in range(len(user_ids))]
    latency = [float(batch_latency_ms[b]) if b < len(batch_latency_ms) else None for b in batches]
    return pa.table(
        {
            "user_id": pa.array([int(u) for u in user_ids], pa.int64()),
            "target_ranks": pa.array(
                [target_ranks(r, t) for r, t in zip(ranked, targets)], pa.list_(pa.int32())
            ),
            "batch": pa.array(batches, pa.int32()),
            "batch_latency_ms": pa.array(latency, pa.float64()),
        }
    )


def write_per_user(results_dir: str | os.PathLike, experiment: str, run_id: str, table: pa.Table) -> Path:
    return write_parquet_atomic(table, per_user_path(results_dir, experiment, run_id))


def read_per_user(results_dir: str | os.PathLike, experiment: str, run_id: str) -> pd.DataFrame | None:
    """One trial's per-user outcomes, or None when it has none (rows written before they existed)."""
    path = per_user_path(results_dir, experiment, run_id)
    if not path.is_file():
        return None
    return pq.read_table(path).to_pandas()


def delete_per_user(results_dir: str | os.PathLike, experiment: str) -> int:
    """Remove every per-user file of an experiment (with its rows, `genrec sweep --overwrite`)."""
    folder = per_user_path(results_dir, experiment, "x").parent
    files = list(folder.glob("*.parquet")) if folder.is_dir() else []
    for f in files:
        f.unlink()
    return len(files)
