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
    """The SID level (0-based) of each token id, -1 for tokens of no level (special tokens); through the
    codec's token table, so an imported vocabulary (levels not contiguous) works as ours does."""
    inside = (tokens >= 0) & (tokens < codec.vocab_size)  # IGNORE and the like are no token at all
    levels = codec.level_of_token(tokens.clamp(0, codec.vocab_size - 1)).to(tokens.dtype)
    return torch.where(inside, levels, torch.full_like(levels, -1))


def _level_pairs(draft_logits: Tensor, target_logits: Tensor, levels: Tensor, codec: SIDCodec):
    """Per level present: (draft, target) full-vocab log-softmax at that level's positions, restricted
    to the level's tokens (not renormalised: the scores beam search uses). The level's ids come from the
    token table without its gaps (codes without a token have no probability to compare)."""
    if not bool((levels >= 0).all()):
        raise ValueError("every position must predict a SID code (levels >= 0)")
    for level in range(codec.levels):
        sel = levels == level
        if sel.any():
            ids = torch.as_tensor(codec.level_allowed_ids(level), device=draft_logits.device)
            yield tuple(
                torch.log_softmax(x[sel].float(), dim=-1)[:, ids] for x in (draft_logits, target_logits)
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
