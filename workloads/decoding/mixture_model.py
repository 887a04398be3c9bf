"""A token-level mixture of AtSpeed's draft q and target p, presented as one model to the beam search.

AtSpeed builds the draft's alignment data from the top K of the mixture (1 - lambda) q + lambda p
(paper section 3.1, D'; footnote 3: "target LLM-mixed sampling" after MiniLLM): per token,

    m(v | prefix) = (1 - lambda) q(v | prefix) + lambda p(v | prefix),

each a full-vocabulary softmax, as beam search scores one model (scorers.level_log_probs). A SID's
mixture score is the sum over levels of log m, so lambda = 1 is the target's beam search and
lambda = 0 the draft's.

`MixtureModel` wraps the two models behind the calls `beam` drives on one (beam.py / scorers.py:
`prefill`, `step` = `extend` with one token, and on the returned cache `expand` and `reorder`), each
call going to both models and both caches (`MixtureCache`). Its "logits" are log m itself: a
normalised log-distribution, so the scorer's log-softmax returns it again (up to rounding) and the
existing `beam` decoder, constraint processor included, searches the mixture unchanged.
`mixture_context` puts it into a DecoderContext in place of the target. Hidden states are the
target's (beam search never reads them; they only keep the output types).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from genrec.workloads.decoding.base import DecoderContext
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.kv_cache import KVCache
from genrec.workloads.models.transformer import ExtendOutput, GRTransformer, PrefillOutput, StepOutput

NEG_INF = float("-inf")


def check_mix_lambda(mix_lambda: float) -> float:
    """lambda is the target's weight in the mixture: a probability."""
    if not 0.0 <= mix_lambda <= 1.0:  # also refuses NaN
        raise UserInputError(
            f"--mix-lambda must be in [0, 1] (the target's weight in the mixture), got {mix_lambda}"
        )
    return float(mix_lambda)


def mixture_log_probs(draft_logits: Tensor, target_logits: Tensor, mix_lambda: float) -> Tensor:
    """log m = logaddexp(log(1 - lambda) + log q, log lambda + log p), full vocabulary, float32.

    A weight of 0 is -inf in log space (not log of a clamped epsilon), so lambda = 1 returns log p and
    lambda = 0 log q exactly."""
    log_q = torch.log_softmax(draft_logits.float(), dim=-1)
    log_p = torch.log_softmax(target_logits.float(), dim=-1)
    w_q = math.log1p(-mix_lambda) if mix_lambda < 1.0 else NEG_INF
    w_p = math.log(mix_lambda) if mix_lambda > 0.0 else NEG_INF
    return torch.logaddexp(log_q + w_q, log_p + w_p)


class MixtureCache:
    """The draft's and the target's KV caches, expanded and reordered together."""

    def __init__(self, draft: KVCache, target: KVCache) -> None:
        self.draft, self.target = draft, target

    @property
    def rows(self) -> int:
        return self.target.rows

    @property
    def steps(self) -> int:
        return self.target.steps

    def expand(self, beams: int, max_steps: int, indexed: bool = False) -> MixtureCache:
        return MixtureCache(
            self.draft.expand(beams, max_steps, indexed), self.target.expand(beams, max_steps, indexed)
        )

    def reorder(self, parent: Tensor) -> None:
        self.draft.reorder(parent)
        self.target.reorder(parent)


class MixtureModel:
    """Draft and target behind one model's decoding calls; the logits returned are log m (module doc)."""

    def __init__(self, draft: GRTransformer, target: GRTransformer, mix_lambda: float) -> None:
        d, t = draft.config.vocab_size, target.config.vocab_size
        if d != t:
            raise UserInputError(
                f"the draft has a vocabulary of {d} tokens, the target {t}; a mixture needs one codec: "
                "train the draft on the target's dataset and tokenisation"
            )
        if draft.device != target.device:
            raise ValueError(f"draft on {draft.device}, target on {target.device}; load both on one device")
        self.draft, self.target = draft, target
        self.mix_lambda = check_mix_lambda(mix_lambda)

    @property
    def device(self) -> torch.device:
        return self.target.device

    def prefill(self, tokens: Tensor, mask: Tensor, return_all_hidden: bool = False) -> PrefillOutput:
        q = self.draft.prefill(tokens, mask)
        p = self.target.prefill(tokens, mask, return_all_hidden)
        logits = mixture_log_probs(q.logits, p.logits, self.mix_lambda)
        return PrefillOutput(logits, p.hidden, MixtureCache(q.cache, p.cache), p.all_hidden)

    def extend(
        self,
        tokens: Tensor,
        cache: MixtureCache,
        tree_mask: Tensor | None = None,
        attention: str = "torch",
    ) -> ExtendOutput:
        q = self.draft.extend(tokens, cache.draft, tree_mask, attention)
        p = self.target.extend(tokens, cache.target, tree_mask, attention)
        return ExtendOutput(mixture_log_probs(q.logits, p.logits, self.mix_lambda), p.hidden)

    def step(self, tokens: Tensor, cache: MixtureCache, attention: str = "torch") -> StepOutput:
        out = self.extend(tokens[:, None], cache, None, attention)
        return StepOutput(out.logits[:, 0], out.hidden[:, 0])


def mixture_context(ctx: DecoderContext, mix_lambda: float) -> DecoderContext:
    """A context whose model is the mixture of `ctx.draft_model` (q) and `ctx.model` (p): any decoder
    that drives one backbone (`beam`, `beam_sample`) then decodes the mixture. Same codec, catalogue,
    prompt window and constraint sets as `ctx` (the draft was checked to share the codec when it was
    loaded, `load_context(..., draft_dir=...)`)."""
    if ctx.draft_model is None:
        raise UserInputError(
            "mixture teacher data needs a draft model q; pass --mix-draft DIR (a checkpoint on the "
            "target's codec, e.g. the SFT draft)"
        )
    if ctx.draft_codec is not None:  # a draft of ours beside an imported target: two vocabularies
        raise UserInputError(
            "--mix-draft mixes the two models token by token, which needs one vocabulary and one prompt; "
            "the imported target and this draft of ours have their own: drop --mix-draft"
        )
    model = MixtureModel(ctx.draft_model, ctx.model, mix_lambda)
    return DecoderContext(
        model,  # duck-typed: it answers the calls beam search makes on a GRTransformer
        ctx.codec,
        ctx.item_codes,
        ctx.max_items,
        ctx.popularity,
    )
