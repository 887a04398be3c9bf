"""Every context of a batch of alignment sequences, scored once: a packed prefix tree per example.

A sequence objective's level-t term depends only on its context c_<t = (x, y_<t) (align.py), and the
sequences share most of their contexts: the K final SIDs share prefixes, and with all-step data the
step beams grow from the same few prefixes (align_sequences.py). So instead of teacher-forcing every
sequence (one token per sequence and level), the batch lays out each distinct context once, as a
node of a prefix tree after the prompt:

    [pad..] [BOS] prompt tokens | one token per distinct non-empty prefix, shorter prefixes first

A prefix's token is its last code; it sees the whole prompt and its own ancestors (the prefixes it
extends), at the RoPE position it would have right after the prompt, so its state equals that of the
plain row [BOS] prompt prefix. Context 0 of every row is the empty prefix (the prompt's last state).
`ctx` maps level l of sequence s to the context its term is read at; losses are computed once per
context and gathered per (sequence, level) (align_sequences.py has the weights).
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
class ContextTree:
    """One batch's distinct contexts as a packed tree (module doc)."""

    tokens: Tensor  # [B, T] left-padded
    positions: Tensor  # [B, T] RoPE positions
    attn_mask: Tensor  # [B, T, T] True = the query (row) may attend the key (column)
    state: Tensor  # [B, C] flat index into the B*T states of the state predicting from each context
    prefix: Tensor  # [B, C, L] each context's codes (0 past its length)
    length: Tensor  # [B, C] each context's length (0: the prompt alone; contexts past a row's own: 0)
    ctx: Tensor  # [B, S, L] the context of level l of sequence s (0 at levels past its length)


@dataclass(frozen=True)
class RowContexts:
    """One example's distinct contexts, sorted by length then key (the empty prefix first)."""

    prefix: np.ndarray  # [C, L] codes (0 past the length)
    length: np.ndarray  # [C]
    parent: np.ndarray  # [C] index of the context one code shorter (-1 for the empty prefix)
    ctx: np.ndarray  # [S, L] the context of every sequence's levels (0 past its length)


def row_contexts(codes: np.ndarray, lengths: np.ndarray, codec: SIDCodec) -> RowContexts:
    """The distinct contexts of one example's sequences codes [S, L] of lengths [S]."""
    s, levels = codes.shape
    key = np.zeros((s, levels), dtype=np.int64)  # key[:, l]: the mixed-radix key of the first l codes
    for level in range(1, levels):
        key[:, level] = key[:, level - 1] * codec.codebook_sizes[level - 1] + codes[:, level - 1]
    used = np.arange(levels)[None, :] < lengths[:, None]
    span = codec.num_sids + 1  # ids of different lengths never meet: a key of l codes is < num_sids
    ids = np.where(used, np.arange(levels)[None, :] * span + key, 0)
    unique, first, inverse = np.unique(ids.reshape(-1), return_index=True, return_inverse=True)
    seq, length = np.divmod(first, levels)
    prefix = np.where(np.arange(levels)[None, :] < length[:, None], codes[seq], 0)
    parent_key = key[seq, np.maximum(length - 1, 0)]
    parent = np.where(length > 0, np.searchsorted(unique, (length - 1) * span + parent_key), -1)
    return RowContexts(prefix, length, parent, inverse.reshape(s, levels))


def prompt_tokens(prompt: Sequence[int], item_tokens: np.ndarray, max_items: int, i: int) -> np.ndarray:
    """[BOS] and the tokens of the prompt's last `max_items` items."""
    if len(prompt) == 0:
        raise ValueError(f"prompt {i} is empty; a prompt needs at least one item")
    items = np.asarray(prompt[-max_items:], dtype=np.int64)
    return np.concatenate([[BOS], item_tokens[items].reshape(-1)])


