"""Import raw Amazon review dumps (2014 or 2018 release) into a dataset folder.

Input: one review per line with keys reviewerID, asin, overall, unixReviewTime, gzip or plain.
2018 files are strict JSON; the 2014 files are Python dict literals (single quotes), parsed with
ast.literal_eval, never eval. Pipeline, each step a small pure function:

1. rating filter: keep overall >= min_rating (default 0 keeps everything, as the usual
   sequential-recommendation preprocessing treats every review as an interaction);
2. duplicates: a user reviewing the same item twice keeps only the earliest review;
3. iterative k-core: drop users and items with fewer than k reviews until none is left;
4. each user's reviews in time order (equal times keep file order);
5. split: leave-one-out (last -> test, second-last -> valid) or global temporal 8:1:1.

Ids: users and items are dense in sorted source-id order; items keep the asin in `source_id`.

Item features (feature_dim floats, L2-normalised, deterministic, no network):
* with a meta file: signed feature hashing of title words, category names and brand (field-
  prefixed tokens, blake2b hash), so items with similar text get similar vectors;
* without meta (or for items without meta text): a seeded random projection of the item's
  train-split users (a co-occurrence sketch: items bought by the same users get similar vectors);
  items with no train interaction get a hashed-asin vector.

Provisional SIDs (real ones come from `genrec tokenize`): residual k-means on the features
("rq-kmeans", plain numpy) or the item index in mixed radix ("radix"); collisions get an explicit
disambiguation level. Everything is read and validated before anything is written.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import math
import os
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

import numpy as np
import pandas as pd
import pyarrow as pa

from genrec.workloads.data.dataset import (
    DatasetError,
    Manifest,
    interactions_table,
    items_table,
    split_counts,
    write_dataset,
)
from genrec.workloads.data.splits import leave_one_out, temporal_split
from genrec.workloads.sid_codec import SIDCodec, codebook_utilisation, ensure_unique_sids

IMPORTER_VERSION = "1"
REVIEW_KEYS = ("reviewerID", "asin", "overall", "unixReviewTime")
SPLIT_RULES = ("leave-one-out", "temporal")
SID_METHODS = ("rq-kmeans", "radix")
WORD_RE = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class AmazonConfig:
    min_rating: float = 0.0
    k_core: int = 5
    split: str = "leave-one-out"
    levels: int = 3
    codebook_size: int = 256
    feature_dim: int = 64
    sid_method: str = "rq-kmeans"
    seed: int = 0  # random projection and k-means initialisation
    kmeans_iters: int = 20
    name: str | None = None

    def validate(self) -> None:
        def bad(msg: str) -> None:
            raise DatasetError(f"amazon import: {msg}")

        if self.k_core < 1:
            bad(f"k_core must be >= 1, got {self.k_core}")
        if self.split not in SPLIT_RULES:
            bad(f"split must be one of {SPLIT_RULES}, got {self.split!r}")
        if self.sid_method not in SID_METHODS:
            bad(f"sid_method must be one of {SID_METHODS}, got {self.sid_method!r}")
        if self.levels < 1 or self.codebook_size < 1:
            bad(f"levels ({self.levels}) and codebook_size ({self.codebook_size}) must be >= 1")
        if self.codebook_size**self.levels >= 2**63:
            bad(f"codebook_size {self.codebook_size} ** levels {self.levels} overflows a 64-bit SID key")
        if self.feature_dim < 1:
            bad(f"feature_dim must be >= 1, got {self.feature_dim}")


@dataclass
class Reviews:
    """Parsed review columns in file order."""

    users: list[str]
    items: list[str]
    ratings: np.ndarray
    times: np.ndarray


# --- reading -------------------------------------------------------------------------------------
def open_text(path: Path) -> IO[str]:
    """Open plain or gzip text (detected by the magic bytes, not the file name)."""
    if not path.is_file():
        raise DatasetError(f"{path}: no such file; pass an existing Amazon reviews/meta file")
    with path.open("rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rt", encoding="utf-8") if gz else path.open("r", encoding="utf-8")


def parse_record(text: str, path: Path, lineno: int) -> dict:
    """One line -> dict: strict JSON first, else a Python literal (2014 dumps), never eval."""
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as e:
        try:
            rec = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise DatasetError(
                f"{path}:{lineno}: neither JSON nor a Python dict literal ({e.msg} at column {e.colno}); "
                'each line must be one review object like {"reviewerID": ..., "asin": ...}'
            ) from None
    if not isinstance(rec, dict):
        raise DatasetError(f"{path}:{lineno}: a line must hold one object {{...}}, got {type(rec).__name__}")
    return rec


def iter_records(path: Path, progress: bool = False, what: str = "reviews") -> Iterator[tuple[int, dict]]:
    from tqdm import tqdm

    from genrec.workloads.progress import bar_enabled

    try:
        with open_text(path) as f:
            on = bar_enabled(progress, sys.stderr)
            bar = tqdm(f, desc=f"reading {what}", unit=" lines", file=sys.stderr, disable=not on)
            for lineno, line in enumerate(bar, start=1):
                text = line.strip()
                if text:
                    yield lineno, parse_record(text, path, lineno)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: cannot read ({e}); the file is corrupt or not UTF-8 text / gzip") from e


def read_reviews(path: Path, progress: bool = False) -> Reviews:
    users: list[str] = []
    items: list[str] = []
    ratings: list[float] = []
    times: list[int] = []
    for lineno, rec in iter_records(path, progress, "reviews"):
        missing = [k for k in REVIEW_KEYS if k not in rec]
        if missing:
            raise DatasetError(
                f"{path}:{lineno}: missing key(s) {missing}; every review needs {list(REVIEW_KEYS)} "
                "(is this a meta file passed as --reviews?)"
            )
        try:
            rating, ts = float(rec["overall"]), int(rec["unixReviewTime"])
        except (TypeError, ValueError):
            raise DatasetError(
                f"{path}:{lineno}: overall={rec['overall']!r} / unixReviewTime={rec['unixReviewTime']!r} "
                "must be a number and an integer unix time"
            ) from None
        users.append(str(rec["reviewerID"]))
        items.append(str(rec["asin"]))
        ratings.append(rating)
        times.append(ts)
    if not users:
        raise DatasetError(f"{path}: empty file (no review lines); pass an Amazon reviews JSON-lines file")
    return Reviews(users, items, np.asarray(ratings, dtype=np.float64), np.asarray(times, dtype=np.int64))


def read_meta(path: Path, progress: bool = False) -> dict[str, list[str]]:
    """asin -> field-prefixed text tokens from title, categories/category and brand."""
    tokens: dict[str, list[str]] = {}
    for lineno, rec in iter_records(path, progress, "meta"):
        if "asin" not in rec:
            raise DatasetError(f"{path}:{lineno}: missing key 'asin'; every meta line needs the item's asin")
        tokens[str(rec["asin"])] = meta_tokens(rec)
    if not tokens:
        raise DatasetError(
            f"{path}: empty file (no meta lines); pass an Amazon meta JSON-lines file or omit it"
        )
    return tokens


def meta_tokens(rec: dict) -> list[str]:
    out = [f"t:{w}" for w in WORD_RE.findall(str(rec.get("title") or "").lower())]
    cats = rec.get("categories", rec.get("category")) or []
    for cat in _flatten(cats):
        name = str(cat).strip().lower()
        out.append(f"c:{name}")  # the whole category name ...
        out.extend(f"cw:{w}" for w in WORD_RE.findall(name))  # ... and its words
    if brand := str(rec.get("brand") or "").strip().lower():
        out.append(f"b:{brand}")
    return out


def _flatten(x: object) -> Iterator[object]:
    """2014 categories are a list of lists, 2018 a flat list; a bare string counts as one."""
    if isinstance(x, list | tuple):
        for y in x:
            yield from _flatten(y)
    elif x is not None:
        yield x


# --- filtering and splitting -----------------------------------------------------------------------
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


# --- features ------------------------------------------------------------------------------------
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


# --- provisional semantic IDs --------------------------------------------------------------------
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


# --- public API ----------------------------------------------------------------------------------
def _default_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json", ".jsonl"):
        name = name.removesuffix(suffix)
    return name or "amazon"


def build_amazon(
    reviews: str | os.PathLike,
    meta: str | os.PathLike | None = None,
    config: AmazonConfig | None = None,
    progress: bool = False,
) -> tuple[Manifest, pa.Table, pa.Table]:
    """Read, filter, split and featurise; returns (manifest, interactions, items) without writing."""
    cfg = config or AmazonConfig()
    cfg.validate()
    path = Path(reviews)
    inter = filter_and_split(read_reviews(path, progress), cfg, path)
    meta_tokens_by_asin = read_meta(Path(meta), progress) if meta is not None else None
    features, feature_info = item_features(inter, cfg, meta_tokens_by_asin)
    codes, sizes, sid_stats = provisional_sids(features, cfg)
    files = [path] + ([Path(meta)] if meta is not None else [])
    manifest = Manifest(
        name=cfg.name or _default_name(path),
        codebook_sizes=list(sizes),
        num_users=int(inter.users.max()) + 1,
        num_items=len(inter.item_source_ids),
        counts=split_counts(inter.splits),
        split_rule=cfg.split,
        provenance={
            "importer": "amazon",
            "version": IMPORTER_VERSION,
            "files": {str(p.resolve()): p.stat().st_size for p in files},
            "config": asdict(cfg),
            "stages": inter.stage_counts,
            "sid_method": cfg.sid_method,
            "user_id_rule": "dense in sorted reviewerID order",
            **feature_info,
        },
        sid_stats=sid_stats,
        feature_dim=cfg.feature_dim,
    )
    interactions = interactions_table(inter.users, inter.items, inter.positions, inter.splits)
    return manifest, interactions, items_table(codes, inter.item_source_ids, features)


def import_amazon(
    reviews: str | os.PathLike,
    out: str | os.PathLike,
    meta: str | os.PathLike | None = None,
    min_rating: float = 0.0,
    k_core: int = 5,
    split: str = "leave-one-out",
    levels: int = 3,
    codebook_size: int = 256,
    feature_dim: int = 64,
    sid_method: str = "rq-kmeans",
    seed: int = 0,
    name: str | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> tuple[Path, Manifest]:
    """Import an Amazon review dump into the dataset folder `out` (atomic); returns (out, manifest)."""
    cfg = AmazonConfig(
        min_rating=min_rating,
        k_core=k_core,
        split=split,
        levels=levels,
        codebook_size=codebook_size,
        feature_dim=feature_dim,
        sid_method=sid_method,
        seed=seed,
        name=name,
    )
    if Path(out).exists() and not overwrite:  # fail before a long read; write_dataset checks again
        raise DatasetError(
            f"{Path(out).resolve()}: already exists; pass --overwrite to replace it or choose another --out"
        )
    manifest, interactions, items = build_amazon(reviews, meta, cfg, progress)
    return write_dataset(out, manifest, interactions, items, overwrite=overwrite), manifest
