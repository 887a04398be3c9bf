"""AtSpeed's draft model: a separate, smaller GRTransformer on the target's SID codec.

A draft is an ordinary checkpoint (any `next_item` checkpoint of the same codec serves as an SFT draft;
an aligned one from AtSpeed-S/R names its target in its meta). It is loaded once per process beside
the target (`genrec.workloads.evaluation.load_context(..., draft_dir=...)`) and handed to decoders as
`DecoderContext.draft_model`. This module holds the checks every entry point shares (CLI, experiment
YAML, Serve config, the decoders themselves), so each says the same thing about a missing or unfit draft.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from genrec.workloads.decoding.base import DecoderContext, decoder_needs
from genrec.workloads.decoding.needs import DRAFT_MODEL
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.checkpoint import Checkpoint, load_checkpoint
from genrec.workloads.models.inputs import max_prompt_len
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec, codec_with_gaps_of


def needs_draft(decoder_name: str) -> bool:
    """Whether the decoder declares it decodes with a draft model (so it may only run where one is
    loaded); read from the decoder class, never from its name."""
    return DRAFT_MODEL in decoder_needs(decoder_name)


def draft_needed_message(decoder_name: str, how: str = "pass --draft DIR") -> str:
    """The one wording of "this decoder needs a draft"; `how` names the fix where the user is
    (a CLI flag, an experiment's or a Serve config's `draft:` key)."""
    return DRAFT_MODEL.message(decoder_name, how=how)


def require_draft(ctx: DecoderContext, decoder_name: str) -> GRTransformer:
    """The context's draft model, or a UserInputError saying how to give one."""
    if not DRAFT_MODEL.present(ctx):
        raise UserInputError(draft_needed_message(decoder_name))
    return ctx.draft_model


def checkpoint_codebook_sizes(path: str | os.PathLike, role: str = "draft") -> tuple[int, ...]:
    """The codebook sizes a checkpoint folder was trained for, from its config.json alone (no weights):
    the cheap pre-flight check of sweeps and Serve, before any process loads a model."""
    path = Path(path)
    if not ((path / "config.json").is_file() and (path / "model.safetensors").is_file()):
        raise UserInputError(
            f"{role} {path}: not a genrec checkpoint (needs config.json and model.safetensors); "
            f"train one on the target's dataset, e.g. `genrec train --model tiny --data DATA --out {path}`"
        )
    try:
        sizes = json.loads((path / "config.json").read_text())["codec"]["codebook_sizes"]
        return tuple(int(t) for t in sizes)
    except (ValueError, KeyError, TypeError) as e:
        raise UserInputError(
            f"{role} {path}: config.json is unreadable ({e}); retrain or restore it"
        ) from None


def check_same_codec(
    draft_dir: str | os.PathLike,
    draft_sizes: tuple[int, ...],
    target_dir: str | os.PathLike,
    target_sizes: tuple[int, ...],
    target_role: str = "model",
) -> None:
    """A draft proposes SIDs the target verifies token by token: both must speak the same vocabulary."""
    if tuple(draft_sizes) != tuple(target_sizes):
        raise UserInputError(
            f"draft {draft_dir} has codebook sizes {list(draft_sizes)}, but the {target_role} {target_dir} "
            f"has {list(target_sizes)}; a draft must share the target's codec: train the draft on the "
            "same dataset and tokenisation as the target"
        )


def load_draft(
    draft_dir: str | os.PathLike, target: Checkpoint, target_dir: str | os.PathLike
) -> tuple[GRTransformer, SIDCodec | None]:
    """Load a draft checkpoint on the target's device (eval mode) and check it fits the target; returns
    the model and the codec it decodes with when that is not the target's (`DecoderContext.draft_codec`).

    The check compares SID code spaces, never raw vocabulary ids: a draft of ours beside one of ours
    shares its codec and vocabulary; an imported draft beside an imported target spells SIDs with the
    same token ids; a draft of ours beside an imported target (`genrec train --objective ... --target
    IMPORTED`) has the target table's codebook sizes, its own level-offset ids and its own BOS + SID
    prompts, and scores the target's gap codes -inf. Its window must hold those prompts. A draft larger
    than its target is allowed (odd, but a valid experiment)."""
    checkpoint_codebook_sizes(draft_dir)  # a missing or foreign folder gets the draft's own message
    draft = load_checkpoint(draft_dir, target.model.device)
    if target.codec.token_table is not None and draft.codec.is_level_offset and "imported" not in draft.meta:
        return _own_draft_of_imported(draft, draft_dir, target, target_dir)
    check_same_codec(draft_dir, draft.codec.codebook_sizes, target_dir, target.codec.codebook_sizes)
    if draft.codec.token_table != target.codec.token_table:  # imported: the same SID token ids, too
        raise UserInputError(
            f"draft {draft_dir} spells SIDs with other token ids than the model {target_dir}; use a draft "
            "whose tokenizer has the same SID tokens (import both with `genrec model import hf`), or one "
            f"of ours on the same codes (`genrec train --objective ... --target {target_dir}`)"
        )
    d_cfg, t_cfg = draft.model.config, target.model.config
    if d_cfg.vocab_size != t_cfg.vocab_size:
        raise UserInputError(
            f"draft {draft_dir} has a vocabulary of {d_cfg.vocab_size} tokens, but the model {target_dir} "
            f"has {t_cfg.vocab_size}; train the draft on the same dataset and tokenisation as the target"
        )
    if d_cfg.max_seq_len < t_cfg.max_seq_len:
        raise UserInputError(
            f"draft {draft_dir} reads at most {d_cfg.max_seq_len} tokens ({draft.max_items} history items), "
            f"but the model {target_dir} builds prompts of up to {t_cfg.max_seq_len} "
            f"({target.max_items} items); train the draft with --max-items {target.max_items} or more"
        )
    return draft.model.eval(), None


def _own_draft_of_imported(
    draft: Checkpoint, draft_dir: str | os.PathLike, target: Checkpoint, target_dir: str | os.PathLike
) -> tuple[GRTransformer, SIDCodec]:
    """A draft of ours beside an imported target: same codes (sizes checked), own ids and prompts."""
    if draft.codec.codebook_sizes != target.codec.codebook_sizes:
        raise UserInputError(
            f"draft {draft_dir} has codebook sizes {list(draft.codec.codebook_sizes)}, but the model "
            f"{target_dir}'s SID table has {list(target.codec.codebook_sizes)}; train the draft on the "
            f"table's codes: `genrec train --objective atspeed_s --target {target_dir} ...` (alpha 0: SFT)"
        )
    need = max_prompt_len(draft.codec.levels, target.max_items + 1)  # its prompt and the SID it drafts
    if draft.model.config.max_seq_len < need:
        raise UserInputError(
            f"draft {draft_dir} reads at most {draft.max_items} history items, but the model {target_dir} "
            f"prompts with {target.max_items}; train the draft with --max-items {target.max_items} or more"
        )
    return draft.model.eval(), codec_with_gaps_of(draft.codec, target.codec.table)
