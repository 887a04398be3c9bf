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

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from genrec.workloads.decoding.base import DecoderContext
from genrec.workloads.decoding.beam_core import BeamSelector, select_beams
from genrec.workloads.decoding.params import BackboneBeamParams
from genrec.workloads.decoding.scorers import BackboneScorer
from genrec.workloads.decoding.template import BeamTemplate
from genrec.workloads.decoding.xbeam import EarlyTopK, SelectBuffers
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.kv_cache import KVCache
from genrec.workloads.models.transformer import GRTransformer, PrefillOutput
from genrec.workloads.sid_codec import SIDCodec

REORDERS = ("index", "copy")
SELECTS = ("early", "flat")


@dataclass(frozen=True)
class XgrParams(BackboneBeamParams):
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

    beam_k: list[Tensor]  # per layer [B*W, Hkv, L-1, hd]
    beam_v: list[Tensor]
    beam_rows: Tensor  # [B*W, L-1] the indexed layout's row table
    select: SelectBuffers = field(repr=False)

    @staticmethod
    def build(model: GRTransformer, batch: int, beam_width: int, levels: int) -> DecodeBuffers:
        cfg, p = model.config, model.embed_tokens.weight
        rows, steps = batch * beam_width, levels - 1
        shape = model.kv_cache_shape(rows, steps)  # key/value heads (fewer than query heads with GQA)
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
        prefill_hidden: Tensor | None = None,
    ) -> None:
        super().__init__(
            model, codec, prefill_logits, prompt_cache, beam_width, attention, prefill_hidden=prefill_hidden
        )
        self.indexed, self.buffers = indexed, buffers

    def advance(self, level: int, parent: Tensor, token: Tensor) -> None:
        if self.cache is None:  # after level 0: fresh beams, nothing to reorder yet
            bufs = self.buffers
            storage = (bufs.beam_k, bufs.beam_v, bufs.beam_rows) if bufs is not None else None
            steps = self.codec.levels - 1
            self.cache = self.prompt_cache.expand(self.beam_width, steps, self.indexed, storage)
        super().advance(level, parent, token)


class XgrDecoder(BeamTemplate):
    """The template with xGR's scorer (in-place reorder into lent storage), early top-BW selection and
    buffers lent per (batch, BW, model) shape (see the module doc)."""

    name: ClassVar[str] = "xgr"
    description: ClassVar[str] = "beam search with a shared prompt cache and staged attention (xGR)"
    Params: ClassVar[type] = XgrParams

    @contextmanager
    def buffers(self, ctx: DecoderContext, params: XgrParams, batch: int) -> Iterator[DecodeBuffers | None]:
        if not params.reuse_buffers:
            yield None
            return
        w, levels = params.beam_width, ctx.codec.levels
        key = buffer_key(ctx.model, batch, w, levels)
        lent = ctx.buffers.acquire(key, lambda: DecodeBuffers.build(ctx.model, batch, w, levels))
        try:
            yield lent
        finally:
            ctx.buffers.release(key, lent)

    def scorer(
        self, ctx: DecoderContext, params: XgrParams, out: PrefillOutput, lent: DecodeBuffers | None
    ) -> XgrScorer:
        indexed = params.reorder == "index"
        w, attention = params.beam_width, params.attention
        hidden = out.hidden if params.level_softmax else None
        return XgrScorer(ctx.model, ctx.codec, out.logits, out.cache, w, attention, indexed, lent, hidden)

    def selector(self, ctx: DecoderContext, params: XgrParams, lent: DecodeBuffers | None) -> BeamSelector:
        if params.select == "early":
            return EarlyTopK(lent.select if lent is not None else None)
        return select_beams
