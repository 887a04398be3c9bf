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
    return {
        "mean": float(a.mean()),
        "std": float(a.std()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
    }


def user_metric_vector(
    ranked: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], metric: str
) -> np.ndarray:
    """Per-user values of 'hr@K', 'recall@K' or 'ndcg@K' (for paired tests between decoders)."""
    name, k = metric.split("@")
    col = {"hr": 0, "recall": 1, "ndcg": 2}[name]
    return np.array([user_metrics(r, t, int(k))[col] for r, t in zip(ranked, targets)])


def paired_permutation_test(
    a: np.ndarray, b: np.ndarray, resamples: int = 10_000, seed: int = 0
) -> dict[str, float]:
    """One-sided paired sign-flip test of mean(a - b) > 0 over the same users.

    Under the null the sign of each user's difference is exchangeable, so flipping signs at
    random gives the null distribution of the mean difference. No normality assumption.
    """
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if d.shape != (len(a),) or len(a) != len(b) or len(d) == 0:
        raise ValueError("paired test needs two equally long, non-empty per-user vectors")
    observed = d.mean()
    rng = np.random.default_rng(seed)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(resamples, len(d)))
    null = (signs * d).mean(axis=1)
    p = (1 + np.sum(null >= observed)) / (resamples + 1)
    return {"mean_diff": float(observed), "p_value": float(p), "users": int(len(d))}


def student_t_cdf(t: float, df: int, steps: int = 20_000) -> float:
    """CDF of Student's t with df degrees of freedom (Simpson's rule on the density; no scipy here)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if t == 0:
        return 0.5
    x = np.linspace(0.0, abs(t), steps + 1)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    dens = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
    h = abs(t) / steps
    area = h / 3 * (dens[0] + dens[-1] + 4 * dens[1:-1:2].sum() + 2 * dens[2:-1:2].sum())
    return float(0.5 + area) if t > 0 else float(0.5 - area)


def paired_t_test_less(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """One-sided paired t-test of H1: mean(a - b) < 0 (e.g. a = NEZHA's per-seed HR@10, b = beam's).

    A large p (>= 0.05) means a is not significantly below b. With identical pairs the test is
    undefined; p is then reported as 1.0 (no evidence that a is lower)."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if d.ndim != 1 or len(d) < 2 or len(a) != len(b):
        raise ValueError("a paired t-test needs two equally long sequences of at least 2 values")
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0:
        return {"mean_diff": mean, "t": float("nan"), "df": len(d) - 1, "p_value": 1.0 if mean >= 0 else 0.0}
    t = mean / (sd / math.sqrt(len(d)))
    return {"mean_diff": mean, "t": t, "df": len(d) - 1, "p_value": student_t_cdf(t, len(d) - 1)}