def build_context_tree(
    prompts: Sequence[Sequence[int]],
    codes: np.ndarray,
    lengths: np.ndarray,
    item_tokens: np.ndarray | None,
    codec: SIDCodec,
    max_items: int,
    device: torch.device | str = "cpu",
    heads: Sequence[np.ndarray] | None = None,
    pad: int = PAD,
) -> ContextTree:
    """The tree of the contexts of sequences codes [B, S, L] (codes past a sequence's length ignored),
    lengths [S] (1..L), after each prompt (its last `max_items` items). `heads` gives each row's prompt
    tokens instead of [BOS] + its SID tokens (an imported target's template prompt; `pad` its padding):
    the contexts depend on the codes alone, so they keep their slots."""
    b, _, levels = codes.shape
    if len(prompts) != b:
        raise ValueError(f"{len(prompts)} prompts for {b} rows of codes")
    rows = [row_contexts(codes[i], lengths, codec) for i in range(b)]
    if heads is None:
        assert item_tokens is not None
        heads = [prompt_tokens(prompt, item_tokens, max_items, i) for i, prompt in enumerate(prompts)]
    n_ctx = max(len(r.length) for r in rows)
    width = max(len(h) + len(r.length) - 1 for h, r in zip(heads, rows))
    tokens = np.full((b, width), pad, dtype=np.int64)
    positions = np.zeros((b, width), dtype=np.int64)
    mask = np.zeros((b, width, width), dtype=bool)
    state = np.zeros((b, n_ctx), dtype=np.int64)
    prefix = np.zeros((b, n_ctx, levels), dtype=np.int64)
    length = np.zeros((b, n_ctx), dtype=np.int64)
    for r, (head, row) in enumerate(zip(heads, rows)):
        start = width - len(head) - len(row.length) + 1
        p, n = len(head), len(row.length)
        nodes = start + p + np.arange(n - 1)  # slot of context 1.. (context 0 is the prompt's last token)
        tokens[r, start : start + p] = head
        tokens[r, nodes] = [
            codec.level_token_ids(l - 1)[row.prefix[c, l - 1]] for c, l in enumerate(row.length) if c
        ]
        positions[r, start : start + p] = np.arange(p)
        positions[r, nodes] = p + row.length[1:] - 1
        prompt = np.arange(start, start + p)
        mask[r, prompt[:, None], prompt[None, :]] = prompt[None, :] <= prompt[:, None]  # causal prompt
        mask[r, nodes[:, None], prompt[None, :]] = True  # a node sees the whole prompt ...
        for c in range(1, n):  # ... and its own ancestors (walk up the parents)
            up = c
            while up > 0:
                mask[r, nodes[c - 1], nodes[up - 1]] = True
                up = row.parent[up]
        pad = np.arange(start)
        mask[r, pad, pad] = True  # a pad query sees itself: no empty softmax row
        state[r, :n] = r * width + np.concatenate([[start + p - 1], nodes])
        state[r, n:] = r * width + start + p - 1  # unused contexts read the prompt's state
        prefix[r, :n], length[r, :n] = row.prefix, row.length
    t = torch.as_tensor
    ctx = np.stack([row.ctx for row in rows])
    return ContextTree(
        t(tokens, device=device), t(positions, device=device), t(mask, device=device),
        t(state, device=device), t(prefix, device=device), t(length, device=device), t(ctx, device=device),
    )  # fmt: skip


def context_hidden(model: GRTransformer, tree: ContextTree, autocast: bool = False) -> Tensor:
    """[B, C, D] final hidden states predicting the next code at every context (one packed forward)."""
    device = tree.tokens.device
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
        hidden = model.hidden_states(tree.tokens, positions=tree.positions, attn_mask=tree.attn_mask)
    return hidden.reshape(-1, hidden.shape[-1])[tree.state]


def context_logits(model: GRTransformer, tree: ContextTree, autocast: bool = False) -> Tensor:
    """[B, C, V] float32 logits of the next code at every context, from one packed forward."""
    device = tree.tokens.device
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
        return model.lm_head(context_hidden(model, tree, autocast)).float()


def token_log_probs(logits: Tensor, tree: ContextTree, tokens: Tensor) -> Tensor:
    """[B, S, L] log-softmax(logits at the level's context)[its token]; logits [B, C, V]."""
    b, s, levels = tokens.shape
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    flat = (tree.ctx * logits.shape[-1] + tokens).reshape(b, -1)
    return log_probs.reshape(b, -1).gather(1, flat).reshape(b, s, levels)


@torch.no_grad()
def teacher_forced_log_probs(
    model: GRTransformer,
    prompts: Sequence[Sequence[int]],
    codes: np.ndarray,
    item_tokens: np.ndarray,
    codec: SIDCodec,
    max_items: int,
) -> Tensor:
    """[B, K] each SID's sequence log-probability under `model`: the sum over its levels of the
    full-vocabulary log-softmax at its code's token (what beam search scores), from one tree forward
    (codes [B, K, L])."""
    b, k, levels = codes.shape
    tree = build_context_tree(prompts, codes, np.full(k, levels), item_tokens, codec, max_items, model.device)
    tokens = codec.codes_to_tokens(torch.as_tensor(codes, device=model.device))
    return token_log_probs(context_logits(model, tree), tree, tokens).sum(-1)
