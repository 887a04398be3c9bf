"""The sequences a sequence objective aligns on with all-step teacher data (`--all-steps`, the paper's
Table 5 "w/ AD").

Without it, D' holds per example the K final teacher SIDs, each a sequence of L levels. With it, D'
also holds, for every step t = 1..L-1, the target's K beams after level t (teacher_steps.py), each a
sequence of t codes. Every sequence's loss is the mean over its own levels (the 1/|y| of the
appendix's eq. 33-34), and the objective averages over all sequences, so a step-t beam weighs as much
as a final SID.

One packed forward per batch (align_sequence_batch.py) teacher-forces whole SIDs, so a step-t prefix
is completed with the remaining codes of a catalogue item that starts with it (`complete_prefixes`).
Its levels past t carry weight 0: a level's term depends only on its context c_<t, which for the
counted levels is the prefix itself, so the completion is never counted.

Layout: group 0 is the final top-K, group t the step-t beams; sequence g * K + j is beam j of group g.
A step that kept fewer than K beams (fewer valid prefixes than K) repeats its last kept beam in the
empty slots with weight 0, so slot K - 1 of a group is always its K-th (or last) beam: AtSpeed-S's
y_K, whose target conditionals weight the density term.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from genrec.workloads.errors import UserInputError
from genrec.workloads.sid_codec import SIDCodec
from genrec.workloads.training.teacher_steps import MISSING


@dataclass(frozen=True)
class AlignSequences:
    """The sequences of one batch: what to teacher-force, which levels count, and each one's y_K."""

    codes: Tensor  # [B, S, L] catalogue SIDs, S = G * K sequences per example
    weight: Tensor  # [B, S, L] 1.0 at the levels a sequence's loss counts, else 0.0
    kth: Tensor  # [S] the index of each sequence's group's K-th sequence (y_K)


def complete_prefixes(
    prefixes: np.ndarray, lengths: np.ndarray, item_codes: np.ndarray, codec: SIDCodec
) -> np.ndarray:
    """[..., L] the SID of the first catalogue item (in key order) whose first `lengths` codes are
    those of `prefixes` [..., L] (codes past the length are ignored); lengths [...] in 1..L."""
    keys = np.sort(codec.codes_to_keys(item_codes))
    radix = codec.radix_weights()
    counted = np.arange(codec.levels) < lengths[..., None]
    low = (np.where(counted, prefixes, 0) * radix).sum(-1)  # the prefix's first SID key
    span = radix[lengths - 1]  # keys under the prefix: [low, low + span)
    at = np.minimum(np.searchsorted(keys, low), len(keys) - 1)
    if not (keys[at] >= low).all() or not (keys[at] < low + span).all():
        raise UserInputError(
            "the teacher file holds a step beam that no catalogue item starts with; rebuild it with "
            "`genrec atspeed teacher --all-steps` on this dataset"
        )
    return np.asarray(codec.keys_to_codes(keys[at]))


def all_step_sequences(
    codes: np.ndarray,
    step_codes: np.ndarray,
    item_codes: np.ndarray,
    codec: SIDCodec,
    n_align: int,
    device: torch.device | str = "cpu",
) -> AlignSequences:
    """The final SIDs codes [B, K, L] and the step beams step_codes [B, L - 1, K, L] (teacher file
    layout) as one batch of sequences (module doc); the first `n_align` beams of each group count."""
    b, k, levels = codes.shape
    kept = step_codes[..., 0] != MISSING  # [B, L - 1, K]; a step's kept beams come first
    last = np.maximum(kept.sum(-1, keepdims=True) - 1, 0)
    fill = np.minimum(np.arange(k), last)  # an empty slot repeats the step's last kept beam
    steps = np.take_along_axis(step_codes, fill[..., None], axis=2)
    step_len = np.broadcast_to(np.arange(1, levels)[None, :, None], kept.shape)
    completed = complete_prefixes(steps, step_len, item_codes, codec)
    groups = np.concatenate([codes[:, None], completed], axis=1)  # [B, G, K, L]
    length = np.concatenate([[levels], np.arange(1, levels)])  # levels per sequence of each group
    counts = np.concatenate([np.ones((b, 1, k), bool), kept], axis=1) & (np.arange(k) < n_align)
    weight = (np.arange(levels) < length[:, None])[None, :, None, :] & counts[..., None]
    g = groups.shape[1]
    kth = np.repeat(np.arange(g) * k + k - 1, k)
    return AlignSequences(
        codes=torch.as_tensor(groups.reshape(b, g * k, levels), device=device),
        weight=torch.as_tensor(weight.reshape(b, g * k, levels), dtype=torch.float32, device=device),
        kth=torch.as_tensor(kth, device=device),
    )


def sequence_mean(per_level: Tensor, weight: Tensor) -> Tensor:
    """Mean over the sequences with any counted level of each one's mean over its counted levels
    (per_level, weight [B, S, L])."""
    counted = weight.sum(-1)
    per_sequence = (per_level * weight).sum(-1) / counted.clamp(min=1.0)
    return per_sequence.sum() / (counted > 0).sum().clamp(min=1)


def own_token_log_probs(logits: Tensor, tokens: Tensor) -> Tensor:
    """[B, S, L] each sequence's full-vocabulary log-probability of its own token at every level."""
    logits = logits.detach().float()
    return logits.gather(-1, tokens[..., None]).squeeze(-1) - logits.logsumexp(-1)
