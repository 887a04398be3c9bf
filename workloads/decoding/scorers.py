"""Level scorers for the beam core (beam_core.LevelScorer): where each level's log-probs come from.

- `BackboneScorer`: the KV-cached transformer. Level 0 comes from the prefill's last logits; each
  later level is one cached `step` of batch x beam rows after the cache follows the chosen parents.
- `HeadScorer`: a NEZHA / MTP draft head over the prefill's hidden states; no backbone call.

Step l only considers the T_l tokens of SID level l, scored by the full-vocabulary log-softmax (as
Hugging Face beam search with a per-level logits processor does). The level's tokens come from the codec:
a contiguous slice for our level-offset vocabularies (unchanged, bit for bit), a gather at the level's
token ids for an imported one (LC-Rec's tokens are in string order; a gap code scores -inf). With
`level_softmax` the backbone scorer projects only the level's rows of the LM head and normalises over
them (tokenize/level_scores.py): cheaper with a large vocabulary, and not the same scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from genrec.workloads.decoding.base import PhaseTimer
from genrec.workloads.models.kv_cache import KVCache
from genrec.workloads.models.nezha_head import DraftHead
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec
from genrec.workloads.tokenize.level_scores import gather_level_log_probs
from genrec.workloads.tokenize.level_scores import level_log_probs as head_level_log_probs


def level_log_probs(logits: Tensor, start: int, end: int) -> Tensor:
    """Full-vocabulary log-softmax, restricted to one level's token range."""
    return torch.log_softmax(logits.float(), dim=-1)[..., start:end]


def codec_log_probs(logits: Tensor, codec: SIDCodec, level: int) -> Tensor:
    """[..., V] logits -> [..., T_level] full-vocabulary log-probabilities of the level's codes (fp32)."""
    if codec.is_level_offset:  # our models: the contiguous slice, exactly as before
        return level_log_probs(logits, *codec.level_range(level))
    return gather_level_log_probs(logits, codec.level_ids_tensor(level, logits.device))


def hidden_log_probs(model: GRTransformer, hidden: Tensor, codec: SIDCodec, level: int) -> Tensor:
    """`level_softmax`: [..., D] final hidden states -> log-softmax over the level's tokens only."""
    ids = codec.level_ids_tensor(level, hidden.device)
    return head_level_log_probs(hidden, model.lm_head.weight, ids, level_softmax=True)


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
        prefill_hidden: Tensor | None = None,
    ) -> None:
        """`prefill_logits` [rows, V] score the current rows' children. By default `prompt_cache` is the
        prefill's and is expanded to beam_width rows after level 0; with `expanded` it already holds
        beam_width rows per user (a search resumed from decided beams). Given `prefill_hidden` [rows, D],
        levels are scored by `level_softmax` from hidden states and steps skip the full LM head."""
        self.model, self.codec, self.attention = model, codec, attention
        self.logits = prefill_logits  # [B*w, V] of the current rows
        self.hidden = prefill_hidden  # [B*w, D] with level_softmax, else None
        self.level_softmax = prefill_hidden is not None
        self.prompt_cache, self.beam_width = prompt_cache, beam_width
        self.cache: KVCache | None = prompt_cache if expanded else None
        self.timer = PhaseTimer(model.device)
        self.calls = 1  # the prefill

    @property
    def forward_ms(self) -> float:
        return self.timer.ms.get("forward", 0.0)

    def level_log_probs(self, level: int) -> Tensor:
        if self.level_softmax:
            return hidden_log_probs(self.model, self.hidden, self.codec, level)
        return codec_log_probs(self.logits, self.codec, level)

    def advance(self, level: int, parent: Tensor, token: Tensor) -> None:
        if self.cache is None:  # after level 0: the prompt cache viewed as beam_width rows per user
            self.cache = self.prompt_cache.expand(self.beam_width, self.codec.levels - 1)
        else:
            self.cache.reorder(parent)
        with self.timer.phase("forward"):
            tokens = self.codec.level_tokens(level, token)
            if self.level_softmax:  # the full LM head is never needed: only hidden states
                self.hidden = self.model.step(tokens, self.cache, self.attention, logits=False).hidden
            else:
                self.logits = self.model.step(tokens, self.cache, self.attention).logits
        self.calls += 1


@dataclass(frozen=True)
class LevelReader:
    """What a model's forward yields for scoring SID levels, and how a level is read from it: its
    full-vocabulary logits (codec_log_probs), or with `level_softmax` its final hidden states, each level
    scored over its own tokens (hidden_log_probs; the full LM head is never computed)."""

    model: GRTransformer
    codec: SIDCodec
    level_softmax: bool = False

    def of(self, out) -> Tensor:
        """The logits, or the hidden states, of a prefill / extend / step output."""
        return out.hidden if self.level_softmax else out.logits

    def log_probs(self, x: Tensor, level: int) -> Tensor:
        """[..., V] logits or [..., D] hidden states -> [..., T_level] log-probs of the level's codes."""
        if self.level_softmax:
            return hidden_log_probs(self.model, x, self.codec, level)
        return codec_log_probs(x, self.codec, level)

    def scorer(
        self, root: Tensor, cache: KVCache, beam_width: int, attention: str, expanded: bool = False
    ) -> BackboneScorer:
        """A BackboneScorer from `root` (this reader's outputs for the current rows)."""
        hidden = root if self.level_softmax else None
        return BackboneScorer(self.model, self.codec, root, cache, beam_width, attention, expanded, hidden)


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
