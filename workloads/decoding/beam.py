"""Plain beam search over semantic IDs, batched over users and beams, optionally constrained.

The beam-decoder template (template.BeamTemplate) with its defaults: one prefill per user, then L - 1
cached steps of batch x beam rows (beam_core.run_beam_search with the backbone as scorer). With
`constraint` set, the constraint set's mask (STATIC's index) is a level processor, so the search
returns only SIDs of the set, exactly as `static` does.

`beam_sample` is sampling-based beam search at temperature 1 (the reference AtSpeed's relaxed
verification is measured against): at every level the W beams are drawn without replacement from the
children of the current beams, each with probability proportional to its sequence probability.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from genrec.workloads.constraints.backend import MaskBackend
from genrec.workloads.decoding.base import DecoderContext, DecodeResult
from genrec.workloads.decoding.beam_core import BeamSelector, GumbelSelector
from genrec.workloads.decoding.params import BackboneBeamParams, BeamParams
from genrec.workloads.decoding.template import BeamTemplate


@dataclass(frozen=True)
class BeamSampleParams(BackboneBeamParams):
    seed: int = 0  # the sampling noise of one decode call (rows draw independently)


class BeamSearch(BeamTemplate):
    name: ClassVar[str] = "beam"
    description: ClassVar[str] = (
        "beam search over SID tokens, the reference decoder (exact top-K of the beam)"
    )
    Params: ClassVar[type] = BackboneBeamParams


class BeamSample(BeamSearch):
    """Sampling beam search: the template with a Gumbel selector seeded `params.seed`."""

    name: ClassVar[str] = "beam_sample"
    description: ClassVar[str] = "beam search with Gumbel sampling of the kept beams (diverse top-K)"
    Params: ClassVar[type] = BeamSampleParams

    def selector(self, ctx: DecoderContext, params: BeamSampleParams, lent: Any) -> BeamSelector:
        return GumbelSelector(torch.Generator(device=ctx.device).manual_seed(params.seed))


class MaskedBeamSearch(BeamTemplate):
    """Beam search constrained by a given mask backend (one the constraint store does not build: a
    live-updated index, a baseline with other settings); not a registered decoder."""

    def __init__(self, backend: MaskBackend) -> None:
        self.backend = backend

    def mask(self, ctx: DecoderContext, params: BeamParams) -> MaskBackend | None:
        return self.backend


def backbone_beam_search(
    ctx: DecoderContext, histories: list[list[int]], params: BeamParams, mask: MaskBackend
) -> DecodeResult:
    """Beam search with the cached backbone, every level constrained by `mask`."""
    return MaskedBeamSearch(mask).decode(ctx, histories, params)
