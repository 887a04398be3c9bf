"""AtSpeed's token-level baselines (`--objective wordkd|tvdkd`); notation as in align.py.

Token-level baselines, on the training windows' target SID tokens (teacher forcing on the data; the
target runs on the same batch in the same step, without gradients, so nothing is cached):
    WordKD   forward KL, sum_{v in level t} p(v|c) log(p(v|c) / q(v|c))           (Hinton; Sanh)
    TVDKD    total variation, 1/2 sum_{v in level t} |p(v|c) - q(v|c)|             (Wen et al.)
both restricted to the codes of the level being predicted and averaged over the positions.
"""

from __future__ import annotations

import torch
from torch import Tensor

from genrec.workloads.models.inputs import IGNORE
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec


def token_levels(tokens: Tensor, codec: SIDCodec) -> Tensor:
    """The SID level (0-based) of each token id, -1 for tokens of no level (special tokens)."""
    levels = torch.full_like(tokens, -1)
    for level in range(codec.levels):
        lo, hi = codec.level_range(level)
        levels = torch.where((tokens >= lo) & (tokens < hi), level, levels)
    return levels


def _level_pairs(draft_logits: Tensor, target_logits: Tensor, levels: Tensor, codec: SIDCodec):
    """Per level present: (draft, target) full-vocab log-softmax at that level's positions, restricted
    to the level's code range (not renormalised: the scores beam search uses)."""
    if not bool((levels >= 0).all()):
        raise ValueError("every position must predict a SID code (levels >= 0)")
    for level in range(codec.levels):
        sel = levels == level
        if sel.any():
            lo, hi = codec.level_range(level)
            yield tuple(
                torch.log_softmax(x[sel].float(), dim=-1)[:, lo:hi] for x in (draft_logits, target_logits)
            )


def wordkd_loss(draft_logits: Tensor, target_logits: Tensor, levels: Tensor, codec: SIDCodec) -> Tensor:
    """WordKD: mean over positions of sum_{v in level} p(v) log(p(v) / q(v)) (forward KL, target first).

    draft_logits, target_logits [N, V] at N positions predicting a code of `levels` [N]; p and q are
    the full-vocabulary softmaxes read on the predicted level's codes (as beam search scores them).
    """
    total = draft_logits.new_zeros((), dtype=torch.float32)
    for lq, lp in _level_pairs(draft_logits, target_logits, levels, codec):
        total = total + (lp.exp() * (lp - lq)).sum()
    return total / len(levels)


def tvdkd_loss(draft_logits: Tensor, target_logits: Tensor, levels: Tensor, codec: SIDCodec) -> Tensor:
    """TVDKD: mean over positions of 1/2 sum_{v in level} |p(v) - q(v)| (total variation distance).

    Same inputs and per-level restriction as `wordkd_loss`.
    """
    total = draft_logits.new_zeros((), dtype=torch.float32)
    for lq, lp in _level_pairs(draft_logits, target_logits, levels, codec):
        total = total + 0.5 * (lp.exp() - lq.exp()).abs().sum()
    return total / len(levels)


def labelled_logits(
    model: GRTransformer, tokens: Tensor, mask: Tensor, labels: Tensor, autocast: bool = False
) -> tuple[Tensor, Tensor]:
    """(float32 logits [N, V], labels [N]) at the labelled positions of a next-item batch, computed
    as trainer.target_loss computes them (only labelled positions go through lm_head)."""
    sel = labels != IGNORE
    with torch.autocast(device_type=tokens.device.type, dtype=torch.bfloat16, enabled=autocast):
        hidden = model.hidden_states(tokens, mask)
        logits = model.lm_head(hidden[sel])
    return logits.float(), labels[sel]
