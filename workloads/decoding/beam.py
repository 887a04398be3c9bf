"""Plain beam search over semantic IDs, batched over users and beams, optionally constrained.

One prefill per user, then L - 1 cached steps of batch x beam rows (beam_core.run_beam_search with
the backbone as scorer). With `constraint` set, the constraint set's mask (STATIC's index) is a level
processor, so the search returns only SIDs of the set, exactly as `static` does.

`beam_sample` is sampling-based beam search at temperature 1 (the reference AtSpeed's relaxed
verification is measured against): at every level the W beams are drawn without replacement from the
children of the current beams, each with probability proportional to its sequence probability.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from genrec.workloads.constraints.backend import MaskBackend
from genrec.workloads.decoding.base import DecoderContext, DecodeResult, PhaseTimer, RegisteredDecoder
from genrec.workloads.decoding.beam_core import (
    BeamSearchOutput,
    BeamSelector,
    GumbelSelector,
    finish_beams,
    run_beam_search,
    select_beams,
)
from genrec.workloads.decoding.params import BeamParams
from genrec.workloads.decoding.processors import ConstraintProcessor
from genrec.workloads.decoding.scorers import BackboneScorer, level_log_probs  # noqa: F401 (re-export)


@dataclass(frozen=True)
class BeamSampleParams(BeamParams):
    seed: int = 0  # the sampling noise of one decode call (rows draw independently)


@dataclass
class BackboneSearch:
    """One backbone beam search, before its top k is finished for users (`finish_backbone_search`)."""

    output: BeamSearchOutput  # every level's choices too (`beam_core.level_beams`)
    scorer: BackboneScorer
    timer: PhaseTimer  # system / prefill / decode
    inner: PhaseTimer  # the processors' phases inside decode


@torch.no_grad()
def run_backbone_search(
    ctx: DecoderContext,
    histories: list[list[int]],
    params: BeamParams,
    mask: MaskBackend | None,
    select: BeamSelector = select_beams,
) -> BackboneSearch:
    """Prefill, then the beam core over every SID level with the cached backbone as scorer; `mask`
    (if any) constrains every level."""
    timer = PhaseTimer(ctx.device)
    codec, w = ctx.codec, params.beam_width
    with timer.phase("system"):
        tokens, attn = ctx.prompts(histories)
    with timer.phase("prefill"):
        out = ctx.model.prefill(tokens, attn)
    scorer = BackboneScorer(ctx.model, codec, out.logits, out.cache, w, params.attention)
    processors = [ConstraintProcessor(mask)] if mask is not None else []
    inner = PhaseTimer(ctx.device)
    with timer.phase("decode"):
        res = run_beam_search(scorer, processors, tokens.shape[0], w, codec.levels, ctx.device, inner, select)
    return BackboneSearch(res, scorer, timer, inner)


def finish_backbone_search(
    ctx: DecoderContext, search: BackboneSearch, params: BeamParams, constrained: bool
) -> DecodeResult:
    """The search's top k as a DecodeResult, with its phase timings and counters."""
    timer = search.timer
    with timer.phase("system"):
        top = finish_beams(ctx, search.output.codes, search.output.scores, params.k)
    timings = dict(timer.ms)
    timings["decode_forward"] = search.scorer.forward_ms  # model time inside decode; the rest is overhead
    if constrained:
        timings["decode_mask"] = search.inner.ms.get("mask", 0.0)  # constraint masking + state advance
    counters = {"model_calls": search.scorer.calls, "beams": params.beam_width, "missing": top.missing}
    return DecodeResult(top.codes, top.scores, top.item_ids, top.valid, timings, counters)


def backbone_beam_search(
    ctx: DecoderContext,
    histories: list[list[int]],
    params: BeamParams,
    mask: MaskBackend | None,
    select: BeamSelector = select_beams,
) -> DecodeResult:
    """Beam search with the cached backbone; `mask` (if any) constrains every level."""
    search = run_backbone_search(ctx, histories, params, mask, select)
    return finish_backbone_search(ctx, search, params, mask is not None)


def run_beam_decoder(ctx: DecoderContext, histories: list[list[int]], params: BeamParams) -> BackboneSearch:
    """The search the `beam` decoder runs (or `beam_sample`, for BeamSampleParams: Gumbel draws seeded
    `params.seed`), before its top k is finished; callers that need every level's beams read them from
    its choices (`beam_core.level_beams`)."""
    params.validate()
    mask = ctx.constraints.mask_backend(params, ctx.device) if params.constrained else None
    select: BeamSelector = select_beams
    if isinstance(params, BeamSampleParams):
        select = GumbelSelector(torch.Generator(device=ctx.device).manual_seed(params.seed))
    return run_backbone_search(ctx, histories, params, mask, select)


class BeamSearch(RegisteredDecoder):
    name: ClassVar[str] = "beam"
    Params: ClassVar[type] = BeamParams

    def run(self, ctx: DecoderContext, histories: list[list[int]], params: BeamParams) -> DecodeResult:
        return finish_backbone_search(
            ctx, run_beam_decoder(ctx, histories, params), params, params.constrained
        )


class BeamSample(BeamSearch):
    """Sampling beam search: BeamSearch's decode, whose params (BeamSampleParams) pick the Gumbel
    selector in `run_beam_decoder`."""

    name: ClassVar[str] = "beam_sample"
    Params: ClassVar[type] = BeamSampleParams
