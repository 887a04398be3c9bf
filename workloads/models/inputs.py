"""Turning item histories into model tokens.

A user's prompt is [BOS] followed by the SID tokens of the last `max_items` history items, oldest
first; the model then generates the next item's L SID tokens. Batches are left-padded (see
transformer.py), so every row's next token sits in the last column.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from genrec.workloads.sid_codec import BOS, PAD, SIDCodec

IGNORE = -100  # label value that carries no loss


def item_token_table(codec: SIDCodec, item_codes: np.ndarray) -> np.ndarray:
    """[num_items, L] token ids; row i is item i's SID in the model's vocabulary."""
    return np.asarray(codec.codes_to_tokens(codec.validate_codes(item_codes, "item SIDs")), dtype=np.int64)


def max_prompt_len(levels: int, max_items: int) -> int:
    return 1 + levels * max_items


def build_prompts(
    histories: Sequence[Sequence[int]],
    item_tokens: np.ndarray,
    max_items: int,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt tokens [B, S] and mask [B, S] (True = real token)."""
    if not histories:
        raise ValueError("build_prompts needs at least one history")
    rows = []
    for h in histories:
        if len(h) == 0:
            raise ValueError("a history is empty; a prompt needs at least one item")
        rows.append(
            np.concatenate([[BOS], item_tokens[np.asarray(h[-max_items:], dtype=np.int64)].reshape(-1)])
        )
    return left_pad(rows, PAD, device)


def left_pad(
    rows: Sequence[Sequence[int]], pad: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of any lengths -> left-padded tokens [B, S] and mask [B, S] (True = real token)."""
    s = max(len(r) for r in rows)
    tokens = np.full((len(rows), s), pad, dtype=np.int64)
    mask = np.zeros((len(rows), s), dtype=bool)
    for i, r in enumerate(rows):
        tokens[i, s - len(r) :] = r
        mask[i, s - len(r) :] = True
    return torch.from_numpy(tokens).to(device), torch.from_numpy(mask).to(device)


def build_training_batch(
    windows: Sequence[Sequence[int]], item_tokens: np.ndarray, num_targets: Sequence[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forcing batch from item windows: tokens, mask and next-token labels, all [B, S].

    Each window is [BOS] + its items' SID tokens. Only the SID tokens of a window's last
    `num_targets[i]` items carry a label (default: every item after the first), each predicted
    from the items before it. The loss is on target SID tokens only, never on BOS or padding.
    """
    levels = item_tokens.shape[1]
    seqs, labels = [], []
    for i, w in enumerate(windows):
        if len(w) < 2:
            raise ValueError("a training window needs at least two items (history and target)")
        toks = np.concatenate([[BOS], item_tokens[np.asarray(w, dtype=np.int64)].reshape(-1)])
        n_targets = len(w) - 1 if num_targets is None else num_targets[i]
        if not 1 <= n_targets <= len(w) - 1:
            raise ValueError(f"window {i}: {n_targets} targets impossible for {len(w)} items")
        lab = np.full(len(toks), IGNORE, dtype=np.int64)
        first = 1 + levels * (len(w) - n_targets)  # first target token; position p predicts p + 1
        lab[first - 1 : len(toks) - 1] = toks[first:]
        seqs.append(toks)
        labels.append(lab)
    s = max(len(t) for t in seqs)
    tok = np.full((len(seqs), s), PAD, dtype=np.int64)
    lab = np.full((len(seqs), s), IGNORE, dtype=np.int64)
    mask = np.zeros((len(seqs), s), dtype=bool)
    for i, (t, l) in enumerate(zip(seqs, labels)):
        tok[i, s - len(t) :], lab[i, s - len(t) :], mask[i, s - len(t) :] = t, l, True
    return torch.from_numpy(tok), torch.from_numpy(mask), torch.from_numpy(lab)


def training_windows(sequences: Sequence[Sequence[int]], max_items: int) -> list[tuple[list[int], int]]:
    """Cut sequences into (window, num_targets) pairs with at most max_items + 1 items each.

    Every item after a sequence's first is a target exactly once, with up to max_items items of
    history before it: the first window covers the sequence's start, later windows step forward by
    max_items targets and carry the preceding items as context only.
    """
    out: list[tuple[list[int], int]] = []
    for seq in sequences:
        seq = list(seq)
        next_target = 1
        while next_target < len(seq):
            end = min(next_target + max_items, len(seq))  # targets are seq[next_target:end]
            start = max(0, end - max_items - 1)
            out.append((seq[start:end], end - next_target))
            next_target = end
    return out
