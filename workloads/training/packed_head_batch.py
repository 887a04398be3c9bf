"""Packed training batches for draft heads: all targets of a training window in one sequence.

The per-example objective builds one prompt per (history, target): [BOS] + history + <SP_1>..<SP_L>.
A window of n items has up to n - 1 targets, so those prompts repeat the same history up to n - 1
times. Packing lays the window's history out once and appends one placeholder block per target:

    [BOS] t(i_0) .. t(i_{n-2}) | <SP_1>..<SP_L> for target i_j | <SP_1>..<SP_L> for target i_{j+1} | ..

An attention mask makes each block see exactly what its own prompt would: BOS and the tokens of the
items before its target, then the earlier placeholders of its own block. History tokens never see a
placeholder. A block's RoPE positions continue from its history's last position, as in the unpacked
prompt. So every block's hidden states equal those of its unpacked prompt (tests check this), while
the windows, targets and optimiser steps are those of next-item training (inputs.training_windows):
the same data and budget as the beam-search model the head is compared against.

Heads that read only h_0 (MTP, NEZHA-2) need no blocks. h_0 of target j is the hidden state at the
last token of item j-1 in the plain causal window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from genrec.workloads.sid_codec import BOS, PAD

_NOT_HISTORY = np.iinfo(np.int64).max  # a key that no query's history limit reaches


@dataclass
class PackedHeadBatch:
    tokens: torch.Tensor  # [B, S], left-padded
    positions: torch.Tensor  # [B, S] RoPE positions
    attn_mask: torch.Tensor  # [B, S, S] bool, True = the query (row) may attend the key (column)
    state_index: torch.Tensor  # [N, L+1] (or [N, 1]): flat indices into the batch's B*S hidden states
    targets: torch.Tensor  # [N] item ids, in the order of state_index's rows

    def head_states(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's input states [N, L+1, D] (or [N, 1, D]) from hidden states [B, S, D]."""
        return hidden.reshape(-1, hidden.shape[-1])[self.state_index]


def window_targets(window: Sequence[int], num_targets: int) -> list[tuple[list[int], int]]:
    """The (history, target) pairs a packed window trains on, in state_index order."""
    window = list(window)
    return [(window[:j], window[j]) for j in range(len(window) - num_targets, len(window))]


@dataclass
class _PackedRow:
    """One window's sequence before padding; per token: what it is and what it may attend."""

    tokens: np.ndarray
    positions: np.ndarray
    history_limit: np.ndarray  # the last history index this token may attend (its own for history)
    block: np.ndarray  # placeholder block (target) number, -1 for history tokens
    slot: np.ndarray  # 1..L inside a block, 0 for history tokens
    history_len: int  # the first history_len tokens are the shared history
    state_local: np.ndarray  # [targets, L+1] (or [targets, 1]): local indices of h_0, h_1..h_L


def _pack_window(window: Sequence[int], n_targets: int, item_tokens: np.ndarray, placeholders) -> _PackedRow:
    levels, n_sp = item_tokens.shape[1], len(placeholders)
    items = np.asarray(window, dtype=np.int64)
    # [BOS] + every item but the last, which is only ever a target
    history = np.concatenate([[BOS], item_tokens[items[:-1]].reshape(-1)])
    h = len(history)
    # target j's history ends with item j-1's last token (index levels * j)
    last = levels * np.arange(len(items) - n_targets, len(items))
    slot = np.tile(np.arange(1, n_sp + 1), n_targets)
    state_local = [last[:, None], h + np.arange(n_targets * n_sp).reshape(n_targets, n_sp)]
    return _PackedRow(
        tokens=np.concatenate([history, np.tile(np.asarray(placeholders, dtype=np.int64), n_targets)]),
        positions=np.concatenate([np.arange(h), np.repeat(last, n_sp) + slot]),
        history_limit=np.concatenate([np.arange(h), np.repeat(last, n_sp)]),
        block=np.concatenate([np.full(h, -1), np.repeat(np.arange(n_targets), n_sp)]),
        slot=np.concatenate([np.zeros(h, dtype=np.int64), slot]),
        history_len=h,
        state_local=np.concatenate(state_local, axis=1),
    )


def build_packed_head_batch(
    windows: Sequence[tuple[Sequence[int], int]],
    item_tokens: np.ndarray,
    placeholders: Sequence[int] | None,
    device: torch.device | str = "cpu",
) -> PackedHeadBatch:
    """Pack (window, num_targets) pairs from inputs.training_windows into one batch.

    `placeholders` are the tokens <SP_1>..<SP_L> for heads that read h_1..h_L, or None for heads
    that read only h_0.
    """
    rows, targets = [], []
    for i, (window, n_targets) in enumerate(windows):
        if len(window) < 2 or not 1 <= n_targets <= len(window) - 1:
            raise ValueError(f"window {i}: {n_targets} targets impossible for {len(window)} items")
        rows.append(_pack_window(window, n_targets, item_tokens, list(placeholders or [])))
        targets.append(np.asarray(window, dtype=np.int64)[len(window) - n_targets :])
    b, s = len(rows), max(len(r.tokens) for r in rows)
    tokens = np.full((b, s), PAD, dtype=np.int64)
    positions = np.zeros((b, s), dtype=np.int64)
    limit = np.full((b, s), -1, dtype=np.int64)  # pads see no history token
    key_history = np.full((b, s), _NOT_HISTORY, dtype=np.int64)  # each key's history index, if any
    block = np.full((b, s), -1, dtype=np.int64)
    slot = np.zeros((b, s), dtype=np.int64)
    flat = []
    for r, row in enumerate(rows):  # left-pad each row to s
        cols = slice(s - len(row.tokens), s)
        tokens[r, cols], positions[r, cols], limit[r, cols] = row.tokens, row.positions, row.history_limit
        block[r, cols], slot[r, cols] = row.block, row.slot
        key_history[r, cols.start : cols.start + row.history_len] = np.arange(row.history_len)
        flat.append(r * s + cols.start + row.state_local)
    to_device = [torch.from_numpy(a).to(device) for a in (limit, key_history, block, slot)]
    limit_t, key_t, block_t, slot_t = to_device
    sees_history = key_t[:, None, :] <= limit_t[:, :, None]
    same_block = (block_t[:, :, None] >= 0) & (block_t[:, :, None] == block_t[:, None, :])
    sees_own_block = same_block & (slot_t[:, None, :] <= slot_t[:, :, None])
    # a pad query sees only itself, so no softmax row is empty (its output is never used)
    eye = torch.eye(s, dtype=torch.bool, device=device)
    return PackedHeadBatch(
        tokens=torch.from_numpy(tokens).to(device),
        positions=torch.from_numpy(positions).to(device),
        attn_mask=sees_history | sees_own_block | eye,
        state_index=torch.from_numpy(np.concatenate(flat)).to(device),
        targets=torch.from_numpy(np.concatenate(targets)),
    )
