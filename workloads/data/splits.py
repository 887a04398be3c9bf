"""Split rules shared by the synthetic generator and the importers.

Both return one split label ("train" | "valid" | "test") per interaction.
"""

from __future__ import annotations

import numpy as np

TEMPORAL_FRACTIONS = (0.8, 0.1, 0.1)


def leave_one_out(lengths: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Per flattened interaction: last -> test, second-last -> valid, the rest -> train."""
    user_len = np.repeat(lengths, lengths)
    split = np.full(len(positions), "train", dtype=object)
    split[positions == user_len - 2] = "valid"
    split[positions == user_len - 1] = "test"
    return split


def temporal_split(
    times: np.ndarray,
    tiebreak: np.ndarray | None = None,
    fractions: tuple[float, float, float] = TEMPORAL_FRACTIONS,
) -> np.ndarray:
    """Global time order cut 8:1:1; equal times are ordered by `tiebreak`, else by input order."""
    n = len(times)
    rank = np.empty(n, dtype=np.int64)
    keys = (np.arange(n) if tiebreak is None else tiebreak, times)
    rank[np.lexsort(keys)] = np.arange(n)
    cut_train = int(round(fractions[0] * n))
    cut_valid = int(round((fractions[0] + fractions[1]) * n))
    split = np.full(n, "train", dtype=object)
    split[rank >= cut_train] = "valid"
    split[rank >= cut_valid] = "test"
    return split
