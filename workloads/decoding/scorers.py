"""Level scorers for the beam core (beam_core.LevelScorer): where each level's log-probs come from.

- `BackboneScorer`: the KV-cached transformer. Level 0 comes from the prefill's last logits; each
  later level is one cached `step` of batch x beam rows after the cache follows the chosen parents.
- `HeadScorer`: a NEZHA / MTP draft head over the prefill's hidden states; no backbone call.

Step l only considers the T_l tokens of SID level l, scored by the full-vocabulary log-softmax (as
Hugging Face beam search with a per-level logits processor does).
"""

from __future__ import annotations

import torch
from torch import Tensor

from genrec.workloads.decoding.base import PhaseTimer
from genrec.workloads.models.kv_cache import KVCache
from genrec.workloads.models.nezha_head import DraftHead
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec


def level_log_probs(logits: Tensor, start: int, end: int) -> Tensor:
    """Full-vocabulary log-softmax, restricted to one level's token range."""
    return torch.log_softmax(logits.float(), dim=-1)[..., start:end]


class BackboneScorer:
    """Log-probs from the cached backbone; `forward_ms` is the model's share of decode time."""

    def __init__(
        self,
        model: GRTransformer,
        codec: SIDCodec,
        prefill_logits: Tensor,
        prompt_cache: KVCache,
        beam_width: int,
        attention: str = "torch",
        expanded: bool = False,
    ) -> None:
        """`prefill_logits` [rows, V] score the current rows' children. By default `prompt_cache` is the
        prefill's and is expanded to beam_width rows after level 0; with `expanded` it already holds
        beam_width rows per user (a search resumed from decided beams)."""
        self.model, self.codec, self.attention = model, codec, attention
        self.logits = prefill_logits  # [B*w, V] of the current rows
        self.prompt_cache, self.beam_width = prompt_cache, beam_width
        self.cache: KVCache | None = prompt_cache if expanded else None
        self.timer = PhaseTimer(model.device)
        self.calls = 1  # the prefill

    @property
    def forward_ms(self) -> float:
        return self.timer.ms.get("forward", 0.0)

    def level_log_probs(self, level: int) -> Tensor:
        return level_log_probs(self.logits, *self.codec.level_range(level))

    def advance(self, level: int, parent: Tensor, token: Tensor) -> None:
        if self.cache is None:  # after level 0: the prompt cache viewed as beam_width rows per user
            self.cache = self.prompt_cache.expand(self.beam_width, self.codec.levels - 1)
        else:
            self.cache.reorder(parent)
        with self.timer.phase("forward"):
            tokens = token + self.codec.level_offset(level)
            self.logits = self.model.step(tokens, self.cache, self.attention).logits
        self.calls += 1


class HeadScorer:
    """Log-probs from a draft head: states [B, L+1, D] (or [B, 1, D]), one context state per beam."""

    def __init__(self, head: DraftHead, states: Tensor) -> None:
        self.head, self.states = head, states
        self.batch = states.shape[0]
        self.s = head.init_state(states)  # [B*w, D] or None
        self.beams = 1

    def level_log_probs(self, level: int) -> Tensor:
        logits = self.head.beam_logits(level, self.states, self.s, self.beams)  # [B, w, T]
        return torch.log_softmax(logits.float(), dim=-1).view(self.batch * self.beams, -1)

    def advance(self, level: int, parent: Tensor, token: Tensor) -> None:
        s_parent = self.s.index_select(0, parent) if self.s is not None else None
        self.s = self.head.transition(level, s_parent, token)
        self.beams = parent.shape[0] // self.batch
