"""The one beam-decoder template: prompts -> prefill -> search -> finish -> timings -> counters -> result.

`BeamTemplate.decode_search` runs that sequence once; a beam-based decoder is a configuration of it:
    mask / processors   what edits each level's log-probs (a constraint set's mask by default)
    scorer              where each level's log-probs come from (the cached backbone by default)
    selector            how the next beams are chosen (exact top-W by default)
    buffers             storage lent for one request (none by default; xGR reuses it across requests)
`beam`, `beam_sample`, `static` and `xgr` are such configurations. Decoders with their own search
(NEZHA's head search, AtSpeed's draft-and-verify) reuse the steps around it: `timed_prompts`,
`finish_timed` and `decode_result`, so every decoder reports missing slots, timings and counters alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import Tensor

from genrec.workloads.constraints.backend import MaskBackend
from genrec.workloads.decoding.base import DecoderContext, DecodeResult, PhaseTimer, RegisteredDecoder
from genrec.workloads.decoding.beam_core import (
    BeamSearchOutput,
    BeamSelector,
    FinishedBeams,
    LevelProcessor,
    finish_beams,
    run_beam_search,
    select_beams,
)
from genrec.workloads.decoding.params import BeamParams
from genrec.workloads.decoding.processors import ConstraintProcessor
from genrec.workloads.decoding.scorers import BackboneScorer
from genrec.workloads.models.transformer import PrefillOutput


# --- the steps every decoder shares ---------------------------------------------------------------------
def timed_prompts(
    ctx: DecoderContext, histories: list[list[int]], timer: PhaseTimer
) -> tuple[Tensor, Tensor]:
    """The batch's prompt tokens and attention mask, timed as "system" work."""
    with timer.phase("system"):
        return ctx.prompts(histories)


def finish_timed(
    ctx: DecoderContext, timer: PhaseTimer, codes: Tensor, scores: Tensor, k: int
) -> FinishedBeams:
    """A search's top k as returned to users (missing slots flagged, items looked up), timed as "system".
    Scores are copied: a search may return a view of storage the next request overwrites (xGR)."""
    with timer.phase("system"):
        top = finish_beams(ctx, codes, scores, k)
        top.scores = top.scores.clone()
    return top


def decode_result(top: FinishedBeams, timings: dict[str, float], counters: dict[str, Any]) -> DecodeResult:
    """The DecodeResult of finished beams, with the decoder's timings and counters (+ missing slots)."""
    return DecodeResult(
        top.codes, top.scores, top.item_ids, top.valid, timings, {**counters, "missing": top.missing}
    )


# --- the template -----------------------------------------------------------------------------------------
class BeamTemplate(RegisteredDecoder):
    """Beam search over SID levels with a configurable scorer, processors, selector and buffers.

    Subclasses that set `name` are registered decoders; the defaults are plain beam search with the
    cached backbone, constrained by `params.constraint` when it is set."""

    Params: ClassVar[type] = BeamParams

    def mask(self, ctx: DecoderContext, params: BeamParams) -> MaskBackend | None:
        """The constraint set's mask backend, or None when the search is unconstrained."""
        return ctx.constraints.mask_backend(params, ctx.device) if params.constrained else None

    def processors(self, ctx: DecoderContext, params: BeamParams) -> list[LevelProcessor]:
        mask = self.mask(ctx, params)
        return [ConstraintProcessor(mask)] if mask is not None else []

    @contextmanager
    def buffers(self, ctx: DecoderContext, params: BeamParams, batch: int) -> Iterator[Any]:
        """Storage lent to one request of this batch size, released when it is finished."""
        yield None

    def scorer(
        self, ctx: DecoderContext, params: BeamParams, out: PrefillOutput, lent: Any
    ) -> BackboneScorer:
        hidden = out.hidden if getattr(params, "level_softmax", False) else None  # see BackboneBeamParams
        return BackboneScorer(
            ctx.model,
            ctx.codec,
            out.logits,
            out.cache,
            params.beam_width,
            params.attention,
            prefill_hidden=hidden,
        )

    def selector(self, ctx: DecoderContext, params: BeamParams, lent: Any) -> BeamSelector:
        return select_beams

    def run(self, ctx: DecoderContext, histories: list[list[int]], params: BeamParams) -> DecodeResult:
        return self.decode_search(ctx, histories, params)[1]

    @torch.no_grad()
    def decode_search(
        self, ctx: DecoderContext, histories: list[list[int]], params: BeamParams
    ) -> tuple[BeamSearchOutput, DecodeResult]:
        """The search (every level's choices too: `beam_core.level_beams`) and its DecodeResult."""
        processors = self.processors(ctx, params)
        timer, inner = PhaseTimer(ctx.device), PhaseTimer(ctx.device)  # inner: the processors' phases
        tokens, attn = timed_prompts(ctx, histories, timer)
        with timer.phase("prefill"):
            out = ctx.model.prefill(tokens, attn)
        batch, w, levels = tokens.shape[0], params.beam_width, ctx.codec.levels
        with self.buffers(ctx, params, batch) as lent:
            scorer = self.scorer(ctx, params, out, lent)
            select = self.selector(ctx, params, lent)
            with timer.phase("decode"):
                res = run_beam_search(scorer, processors, batch, w, levels, ctx.device, inner, select)
            top = finish_timed(ctx, timer, res.codes, res.scores, params.k)
        timings = dict(timer.ms)
        timings["decode_forward"] = scorer.forward_ms  # model time inside decode; the rest is overhead
        if processors:
            timings["decode_mask"] = inner.ms.get("mask", 0.0)  # constraint masking + state advance
        return res, decode_result(top, timings, {"model_calls": scorer.calls, "beams": w})
