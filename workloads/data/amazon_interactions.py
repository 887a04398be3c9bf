"""Filtering and splitting Amazon reviews into a dataset's interactions (steps 1-5 of amazon.py's
pipeline): rating filter, duplicates, iterative k-core, per-user time order, split."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from genrec.workloads.data.amazon_config import AmazonConfig
from genrec.workloads.data.amazon_reviews import Reviews
from genrec.workloads.data.dataset import DatasetError
from genrec.workloads.data.splits import leave_one_out, temporal_split


def k_core(users: np.ndarray, items: np.ndarray, k: int) -> np.ndarray:
    """Mask of interactions in the k-core: every kept user and item has >= k kept interactions."""
    keep = np.ones(len(users), dtype=bool)
    while True:
        uc = np.bincount(users[keep], minlength=int(users.max(initial=-1)) + 1)
        ic = np.bincount(items[keep], minlength=int(items.max(initial=-1)) + 1)
        new = keep & (uc[users] >= k) & (ic[items] >= k)
        if new.sum() == keep.sum():
            return keep
        keep = new


def dedupe_first(users: np.ndarray, items: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Mask keeping the first (in `order`) interaction of every (user, item) pair."""
    keep = np.zeros(len(users), dtype=bool)
    pairs = users[order].astype(np.int64) * (int(items.max(initial=0)) + 1) + items[order]
    _, first = np.unique(pairs, return_index=True)
    keep[order[first]] = True
    return keep


def empty_core_message(users: np.ndarray, items: np.ndarray, k: int) -> str:
    """Why the k-core is empty (the first pass of each filter) and the largest k that would work."""
    uc, ic = np.bincount(users), np.bincount(items)
    users_ok, items_ok = int((uc[uc > 0] >= k).sum()), int((ic[ic > 0] >= k).sum())
    best = next((j for j in range(k - 1, 0, -1) if k_core(users, items, j).any()), 1)
    return (
        f"the {k}-core is empty: of {int((uc > 0).sum())} users only {users_ok} have >= {k} reviews and of "
        f"{int((ic > 0).sum())} items only {items_ok} have >= {k} reviews, and removing the rest repeatedly "
        f"removes everything; use a smaller --k-core (the largest non-empty core here is k={best})"
    )


@dataclass
class Interactions:
    users: np.ndarray  # dense user id
    items: np.ndarray  # dense item id
    positions: np.ndarray
    splits: np.ndarray
    item_source_ids: list[str]
    stage_counts: dict[str, int]


def filter_and_split(reviews: Reviews, cfg: AmazonConfig, path: Path) -> Interactions:
    n = len(reviews.users)
    u_codes, u_names = pd.factorize(np.asarray(reviews.users, dtype=object), sort=True)
    i_codes, i_names = pd.factorize(np.asarray(reviews.items, dtype=object), sort=True)
    line = np.arange(n)
    stages = {"reviews_read": n}

    keep = reviews.ratings >= cfg.min_rating
    stages["after_rating_filter"] = int(keep.sum())
    if not keep.any():
        lo, hi = reviews.ratings.min(), reviews.ratings.max()
        raise DatasetError(
            f"{path}: the rating filter (overall >= {cfg.min_rating}) removed all {n} reviews "
            f"(ratings here are {lo:g}..{hi:g}); lower --min-rating"
        )
    idx = np.flatnonzero(keep)
    by_time = idx[np.lexsort((line[idx], reviews.times[idx]))]  # earliest review first
    dedup = dedupe_first(u_codes, i_codes, by_time)
    idx = np.flatnonzero(dedup)
    stages["after_dedupe"] = len(idx)

    core = k_core(u_codes[idx], i_codes[idx], cfg.k_core)
    if not core.any():
        raise DatasetError(f"{path}: {empty_core_message(u_codes[idx], i_codes[idx], cfg.k_core)}")
    idx = idx[core]
    stages["after_k_core"] = len(idx)

    # dense ids in sorted source-id order (factorize sorted them)
    kept_users, users = np.unique(u_codes[idx], return_inverse=True)
    kept_items, items = np.unique(i_codes[idx], return_inverse=True)
    del kept_users  # users have no source-id column in the dataset format
    times, lines = reviews.times[idx], line[idx]
    order = np.lexsort((lines, times, users))  # per user, time order, ties by file order
    users, items, times, lines = users[order], items[order], times[order], lines[order]
    lengths = np.bincount(users)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    positions = np.arange(len(users)) - np.repeat(starts, lengths)
    if cfg.split == "leave-one-out":
        splits = leave_one_out(lengths, positions)
    else:
        splits = temporal_split(times, tiebreak=lines)
    return Interactions(users, items, positions, splits, [str(s) for s in i_names[kept_items]], stages)
