"""The packed teacher-forcing batch of AtSpeed's sequence-level objectives: each training example's
prompt laid out once, followed by its teacher SIDs, so the draft (and the target) score all K SIDs in
one forward (align_sequence_level.py has the losses; teacher.py the teacher file).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import BOS, PAD, SIDCodec


@dataclass
class SequenceBatch:
    """Each example's prompt once, then L-1 tokens per teacher SID; see build_sequence_batch."""

    tokens: Tensor  # [B, S] left-padded
    positions: Tensor  # [B, S] RoPE positions
    attn_mask: Tensor  # [B, S, S] True = the query (row) may attend the key (column)
    index: Tensor  # [B, K, L] flat index into the B*S states of the state predicting code t of SID k
    sid_tokens: Tensor  # [B, K, L] the teacher SIDs' tokens


def build_sequence_batch(
    prompts: Sequence[Sequence[int]],
    codes: Tensor,
    item_tokens: np.ndarray,
    codec: SIDCodec,
    max_items: int,
    device: torch.device | str = "cpu",
) -> SequenceBatch:
    """Teacher forcing of K SIDs per prompt in one forward, the prompt laid out once per row:

        [pad..] [BOS] prompt tokens | y_1 codes 1..L-1 | y_2 codes 1..L-1 | .. | y_K codes 1..L-1

    Code t of SID k is predicted by the prompt's last state (t = 0) or by SID k's token t-1. A SID
    token sees the whole prompt and its own SID's earlier tokens, at the RoPE position it has after
    the prompt, so every state equals that of the plain row [BOS] prompt y_k (tests check this).
    """
    b, k, levels = codes.shape
    if len(prompts) != b:
        raise ValueError(f"{len(prompts)} prompts for {b} rows of codes")
    sid_tokens = codec.codes_to_tokens(codes.to(device))
    sid_np = sid_tokens.cpu().numpy()
    n_sid = levels - 1  # the last code is only ever predicted
    rows = []
    for i, prompt in enumerate(prompts):
        rows.append((prompt_tokens(prompt, item_tokens, max_items, i), sid_np[i, :, :n_sid].reshape(-1)))
    s = max(len(h) + len(t) for h, t in rows)
    tokens = np.full((b, s), PAD, dtype=np.int64)
    positions = np.zeros((b, s), dtype=np.int64)
    group = np.full((b, s), -2, dtype=np.int64)  # -2 pad, -1 prompt, k: a token of SID k
    index = np.zeros((b, k, levels), dtype=np.int64)
    for r, (head, tail) in enumerate(rows):
        p, start = len(head), s - len(head) - len(tail)
        tokens[r, start:] = np.concatenate([head, tail])
        positions[r, start:] = np.concatenate([np.arange(p), p + np.tile(np.arange(n_sid), k)])
        group[r, start : start + p] = -1
        group[r, start + p :] = np.repeat(np.arange(k), n_sid)
        index[r, :, 0] = r * s + start + p - 1
        index[r, :, 1:] = r * s + start + p + (np.arange(k)[:, None] * n_sid + np.arange(n_sid)[None, :])
    g = torch.from_numpy(group).to(device)
    pos = torch.from_numpy(positions).to(device)
    q_g, k_g = g[:, :, None], g[:, None, :]
    earlier = pos[:, None, :] <= pos[:, :, None]
    sees_prompt = (k_g == -1) & (q_g != -2) & ((q_g >= 0) | earlier)
    sees_own_sid = (q_g >= 0) & (k_g == q_g) & earlier
    eye = torch.eye(s, dtype=torch.bool, device=device)  # a pad query sees itself: no empty softmax row
    return SequenceBatch(
        tokens=torch.from_numpy(tokens).to(device),
        positions=pos,
        attn_mask=sees_prompt | sees_own_sid | eye,
        index=torch.from_numpy(index).to(device),
        sid_tokens=sid_tokens,
    )


def prompt_tokens(prompt: Sequence[int], item_tokens: np.ndarray, max_items: int, i: int) -> np.ndarray:
    """[BOS] and the tokens of the prompt's last `max_items` items."""
    if len(prompt) == 0:
        raise ValueError(f"prompt {i} is empty; a prompt needs at least one item")
    items = np.asarray(prompt[-max_items:], dtype=np.int64)
    return np.concatenate([[BOS], item_tokens[items].reshape(-1)])


def sequence_logits(model: GRTransformer, batch: SequenceBatch, autocast: bool = False) -> Tensor:
    """[B, K, L, V] float32 logits of every teacher SID code, from one packed forward."""
    device = batch.tokens.device
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
        hidden = model.hidden_states(batch.tokens, positions=batch.positions, attn_mask=batch.attn_mask)
        states = hidden.reshape(-1, hidden.shape[-1])[batch.index]  # [B, K, L, D]
        return model.lm_head(states).float()


@torch.no_grad()
def teacher_forced_log_probs(
    model: GRTransformer,
    prompts: Sequence[Sequence[int]],
    codes: Tensor,
    item_tokens: np.ndarray,
    codec: SIDCodec,
    max_items: int,
) -> Tensor:
    """[B, K] each SID's sequence log-probability under `model`: the sum over its levels of the
    full-vocabulary log-softmax at its code's token (what beam search scores), from one packed forward
    (codes [B, K, L])."""
    batch = build_sequence_batch(prompts, codes, item_tokens, codec, max_items, model.device)
    log_probs = torch.log_softmax(sequence_logits(model, batch), dim=-1)
    return log_probs.gather(-1, batch.sid_tokens[..., None]).squeeze(-1).sum(-1)
