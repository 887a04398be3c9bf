"""Provisional semantic IDs of imported Amazon items.

Provisional SIDs (real ones come from `genrec tokenize`): residual k-means on the features
("rq-kmeans", plain numpy) or the item index in mixed radix ("radix"); collisions get an explicit
disambiguation level.
"""

from __future__ import annotations

import math

import numpy as np

from genrec.workloads.data.amazon_config import AmazonConfig
from genrec.workloads.data.dataset import DatasetError
from genrec.workloads.sid_codec import SIDCodec, codebook_utilisation, ensure_unique_sids


def kmeans(x: np.ndarray, k: int, rng: np.random.Generator, iters: int, chunk: int = 8192) -> np.ndarray:
    """Plain Lloyd's k-means (random distinct points as initial centres); returns assignments."""
    n = len(x)
    k = min(k, n)
    centres = x[rng.choice(n, size=k, replace=False)].copy()
    assign = np.full(n, -1, dtype=np.int64)
    for _ in range(iters):
        c_sq = (centres**2).sum(axis=1)
        new = np.concatenate(
            [(c_sq[None, :] - 2.0 * x[s : s + chunk] @ centres.T).argmin(axis=1) for s in range(0, n, chunk)]
        )
        if np.array_equal(new, assign):
            break
        assign = new
        counts = np.bincount(assign, minlength=k)
        sums = np.stack(
            [np.bincount(assign, weights=x[:, d], minlength=k) for d in range(x.shape[1])], axis=1
        )
        filled = counts > 0  # an empty cluster keeps its old centre
        centres[filled] = sums[filled] / counts[filled, None]
    return assign


def rq_kmeans_codes(x: np.ndarray, levels: int, size: int, seed: int, iters: int) -> np.ndarray:
    """Residual quantisation: k-means per level on what the previous levels left unexplained."""
    rng = np.random.default_rng(seed)
    residual = x.astype(np.float64).copy()
    codes = np.zeros((len(x), levels), dtype=np.int64)
    for level in range(levels):
        assign = kmeans(residual, size, rng, iters)
        k = int(assign.max()) + 1
        centres = (
            np.stack(
                [np.bincount(assign, weights=residual[:, d], minlength=k) for d in range(x.shape[1])], axis=1
            )
            / np.maximum(np.bincount(assign, minlength=k), 1)[:, None]
        )
        residual -= centres[assign]
        codes[:, level] = assign
    return codes


def radix_codes(n: int, levels: int, size: int) -> np.ndarray:
    sizes = (size,) * levels
    if n > math.prod(sizes):
        raise DatasetError(
            f"amazon import: {n} items do not fit in {size}^{levels} radix SIDs; raise --codebook-size or "
            "--levels, or use --sid-method rq-kmeans"
        )
    return np.asarray(SIDCodec(sizes).keys_to_codes(np.arange(n, dtype=np.int64)), dtype=np.int64)


def provisional_sids(features: np.ndarray, cfg: AmazonConfig) -> tuple[np.ndarray, tuple[int, ...], dict]:
    sizes = (cfg.codebook_size,) * cfg.levels
    if cfg.sid_method == "radix":
        codes = radix_codes(len(features), cfg.levels, cfg.codebook_size)
    else:
        codes = rq_kmeans_codes(features, cfg.levels, cfg.codebook_size, cfg.seed, cfg.kmeans_iters)
    codes, sizes, stats = ensure_unique_sids(codes, sizes)
    stats["sid_method"] = cfg.sid_method
    stats["provisional"] = True  # replace with `genrec tokenize`
    stats["utilisation"] = codebook_utilisation(codes, sizes)
    return codes, sizes, stats
