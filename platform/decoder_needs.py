"""What each decoder is and what it needs from a checkpoint, as its class declares it (description,
`reads_backbone`, `needs`): behind `genrec decoders`, `genrec eval` and `genrec serve`'s start-up check.

A checkpoint trained with a draft-head objective (`genrec train --objective nezha|mtp`) trains only
the head's loss: its backbone's next-token head (`lm_head`) is untrained, so a decoder that reads
next-token logits (beam search and everything built on it) returns invalid SIDs on it. A head decoder
needs that head; AtSpeed decoders need a draft model beside a next-token target. This is read from the
checkpoint's config.json alone (no weights), so `genrec serve` answers in well under a second.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from genrec.workloads.errors import UserInputError


@dataclass(frozen=True)
class DecoderNeeds:
    what: str  # one line: what the decoder does
    backbone: bool = True  # reads the backbone's next-token logits
    head: str = ""  # a draft head of this kind ('nezha', 'mtp')
    draft: bool = False  # a separate draft model (AtSpeed)

    def needs_text(self) -> str:
        parts = []
        if self.head:
            parts.append(f"a checkpoint with a {self.head} head (genrec train --objective {self.head})")
        elif self.backbone:
            parts.append("a next-token checkpoint (genrec train, objective next_item)")
        if self.draft:
            parts.append("--draft DIR (a small next_item checkpoint on the same codec)")
        return " + ".join(parts) or "nothing but the dataset (item counts)"


def decoder_needs(name: str) -> DecoderNeeds:
    """What the decoder class declares (its description, `reads_backbone` and `needs`), in the form the
    checkpoint check and `genrec decoders` use."""
    from genrec.workloads.decoding.base import decoder_class
    from genrec.workloads.decoding.needs import DRAFT_MODEL

    cls = decoder_class(name)
    heads = [n.key.removesuffix("_head") for n in cls.needs if n.key.endswith("_head")]
    doc = (cls.__doc__ or "").strip().splitlines()
    what = cls.description or (doc[0] if doc else "(no description)")
    return DecoderNeeds(what, cls.reads_backbone, heads[0] if heads else "", DRAFT_MODEL in cls.needs)


def checkpoint_head_kind(model_dir: str | Path) -> str | None:
    """The checkpoint's draft-head kind from its config.json ('nezha', 'mtp'; None: a next-token model).
    A missing or unreadable file is left to the checkpoint loader, which says what is wrong."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    head = config.get("head") if isinstance(config, dict) else None
    return str(head.get("kind")) if isinstance(head, dict) and head.get("kind") else None


def check_decoder_fits(
    name: str, model_dir: str | Path, has_draft: bool, how_draft: str = "--draft DIR"
) -> None:
    """One line naming what `name` needs that the checkpoint `model_dir` lacks (UserInputError)."""
    from genrec.workloads.decoding.draft import draft_needed_message

    needs = decoder_needs(name)
    kind = checkpoint_head_kind(model_dir)
    if needs.head and kind != needs.head:
        have = "no draft head" if kind is None else f"a {kind!r} head"
        raise UserInputError(
            f"decoder {name!r} needs a model trained with a {needs.head} head, but {model_dir} has {have}; "
            f"train one with `genrec train --objective {needs.head} ...`"
        )
    if needs.backbone and kind is not None:
        raise UserInputError(
            f"decoder {name!r} reads the backbone's next-token logits, but {model_dir} was trained with "
            f"--objective {kind} (its next-token head is untrained: every SID would be invalid); use "
            f"--decoder {kind}, or a next_item checkpoint"
        )
    if needs.draft and not has_draft:
        raise UserInputError(draft_needed_message(name, f"pass {how_draft}"))
