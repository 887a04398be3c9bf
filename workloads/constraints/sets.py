"""Constraint sets: a named set of allowed semantic IDs, built from a catalogue by a rule.

A `ConstraintSet` holds its SIDs as an [N, L] int32 array of codes, sorted lexicographically and
free of duplicates (codes, not mixed-radix keys: at the paper's V = 2048, L = 8 the SID space has
2^88 points and a key does not fit in an int64).

Input handling (the upstream builder silently builds a wrong index from unsorted input; here the
order of the input never matters, however the set is constructed: `ConstraintSet(...)` normalises
exactly as `ConstraintSet.from_codes(...)` does):
- unsorted rows are sorted, duplicate rows are dropped; both are counted in `stats`;
- a row of the wrong length, a code outside its level's codebook, a non-integer array, or an
  empty set raise `ConstraintError` (a `UserInputError`) naming the problem and the fix.

Rules: `all_items`, `random_subset` (n items of the catalogue), `cold_start` (catalogue items with no
train interaction), `newest` (the newest fraction of the catalogue by first interaction),
`from_file` (an explicit list), `uniform_random` (n SIDs drawn uniformly from the whole SID space,
for scaling runs; no catalogue needed).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from genrec.workloads.errors import UserInputError
from genrec.workloads.sid_codec import SIDCodec

RULES = ("all", "random", "cold_start", "newest", "file", "uniform")


class ConstraintError(UserInputError):
    """A constraint set that cannot be built: the message names the problem and the fix."""


def lexsort_rows(codes: np.ndarray) -> np.ndarray:
    """Row order that sorts an [N, L] array lexicographically (column 0 most significant)."""
    return np.lexsort(codes.T[::-1])


def codebook_sizes(codec: SIDCodec | tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """Codebook sizes of a codec, or the sizes themselves (the paper's V = 2048, L = 8 space is too big
    for a SIDCodec's 64-bit keys, so constraint code takes either)."""
    sizes = tuple(int(t) for t in getattr(codec, "codebook_sizes", codec))
    if not sizes or min(sizes) < 1:
        raise ConstraintError(f"codebook sizes must be a non-empty list of positive sizes, got {sizes}")
    return sizes


def rows_sorted(codes: np.ndarray) -> bool:
    """Whether the rows are in non-decreasing lexicographic order (an O(N * L) check, no sort)."""
    if len(codes) < 2:
        return True
    diff = codes[1:].astype(np.int64) - codes[:-1]
    first = (diff != 0).argmax(axis=1)
    return bool((diff[np.arange(len(diff)), first] >= 0).all())


def normalise_codes(
    codec: SIDCodec | tuple[int, ...], codes: object, what: str = "constraint set"
) -> tuple[np.ndarray, dict]:
    """Validate [N, L] codes against the codebooks; return them sorted, de-duplicated, int32, and stats."""
    sizes_t = codebook_sizes(codec)
    levels = len(sizes_t)
    arr = np.asarray(codes)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ConstraintError(f"{what}: SID codes must be integers, got dtype {arr.dtype}")
    if arr.ndim != 2 or arr.shape[1] != levels:
        raise ConstraintError(
            f"{what}: expected one row of {levels} codes per SID (shape [N, {levels}]), "
            f"got shape {list(arr.shape)}; check the SID length against the dataset's codebook"
        )
    if arr.shape[0] == 0:
        raise ConstraintError(f"{what}: the set is empty; a constrained decoder needs at least one SID")
    arr = arr.astype(np.int64, copy=False)
    sizes = np.asarray(sizes_t, dtype=np.int64)
    bad = (arr < 0) | (arr >= sizes)
    if bad.any():
        row, level = map(int, np.argwhere(bad)[0])
        raise ConstraintError(
            f"{what}: SID {row} has code {int(arr[row, level])} at level {level}, outside the codebook "
            f"[0, {sizes_t[level]}); the SIDs do not belong to this codec"
        )
    if max(sizes_t) > np.iinfo(np.int32).max:
        raise ConstraintError(f"{what}: codebooks larger than 2^31 codes are not supported")
    arr = arr.astype(np.int32)
    n_in = arr.shape[0]
    was_sorted = rows_sorted(arr)
    if not was_sorted:
        arr = arr[lexsort_rows(arr)]
    keep = np.ones(n_in, dtype=bool)
    if n_in > 1:
        keep[1:] = (arr[1:] != arr[:-1]).any(axis=1)
    arr = np.ascontiguousarray(arr[keep])
    stats = {"input_rows": n_in, "was_sorted": was_sorted, "duplicates_dropped": int(n_in - len(arr))}
    return arr, stats


@dataclass(frozen=True)
class ConstraintSet:
    """A named, sorted, duplicate-free set of allowed SIDs ([N, L] int32 codes).

    Every construction normalises: `ConstraintSet(name, sizes, codes)` and `from_codes` both sort and
    de-duplicate the rows, or raise `ConstraintError`, so no set can hold the unsorted rows from which
    the upstream builder makes a silently wrong index. `stats` given by the caller are kept on top of
    the normalisation's own (input_rows, was_sorted, duplicates_dropped)."""

    name: str
    codebook_sizes: tuple[int, ...]
    codes: np.ndarray
    stats: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = codebook_sizes(self.codebook_sizes)
        arr, stats = normalise_codes(sizes, self.codes, f"constraint set {self.name!r}")
        # frozen: the normalised fields replace what the caller passed, once, here
        object.__setattr__(self, "codebook_sizes", sizes)
        object.__setattr__(self, "codes", arr)
        object.__setattr__(self, "stats", {**stats, **self.stats})

    @classmethod
    def from_codes(
        cls, name: str, codec: SIDCodec | tuple[int, ...], codes: object, **extra_stats: object
    ) -> ConstraintSet:
        """The set of `codes` ([N, L] in any order, duplicates allowed) over a codec's codebooks."""
        return cls(name, codebook_sizes(codec), codes, dict(extra_stats))

    @property
    def levels(self) -> int:
        return len(self.codebook_sizes)

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    def contains(self, codes: np.ndarray) -> np.ndarray:
        """Membership of [M, L] codes (bool [M]); a binary search per row on the sorted set."""
        q = np.asarray(codes, dtype=np.int64).reshape(-1, self.levels)
        lo = np.zeros(len(q), dtype=np.int64)
        hi = np.full(len(q), len(self), dtype=np.int64)
        # lexicographic lower bound, one vectorised bisection over all queries
        while (lo < hi).any():
            mid = (lo + hi) // 2
            active = lo < hi
            row = self.codes[np.minimum(mid, len(self) - 1)].astype(np.int64)
            diff = row - q
            nz = diff != 0
            first = np.where(nz.any(1), diff[np.arange(len(q)), nz.argmax(1)], 0)
            less = first < 0
            lo = np.where(active & less, mid + 1, lo)
            hi = np.where(active & ~less, mid, hi)
        found = lo < len(self)
        row = self.codes[np.minimum(lo, len(self) - 1)]
        return found & (row == q).all(1)


# --- rules -----------------------------------------------------------------------------------------
def all_items(codec: SIDCodec, item_codes: np.ndarray, name: str = "all") -> ConstraintSet:
    return ConstraintSet.from_codes(name, codec, item_codes, rule="all")


def random_subset(
    codec: SIDCodec, item_codes: np.ndarray, n: int, seed: int = 0, name: str | None = None
) -> ConstraintSet:
    n_items = len(item_codes)
    if not 1 <= n <= n_items:
        raise ConstraintError(
            f"random subset size must be between 1 and the {n_items} catalogue items, got {n}"
        )
    pick = np.random.default_rng(seed).choice(n_items, size=n, replace=False)
    return ConstraintSet.from_codes(
        name or f"random{n}_s{seed}", codec, np.asarray(item_codes)[pick], rule="random", seed=seed
    )


def cold_start(
    codec: SIDCodec, item_codes: np.ndarray, train_counts: np.ndarray, name: str = "cold_start"
) -> ConstraintSet:
    """Catalogue items that never occur in the training split (train_counts[i] == 0)."""
    counts = np.asarray(train_counts)
    if counts.shape != (len(item_codes),):
        raise ConstraintError(
            f"cold-start rule: train counts have shape {list(counts.shape)}, expected [{len(item_codes)}] "
            "(one count per catalogue item)"
        )
    cold = np.flatnonzero(counts == 0)
    if len(cold) == 0:
        raise ConstraintError(
            "cold-start rule: every catalogue item occurs in the training split; the set is empty"
        )
    return ConstraintSet.from_codes(name, codec, np.asarray(item_codes)[cold], rule="cold_start")


def newest(
    codec: SIDCodec, item_codes: np.ndarray, first_seen: np.ndarray, fraction: float, name: str | None = None
) -> ConstraintSet:
    """The `fraction` of catalogue items with the latest first interaction (larger first_seen = newer)."""
    if not 0 < fraction <= 1:
        raise ConstraintError(f"newest rule: fraction must be in (0, 1], got {fraction}")
    first_seen = np.asarray(first_seen)
    if first_seen.shape != (len(item_codes),):
        raise ConstraintError(
            f"newest rule: first_seen has shape {list(first_seen.shape)}, expected [{len(item_codes)}]"
        )
    n = max(1, int(round(fraction * len(item_codes))))
    order = np.argsort(-first_seen, kind="stable")[:n]
    return ConstraintSet.from_codes(
        name or f"newest{fraction:g}", codec, np.asarray(item_codes)[order], rule="newest", fraction=fraction
    )


def first_seen_rank(dataset: object) -> np.ndarray:
    """Per item, how late it first appears: (earliest split, then position) as one float; never seen = inf.

    Datasets store per-user positions, not timestamps; the split (train < valid < test) orders the
    global time for temporal splits and the position breaks ties inside a split.
    """
    df = dataset.interactions  # type: ignore[attr-defined]
    split_rank = df["split"].map({"train": 0, "valid": 1, "test": 2}).to_numpy(dtype=np.float64)
    score = split_rank * 1e9 + df["position"].to_numpy(dtype=np.float64)
    out = np.full(dataset.num_items, np.inf)  # type: ignore[attr-defined]
    np.minimum.at(out, df["item_id"].to_numpy(), score)
    return out


def from_file(codec: SIDCodec, path: str | os.PathLike, name: str | None = None) -> ConstraintSet:
    """An explicit list: `.npy` ([N, L] integer array, no pickle) or text (one SID per line, codes
    separated by spaces, commas or dashes; blank lines and `#` comments ignored)."""
    path = Path(path)
    levels = len(codebook_sizes(codec))
    if not path.is_file():
        raise ConstraintError(f"{path}: no such constraint list file")
    if path.suffix == ".npy":
        try:
            codes = np.load(path, allow_pickle=False)
        except ValueError as e:
            raise ConstraintError(f"{path}: not a plain integer .npy array ({e})") from e
    else:
        rows = []
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            parts = text.replace(",", " ").replace("-", " ").split()
            try:
                row = [int(p) for p in parts]
            except ValueError as e:
                raise ConstraintError(f"{path}:{lineno}: not a list of integer codes: {line!r}") from e
            if len(row) != levels:
                raise ConstraintError(
                    f"{path}:{lineno}: {len(row)} codes, expected {levels} (one per SID level)"
                )
            rows.append(row)
        codes = np.asarray(rows, dtype=np.int64).reshape(-1, levels)
    return ConstraintSet.from_codes(name or path.stem, codec, codes, rule="file", path=str(path))


def uniform_random(
    codec: SIDCodec | tuple[int, ...], n: int, seed: int = 0, name: str | None = None
) -> ConstraintSet:
    """n distinct SIDs drawn uniformly from the whole SID space (the paper's scaling sets)."""
    sizes = np.asarray(codebook_sizes(codec), dtype=np.int64)
    space = math.prod(int(t) for t in sizes)
    if not 1 <= n <= space:
        raise ConstraintError(f"uniform rule: size must be between 1 and the SID space ({space}), got {n}")
    rng = np.random.default_rng(seed)
    label = name or f"uniform{n}_s{seed}"
    if space <= 16 * n:  # dense regime: sample keys without replacement, then decode mixed radix
        keys = rng.choice(space, size=n, replace=False).astype(np.int64)
        codes = np.empty((n, len(sizes)), dtype=np.int64)
        for level in range(len(sizes) - 1, -1, -1):
            codes[:, level] = keys % sizes[level]
            keys //= sizes[level]
        return ConstraintSet.from_codes(label, sizes, codes, rule="uniform", seed=seed)
    # sparse regime (space may exceed int64): draw codes per level, top up until n distinct rows
    codes = np.empty((0, len(sizes)), dtype=np.int32)
    while len(codes) < n:
        extra = rng.integers(0, sizes, size=(n - len(codes) + 16, len(sizes)))
        codes, _ = normalise_codes(sizes, np.concatenate([codes, extra]))
    if len(codes) > n:
        codes = codes[np.sort(rng.choice(len(codes), size=n, replace=False))]
    return ConstraintSet.from_codes(label, sizes, codes, rule="uniform", seed=seed)
