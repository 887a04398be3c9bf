"""A SID level's scores from the LM head: full-vocabulary log-softmax, or the `level_softmax` shortcut.

At SID level l a GR decoder ranks the level's T_l codes. Two ways to score them:

- full (the default): log-softmax over the whole vocabulary, read at the level's token ids. This is what
  Hugging Face `generate` scores when a prefix-allowed-tokens function (or a level mask) keeps only the
  level's tokens: its beam search masks the log-probabilities, it does not renormalise them. Beam search
  on an imported checkpoint must use it to agree with `hf_beam`.
- `level_softmax`: log-softmax over the level's tokens only. Only those T_l rows of the LM head are
  multiplied (T_l x D instead of V x D: 256 rows against 150k for a Qwen vocabulary), so the step is far
  cheaper. The scores differ from the full ones by a per-row constant (the log of the probability mass
  the model puts on the level), so a single step ranks the same codes, but beams of different prefixes
  compare differently: its effect on quality is to be measured, not assumed.

The level's ids come from the codec (`codec.level_token_ids(level)`, any order, not necessarily a
contiguous range); an id of -1 marks a code without a token (a gap in an LC-Rec vocabulary), whose
score is -inf in both modes. Matmuls run in the weights' dtype as the model's own head does; softmax and
scores are fp32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from genrec.workloads.sid_codec import SIDCodec


def level_ids_tensor(codec: SIDCodec, level: int, device: torch.device | str) -> Tensor:
    """The level's token ids (indexed by code) as an int64 tensor on `device`."""
    return torch.as_tensor(codec.level_token_ids(level), dtype=torch.long, device=device)


def _mask_gaps(scores: Tensor, level_ids: Tensor) -> Tensor:
    # always applied (no host sync to ask whether there are gaps); a no-op on a gapless level
    return scores.masked_fill(level_ids < 0, float("-inf"))


def gather_level_log_probs(logits: Tensor, level_ids: Tensor) -> Tensor:
    """[..., V] full logits -> [..., T] full-vocabulary log-probabilities at the level's ids (fp32)."""
    logp = torch.log_softmax(logits.float(), dim=-1).index_select(-1, level_ids.clamp(min=0))
    return _mask_gaps(logp, level_ids)


def level_log_probs(
    hidden: Tensor,
    lm_head_weight: Tensor,
    level_ids: Tensor,
    level_softmax: bool = False,
) -> Tensor:
    """[..., D] final hidden states -> [..., T] log-probabilities of the level's codes (fp32).

    `lm_head_weight` is [V, D] (a tied head passes the embedding matrix). With `level_softmax`, only the
    level's rows of the head are computed and the softmax runs over them.
    """
    if level_softmax:
        rows = lm_head_weight.index_select(0, level_ids.clamp(min=0))  # [T, D]
        logits = _mask_gaps((hidden.to(rows.dtype) @ rows.T).float(), level_ids)
        return torch.log_softmax(logits, dim=-1)
    logits = hidden.to(lm_head_weight.dtype) @ lm_head_weight.T
    return gather_level_log_probs(logits, level_ids)


def renormalise_over_level(full_log_probs: Tensor) -> Tensor:
    """[..., T] full-vocabulary log-probabilities of one level -> log-softmax over the level's tokens.

    The slow reference for `level_softmax`: renormalising gathered log-probabilities equals the softmax
    of the gathered logits (the full normaliser cancels).
    """
    return full_log_probs - torch.logsumexp(full_log_probs, dim=-1, keepdim=True)
