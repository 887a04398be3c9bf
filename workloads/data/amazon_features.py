"""Amazon item features for the provisional SIDs.

Item features (feature_dim floats, L2-normalised, deterministic, no network):
* with a meta file: signed feature hashing of title words, category names and brand (field-
  prefixed tokens, blake2b hash), so items with similar text get similar vectors;
* without meta (or for items without meta text): a seeded random projection of the item's
  train-split users (a co-occurrence sketch: items bought by the same users get similar vectors);
  items with no train interaction get a hashed-asin vector.
"""

from __future__ import annotations

import hashlib

import numpy as np

from genrec.workloads.data.amazon_config import AmazonConfig
from genrec.workloads.data.amazon_interactions import Interactions


def _hash(token: str) -> int:
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")


def hashed_vector(tokens: list[str], dim: int, cache: dict[str, tuple[int, float]]) -> np.ndarray:
    """Signed feature hashing: bucket from the low bits, sign from bit 32 (independent of the bucket)."""
    v = np.zeros(dim, dtype=np.float64)
    for tok in tokens:
        if tok not in cache:
            h = _hash(tok)
            cache[tok] = (h % dim, 1.0 if (h >> 32) & 1 else -1.0)
        b, s = cache[tok]
        v[b] += s
    return v


def cooccurrence_features(
    users: np.ndarray, items: np.ndarray, num_items: int, dim: int, seed: int
) -> np.ndarray:
    """Sum of a seeded random vector per train user over each item's users (a sketch of A^T R)."""
    rng = np.random.default_rng(seed)
    proj = rng.standard_normal((int(users.max(initial=-1)) + 1, dim))
    feats = np.zeros((num_items, dim))
    for d in range(dim):  # bincount per column: much faster than np.add.at on rows
        feats[:, d] = np.bincount(items, weights=proj[users, d], minlength=num_items)
    return feats


def item_features(
    inter: Interactions, cfg: AmazonConfig, meta: dict[str, list[str]] | None
) -> tuple[np.ndarray, dict]:
    """[num_items, feature_dim] float32, L2-normalised; returns also how each item got its vector."""
    n, dim = len(inter.item_source_ids), cfg.feature_dim
    cache: dict[str, tuple[int, float]] = {}
    train = inter.splits == "train"
    feats = np.zeros((n, dim))
    from_meta = np.zeros(n, dtype=bool)
    if meta is not None:
        for i, asin in enumerate(inter.item_source_ids):
            if toks := meta.get(asin):
                feats[i] = hashed_vector(toks, dim, cache)
                from_meta[i] = np.any(feats[i] != 0)
    co = cooccurrence_features(inter.users[train], inter.items[train], n, dim, cfg.seed)
    use_co = ~from_meta & np.any(co != 0, axis=1)
    feats[use_co] = co[use_co]
    fallback = ~from_meta & ~use_co
    for i in np.flatnonzero(fallback):
        feats[i] = hashed_vector([f"asin:{inter.item_source_ids[i]}"], dim, cache)
    feats /= np.linalg.norm(feats, axis=1, keepdims=True)
    method = {
        "feature_method": "hashed bag of words (title, categories, brand)"
        if meta is not None
        else "co-occurrence sketch (random projection of train users)",
        "items_from_meta": int(from_meta.sum()),
        "items_from_cooccurrence": int(use_co.sum()),
        "items_from_asin_hash": int(fallback.sum()),
    }
    return feats.astype(np.float32), method
