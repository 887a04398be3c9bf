"""What a decoder decodes with beyond the backbone, declared on its class (`needs = (DRAFT_MODEL,)`).

Each need knows how to tell whether a DecoderContext has it and what to say when it does not, so every
entry point (the decoders themselves, `genrec eval`, an experiment file, a Serve config) refuses a
decoder that lacks what it needs with the same sentence, and nothing infers a need from a decoder's name.
Needs that come from a separate input (a draft checkpoint) carry the CLI flag that supplies it; the
others come with the model's checkpoint (a trained head) or the dataset (item popularity).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from genrec.workloads.errors import UserInputError

HOW_TO_MAKE_A_DRAFT = "any next_item checkpoint on the same codec, e.g. `genrec train --model tiny ...`"


@dataclass(frozen=True)
class Need:
    """One thing a decoder needs: `present(ctx)` says whether a context has it; `flag` is the CLI
    option that supplies it ("" when it comes with the checkpoint or the dataset)."""

    key: str
    present: Callable[[Any], bool]
    flag: str = ""

    def message(self, decoder: str, ctx: Any = None, how: str | None = None) -> str:
        """The one wording of "decoder X needs this"; `how` names the fix where the user is."""
        return _MESSAGES[self.key](decoder, ctx, how)


def _draft_message(decoder: str, ctx: Any, how: str | None) -> str:
    return f"decoder {decoder!r} needs a draft model; {how or 'pass --draft DIR'} ({HOW_TO_MAKE_A_DRAFT})"


def _head_message(kind: str) -> Callable[[str, Any, str | None], str]:
    def message(decoder: str, ctx: Any, how: str | None) -> str:
        head = getattr(ctx, "draft_head", None)
        have = "no draft head" if head is None else f"a {head.config.kind!r} head"
        fix = how or f"train one with `genrec train --objective {kind} ...`"
        return (
            f"decoder {decoder!r} needs a model trained with a {kind} head, but this checkpoint has {have}; "
            + fix
        )

    return message


def _popularity_message(decoder: str, ctx: Any, how: str | None) -> str:
    return f"the {decoder} decoder needs item popularity ({how or 'evaluate with a dataset'})"


def _has_head(kind: str) -> Callable[[Any], bool]:
    return lambda ctx: ctx.draft_head is not None and ctx.draft_head.config.kind == kind


_MESSAGES = {
    "draft_model": _draft_message,
    "nezha_head": _head_message("nezha"),
    "mtp_head": _head_message("mtp"),
    "popularity": _popularity_message,
}

DRAFT_MODEL = Need("draft_model", lambda ctx: ctx.draft_model is not None, flag="--draft DIR")
NEZHA_HEAD = Need("nezha_head", _has_head("nezha"))
MTP_HEAD = Need("mtp_head", _has_head("mtp"))
POPULARITY = Need("popularity", lambda ctx: ctx.popularity is not None)


def missing_need(decoder_cls: type, ctx: Any) -> Need | None:
    """The first need of the decoder class that `ctx` lacks, or None."""
    for need in getattr(decoder_cls, "needs", ()):
        if not need.present(ctx):
            return need
    return None


def require_needs(decoder_cls: type, ctx: Any) -> None:
    """UserInputError naming the first need of the decoder that the context lacks, and its fix."""
    need = missing_need(decoder_cls, ctx)
    if need is not None:
        raise UserInputError(need.message(decoder_cls.name, ctx))
