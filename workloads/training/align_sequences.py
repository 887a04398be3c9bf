"""The sequences a sequence objective (SeqKD, AtSpeed-S, AtSpeed-R) aligns on, and its loss over them.

The teacher file holds per example the K final teacher SIDs, each a sequence of L levels. With
`--all-steps` (the paper's Table 5 "w/ AD") it also holds, for every step t = 1..L-1, the target's K
beams after level t (teacher_steps.py), each a sequence of t codes. Every sequence's loss is the mean
over its own levels (the 1/|y| of the appendix's eq. 33-34), and the objective averages over all
sequences, so a step-t beam weighs as much as a final SID. Without step beams this is the mean over
(example, SID) of the per-SID level mean, eq. 4 and 8 as align_sequence_level.py reads them.

Layout: group 0 is the final top-K, group t the step-t beams; sequence g * K + j is beam j of group g.
A step that kept fewer than K beams (fewer valid prefixes than K) repeats its last kept beam in the
empty slots with weight 0, so slot K - 1 of a group is always its K-th (or last) beam: AtSpeed-S's
y_K, whose target conditionals weight the density term.

Scoring: a level's term depends only on its context c_<t, and these sequences share most of their
contexts (the final SIDs share prefixes, and they and the step beams all grow from the step beams),
so each distinct context is scored once (align_context_tree.py) and its terms are gathered per
(sequence, level).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from genrec.workloads.decoding.prefix_keys import PrefixKeySets
from genrec.workloads.sid_codec import SIDCodec
from genrec.workloads.training.align_context_tree import ContextTree, token_log_probs
from genrec.workloads.training.align_sequence_level import (
    atspeed_s_terms,
    negative_entropy_on_support,
    reverse_kl_on_support,
    support_log_probs,
)
from genrec.workloads.training.teacher_steps import MISSING


@dataclass(frozen=True)
class AlignSequences:
    """The sequences of one batch: their codes and lengths, which levels count, and each one's y_K."""

    codes: np.ndarray  # [B, S, L] codes (0 past a sequence's length), S = G * K sequences per example
    lengths: np.ndarray  # [S] levels per sequence (L for the final SIDs, t for a step-t beam)
    weight: Tensor  # [B, S, L] 1.0 at the levels a sequence's loss counts, else 0.0
    kth: Tensor  # [S] the index of each sequence's group's K-th sequence (y_K)


def all_step_sequences(
    codes: np.ndarray, step_codes: np.ndarray, n_align: int, device: torch.device | str = "cpu"
) -> AlignSequences:
    """The final SIDs codes [B, K, L] and the step beams step_codes [B, L - 1, K, L] (teacher file
    layout) as one batch of sequences (module doc); the first `n_align` beams of each group count."""
    b, k, levels = codes.shape
    kept = step_codes[..., 0] != MISSING  # [B, L - 1, K]; a step's kept beams come first
    last = np.maximum(kept.sum(-1, keepdims=True) - 1, 0)
    fill = np.minimum(np.arange(k), last)  # an empty slot repeats the step's last kept beam
    steps = np.maximum(np.take_along_axis(step_codes, fill[..., None], axis=2), 0)
    groups = np.concatenate([codes[:, None], steps], axis=1)  # [B, G, K, L]
    length = np.concatenate([[levels], np.arange(1, levels)])  # levels per sequence of each group
    counts = np.concatenate([np.ones((b, 1, k), bool), kept], axis=1) & (np.arange(k) < n_align)
    weight = (np.arange(levels) < length[:, None])[None, :, None, :] & counts[..., None]
    g = groups.shape[1]
    return AlignSequences(
        codes=groups.reshape(b, g * k, levels),
        lengths=np.repeat(length, k),
        weight=torch.as_tensor(weight.reshape(b, g * k, levels), dtype=torch.float32, device=device),
        kth=torch.as_tensor(np.repeat(np.arange(g) * k + k - 1, k), device=device),
    )


