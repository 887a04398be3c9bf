"""`static`: constrained beam search (STATIC) with the real KV-cached model.

Beam search (beam_core) with, at every level, the constraint mask applied to the level's
log-probabilities (invalid tokens -> -inf, Algorithm 1) and each beam's trie state carried through
beam reordering by the parent index (processors.ConstraintProcessor). Scores are the model's
unrenormalised log-probabilities, as in beam search, so a constrained SID scores what it scores
unconstrained.

When fewer valid completions than the beam width exist, the surplus beams keep score -inf: the
result then holds fewer items: those slots are flagged missing (score -inf, valid False, item id -1,
codes -1), never filled with SIDs outside the set; `counters["missing"]` counts them.

`beam` with `constraint=...` decodes the same; `static` adds the index settings (dense levels, the
VNTK kernel, or a baseline backend for comparisons) and constrains to all items by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from genrec.workloads.constraints.backend import MaskBackend
from genrec.workloads.decoding.base import DecoderContext
from genrec.workloads.decoding.constraint_store import BACKENDS, KERNELS
from genrec.workloads.decoding.params import BackboneBeamParams
from genrec.workloads.decoding.template import BeamTemplate
from genrec.workloads.errors import UserInputError


@dataclass(frozen=True)
class StaticParams(BackboneBeamParams):
    constraint: str = "all"  # STATIC always constrains
    dense_levels: int = 2  # d: levels served by dense tables (clipped to L - 1)
    kernel: str = "torch"  # VNTK implementation: torch or triton
    backend: str = "static"  # static, or a baseline: cpu_trie, ppv_exact, ppv_approx, hash_bitmap

    def validate(self) -> None:
        super().validate()
        if self.constraint == "none":
            raise UserInputError(
                "the static decoder always constrains; use decoder `beam` for constraint 'none'"
            )
        if self.dense_levels < 0:
            raise UserInputError(f"`dense_levels` must be >= 0, got {self.dense_levels}")
        if self.backend not in BACKENDS:
            raise UserInputError(f"`backend` must be one of {list(BACKENDS)}, got {self.backend!r}")
        if self.kernel not in KERNELS:
            raise UserInputError(f"`kernel` must be one of {list(KERNELS)}, got {self.kernel!r}")


class StaticDecoder(BeamTemplate):
    """The template whose mask is the constraint set's index with the params' index settings (built
    once per context)."""

    name: ClassVar[str] = "static"
    description: ClassVar[str] = "beam search masked by a CSR transition matrix of allowed SIDs (STATIC)"
    Params: ClassVar[type] = StaticParams

    def mask(self, ctx: DecoderContext, params: StaticParams) -> MaskBackend:
        p = params
        return ctx.constraints.mask_backend(p, ctx.device, p.dense_levels, p.backend, p.kernel)
