"""Ranking metrics for next-item recommendation with one or more targets per user.

For a ranked list r (best first, item ids, -1 for an invalid SID) and a target set T:
    HR@K     = 1 if any of the first K items is in T
    Recall@K = |first K ∩ T| / |T|
    NDCG@K   = sum over hits at rank i (0-based) of 1/log2(i+2), divided by the ideal DCG,
               sum_{i < min(|T|, K)} 1/log2(i+2)
Each returns the mean over users. Duplicates in r count once (at their best rank).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _dedup(ranked: Sequence[int]) -> list[int]:
    seen, out = set(), []
    for x in ranked:
        if x not in seen:
            seen.add(x)
            out.append(x)
        else:
            out.append(-2)  # keep ranks aligned; a repeat never hits again
    return out


def user_metrics(ranked: Sequence[int], targets: Sequence[int], k: int) -> tuple[float, float, float]:
    """(hit, recall, ndcg) at k for one user."""
    t = set(targets)
    if not t:
        raise ValueError("a user without targets cannot be evaluated")
    top = _dedup(list(ranked)[:k])
    hits = [i for i, x in enumerate(top) if x in t]
    dcg = sum(1.0 / math.log2(i + 2) for i in hits)
    idcg = sum(1.0 / math.log2(i + 2) for i in range(min(len(t), k)))
    return float(bool(hits)), len(hits) / len(t), dcg / idcg


def ranking_metrics(
    ranked: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], ks: Sequence[int]
) -> dict[str, float]:
    """Mean HR@K, Recall@K and NDCG@K over users, keys like 'hr@10'."""
    if len(ranked) != len(targets):
        raise ValueError(f"{len(ranked)} ranked lists for {len(targets)} target lists")
    out: dict[str, float] = {}
    for k in ks:
        rows = np.array([user_metrics(r, t, k) for r, t in zip(ranked, targets)]).reshape(-1, 3)
        mean = rows.mean(0) if len(rows) else np.zeros(3)
        out[f"hr@{k}"], out[f"recall@{k}"], out[f"ndcg@{k}"] = map(float, mean)
    return out


def latency_summary(samples_ms: Sequence[float]) -> dict[str, float]:
    """Mean, std and p50/p90/p99 of latency samples in milliseconds."""
    a = np.asarray(samples_ms, dtype=np.float64)
    if a.size == 0:
        return {}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "std": float(a.std()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}