def final_sequences(codes: np.ndarray, n_align: int, device: torch.device | str = "cpu") -> AlignSequences:
    """The final SIDs codes [B, n, L] alone, as one group (no step beams); the first `n_align` count and
    the last is y_K."""
    b, n, levels = codes.shape
    counted = (torch.arange(n, device=device) < n_align).float()
    return AlignSequences(
        codes=codes,
        lengths=np.full(n, levels),
        weight=counted[None, :, None].expand(b, n, levels).contiguous(),
        kth=torch.full((n,), n - 1, device=device),
    )


def sequence_mean(per_level: Tensor, weight: Tensor) -> Tensor:
    """Mean over the sequences with any counted level of each one's mean over its counted levels
    (per_level, weight [B, S, L])."""
    counted = weight.sum(-1)
    per_sequence = (per_level * weight).sum(-1) / counted.clamp(min=1.0)
    return per_sequence.sum() / (counted > 0).sum().clamp(min=1)


def sequence_tokens(codes: np.ndarray, codec: SIDCodec, device: torch.device | str) -> Tensor:
    """[B, S, L] the vocabulary token of every code (codes past a length are 0: some real token)."""
    return codec.codes_to_tokens(torch.as_tensor(codes, device=device))


def per_level(context_values: Tensor, tree: ContextTree) -> Tensor:
    """[B, S, L] a per-context value [B, C] read at every sequence level's context."""
    b, s, levels = tree.ctx.shape
    return context_values.gather(1, tree.ctx.reshape(b, -1)).reshape(b, s, levels)


def context_valid_mask(tree: ContextTree, codec: SIDCodec, prefixes: PrefixKeySets) -> Tensor:
    """[B, C, V] bool: the codes of the next level that extend each context to a valid item-SID prefix
    (the constrained vocabulary there)."""
    b, c, levels = tree.prefix.shape
    out = torch.zeros(b, c, codec.vocab_size, dtype=torch.bool, device=tree.prefix.device)
    key = torch.zeros(b, c, dtype=torch.long, device=tree.prefix.device)  # key of the first l codes
    for level in range(levels):
        ids = torch.as_tensor(codec.level_token_ids(level), device=out.device)
        has = ids >= 0  # a code without a token (an imported table's gap) is never a valid child
        here = (tree.length == level)[..., None]
        out[..., ids[has]] = (here & prefixes.valid_children(level, key))[..., has]
        key = key * codec.codebook_sizes[level] + tree.prefix[..., level]
    return out


def context_tree_loss(
    kind: str,
    draft: Tensor,
    target: Tensor | None,
    tree: ContextTree,
    seqs: AlignSequences,
    tokens: Tensor,
    support: Tensor | None,
    density_reg: bool = True,
    dr_mode: str = "weighted",
) -> Tensor:
    """The sequence objective `kind` over the sequences `seqs` from the draft's and target's logits at every
    context (draft, target [B, C, V]; tokens [B, S, L] the sequences' tokens; support [B, C, V] V_c),
    each term as align_sequence_level.py defines it, averaged as the module doc says:
        seqkd      mean over the counted (sequence, level) tokens of -log q(y_t | c_<t)
        atspeed_s  sequence_mean of KL(q' || p') + w_t H(q'), w_t from the group's y_K
        atspeed_r  sequence_mean of TVD(p', q') on V_c"""
    if kind == "seqkd":
        nll = -token_log_probs(draft, tree, tokens)
        return (nll * seqs.weight).sum() / seqs.weight.sum().clamp(min=1.0)
    assert target is not None and support is not None
    lq, lq0 = support_log_probs(draft, support)
    lp, lp0 = support_log_probs(target, support)
    if kind == "atspeed_r":
        tvd = 0.5 * (lp.exp() - lq.exp()).abs().sum(-1)  # [B, C]
        return sequence_mean(per_level(tvd, tree), seqs.weight)
    rkld = per_level(reverse_kl_on_support(lq, lq0, lp0), tree)
    neg_entropy = per_level(negative_entropy_on_support(lq, lq0), tree)
    with torch.no_grad():
        log_w = token_log_probs(target, tree, tokens)[:, seqs.kth]  # p(y_{K,t} | y_{K,<t}) of the group
    terms = atspeed_s_terms(rkld, neg_entropy, log_w, density_reg, dr_mode)
    return sequence_mean(terms, seqs.weight)
