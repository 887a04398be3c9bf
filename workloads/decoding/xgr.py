"""`xgr`: beam search the way xGR serves it (xAttention + xBeam), with the same top-K as `beam`.

One prefill per user, then L - 1 cached steps of batch x BW rows through the beam core, with:
- xAttention: the prompt cache stored once per user (the model's layout) and the staged attention of
  the `attention` backend (`torch` reference, or `triton`: shared stage / unshared stage / merge);
- in-place beam reorder (`reorder="index"`): decoded steps stay where they were written; a reorder
  only permutes the per-step row table (KVCache.expand(indexed=True)), which the attention reads
  through (the Triton kernel in its loads, the torch backend by a gather per layer);
- early-terminating top-BW (`select="early"`, xbeam.EarlyTopK), exact: ties by lower index;
- the valid-path filter: `constraint` (BeamParams) restricts every level to the constraint set's index
  (processors.ConstraintProcessor, STATIC's index: dense tables for the first levels, sparse candidates
  on the rest, which the early top-BW ranks), as for `beam`;
- buffer reuse (`reuse_buffers`): the per-beam KV storage, its row table and the selection outputs
  are allocated once per (batch, BW, model) shape and lent to each request of that shape.

`reorder="copy"` and `select="flat"` switch a part back to what `beam` does (ablations). The result
equals `beam`'s top-K with the same constraint: same scores, and the same SIDs up to the order of
exactly equal scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from genrec.workloads.decoding.base import DecoderContext, DecodeResult, PhaseTimer, register_decoder
from genrec.workloads.decoding.beam_core import finish_beams, run_beam_search, select_beams
from genrec.workloads.decoding.params import BeamParams
from genrec.workloads.decoding.processors import ConstraintProcessor
from genrec.workloads.decoding.scorers import BackboneScorer
from genrec.workloads.decoding.xbeam import EarlyTopK, SelectBuffers
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.kv_cache import KVCache
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec

REORDERS = ("index", "copy")
SELECTS = ("early", "flat")


@dataclass(frozen=True)
class XgrParams(BeamParams):
    reorder: str = "index"  # index: in-place (row table); copy: copy the decoded steps per reorder
    select: str = "early"  # early: early-terminating top-BW; flat: one flat top-k
    reuse_buffers: bool = True  # per-(batch, BW) buffers reused across steps and requests

    def validate(self) -> None:
        super().validate()
        if self.reorder not in REORDERS:
            raise UserInputError(f"`reorder` must be one of {list(REORDERS)}, got {self.reorder!r}")
        if self.select not in SELECTS:
            raise UserInputError(f"`select` must be one of {list(SELECTS)}, got {self.select!r}")


@dataclass
class DecodeBuffers:
    """Everything one request of a (batch, BW, model) shape writes besides the prompt cache."""

    beam_k: list[Tensor]  # per layer [B*W, H, L-1, hd]
    beam_v: list[Tensor]
    beam_rows: Tensor  # [B*W, L-1] the indexed layout's row table
    select: SelectBuffers = field(repr=False)

    @staticmethod
    def build(model: GRTransformer, batch: int, beam_width: int, levels: int) -> DecodeBuffers:
        cfg, p = model.config, model.embed_tokens.weight
        rows, steps = batch * beam_width, levels - 1
        shape = (rows, cfg.n_heads, steps, cfg.head_dim)
        return DecodeBuffers(
            [p.new_empty(shape) for _ in range(cfg.n_layers)],
            [p.new_empty(shape) for _ in range(cfg.n_layers)],
            torch.empty(rows, steps, dtype=torch.long, device=p.device),
            SelectBuffers.build(batch, beam_width, levels, p.device),
        )

    def nbytes(self) -> int:
        tensors = [*self.beam_k, *self.beam_v, self.beam_rows]
        s = self.select
        tensors += [s.scores, s.parent, s.code, s.group_max]
        return sum(t.numel() * t.element_size() for t in tensors)


def buffer_key(model: GRTransformer, batch: int, beam_width: int, levels: int) -> tuple:
    p = model.embed_tokens.weight
    return (model.config, batch, beam_width, levels, p.dtype, str(p.device))


class XgrScorer(BackboneScorer):
    """The backbone scorer with the in-place reorder layout and lent storage for the beam cache."""

    def __init__(
        self,
        model: GRTransformer,
        codec: SIDCodec,
        prefill_logits: Tensor,
        prompt_cache: KVCache,
        beam_width: int,
        attention: str,
        indexed: bool,
        buffers: DecodeBuffers | None,
    ) -> None:
        super().__init__(model, codec, prefill_logits, prompt_cache, beam_width, attention)
        self.indexed, self.buffers = indexed, buffers

    def advance(self, level: int, parent: Tensor, token: Tensor) -> None:
        if self.cache is None:  # after level 0: fresh beams, nothing to reorder yet
            bufs = self.buffers
            storage = (bufs.beam_k, bufs.beam_v, bufs.beam_rows) if bufs is not None else None
            steps = self.codec.levels - 1
            self.cache = self.prompt_cache.expand(self.beam_width, steps, self.indexed, storage)
        super().advance(level, parent, token)


@torch.no_grad()
def xgr_search(ctx: DecoderContext, histories: list[list[int]], params: XgrParams) -> DecodeResult:
    """Beam search with xGR's attention layout, reorder, selection and buffers (see the module doc)."""
    timer = PhaseTimer(ctx.device)
    codec, w = ctx.codec, params.beam_width
    mask = ctx.constraints.mask_backend(params, ctx.device) if params.constrained else None
    with timer.phase("system"):
        tokens, attn = ctx.prompts(histories)
    with timer.phase("prefill"):
        out = ctx.model.prefill(tokens, attn)
    batch = tokens.shape[0]
    key = buffer_key(ctx.model, batch, w, codec.levels)
    lent = (
        ctx.buffers.acquire(key, lambda: DecodeBuffers.build(ctx.model, batch, w, codec.levels))
        if params.reuse_buffers
        else None
    )
    try:
        scorer = XgrScorer(
            ctx.model, codec, out.logits, out.cache, w, params.attention, params.reorder == "index", lent
        )
        processors = [ConstraintProcessor(mask)] if mask is not None else []
        select = select_beams
        if params.select == "early":
            select = EarlyTopK(lent.select if lent is not None else None)
        inner = PhaseTimer(ctx.device)
        with timer.phase("decode"):
            res = run_beam_search(scorer, processors, batch, w, codec.levels, ctx.device, inner, select)
        with timer.phase("system"):
            top = finish_beams(ctx, res.codes, res.scores, params.k)
            scores = top.scores.clone()  # a view of a lent buffer: the next request overwrites it
    finally:
        if lent is not None:
            ctx.buffers.release(key, lent)
    timings = dict(timer.ms)
    timings["decode_forward"] = scorer.forward_ms
    if mask is not None:
        timings["decode_mask"] = inner.ms.get("mask", 0.0)
    counters = {"model_calls": scorer.calls, "beams": w, "missing": top.missing}
    return DecodeResult(top.codes, scores, top.item_ids, top.valid, timings, counters)


@register_decoder
class XgrDecoder:
    name: ClassVar[str] = "xgr"
    Params: ClassVar[type] = XgrParams

    def decode(self, ctx: DecoderContext, histories: list[list[int]], params: XgrParams) -> DecodeResult:
        params.validate()
        return xgr_search(ctx, histories, params)
