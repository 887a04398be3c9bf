"""Decoder parameters: one frozen dataclass per decoder, the single source for YAML, CLI and HTTP.

Every decoder's `Params` derives from `DecoderParams` (k) or `BeamParams` (k, beam_width and the
constraint fields every beam-based decoder accepts). Cross-field rules live in `validate()` here, once:
the platform's adapter (genrec.platform.params) checks types and names, then calls `validate()`, so
the same bad value gets the same message from every entry point.

`constraint` selects a set of allowed SIDs for any beam-based decoder:
    "none"        no constraint (plain beam search; may return SIDs that are no item)
    "all"         every catalogue item
    "random"      `constraint_size` catalogue items drawn with `constraint_seed`
    "cold_start"  catalogue items with no train interaction
    "file"        the SIDs listed in `constraint_path` (.npy or text)
    "uniform"     `constraint_size` SIDs drawn uniformly from the SID space (scaling runs)
or the name of a set registered on the decoder context (`ConstraintStore.register`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from genrec.kernels.shared_prefix_attention import ATTENTION_BACKENDS
from genrec.workloads.errors import UserInputError

# the one list of constraint rules (Serve's config, the CLI and the decoders all read it)
CONSTRAINT_RULES = ("none", "all", "random", "cold_start", "file", "uniform")
SIZED_RULES = ("random", "uniform")


@dataclass(frozen=True)
class DecoderParams:
    """What every decoder takes: the number of items returned per user."""

    k: int = 10

    def validate(self) -> None:
        if self.k < 1:
            raise UserInputError(f"`k` must be >= 1, got {self.k}")


@dataclass(frozen=True)
class BeamWidthParams(DecoderParams):
    """A beam width, and the one rule that ties k to it (every beam-shaped decoder, peers included)."""

    beam_width: int = 10

    def validate(self) -> None:
        super().validate()
        if self.beam_width < 1:
            raise UserInputError(f"`beam_width` must be >= 1, got {self.beam_width}")
        if self.k > self.beam_width:
            raise UserInputError(
                f"`k` ({self.k}) is larger than the beam width ({self.beam_width}); "
                f"ask for beam_width >= {self.k}"
            )


@dataclass(frozen=True)
class BeamParams(BeamWidthParams):
    """Parameters of every beam-based decoder (beam, static, nezha, mtp, ...)."""

    constraint: str = "none"  # a rule in CONSTRAINT_RULES or a set registered on the context
    constraint_size: int = 0  # n for "random" / "uniform"
    constraint_seed: int = 0
    constraint_path: str = ""  # for "file"
    attention: str = "torch"  # the cached steps' attention backend (kernels.shared_prefix_attention)

    def validate(self) -> None:
        super().validate()
        if not self.constraint:
            raise UserInputError(
                f"`constraint` must name a rule {list(CONSTRAINT_RULES)} or a registered set"
            )
        if self.constraint in SIZED_RULES and self.constraint_size < 1:
            raise UserInputError(f"`constraint` {self.constraint!r} needs constraint_size >= 1")
        if self.constraint == "file" and not self.constraint_path:
            raise UserInputError("`constraint` 'file' needs constraint_path (a .npy or text list of SIDs)")
        if self.attention not in ATTENTION_BACKENDS:
            names = list(ATTENTION_BACKENDS)
            raise UserInputError(f"`attention` must be one of {names}, got {self.attention!r}")

    @property
    def constrained(self) -> bool:
        return self.constraint != "none"


@dataclass(frozen=True)
class BackboneBeamParams(BeamParams):
    """Beam decoders that score every level with the cached backbone (beam, beam_sample, static, xgr).

    `level_softmax`: score a level by the softmax over its own tokens, projecting only those rows of the
    LM head (tokenize/level_scores.py), instead of the full-vocabulary log-softmax that HF generate with
    a prefix-allowed function uses (the default, exact against `hf_beam`). Far cheaper with a large
    imported vocabulary; beams of different prefixes then compare differently, so quality is measured."""

    level_softmax: bool = False


def param_defaults(params_type: type) -> dict[str, Any]:
    """Field names and defaults of a Params dataclass, in declaration order."""
    return {f.name: f.default for f in fields(params_type)}
