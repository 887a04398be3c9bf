"""Bring your own model: an HF causal-LM folder with SID tokens -> one of our checkpoint folders.

`import_hf_checkpoint` reads the folder (config.json + safetensors through hf_import.py, tokenizer.json
through the SID pattern, generation_config.json recorded as found) and the items' SIDs (an LC-Rec index
JSON or a Parquet / CSV item -> SID list), checks them against each other, and writes

    out/config.json          our checkpoint config: model, codec (the SID token table), meta["hf"] (the
                             backbone: family, parameters, dtype, vocabulary), meta["imported"]
    out/model.safetensors    the weights in their dtype
    out/tokenizer.json       the checkpoint's own tokenizer (prompts are tokenised with it)
    out/prompt_template.json the prompt the checkpoint was fine-tuned with
    out/item_sids.npy        [N, L] codes of the catalogue, row = our item id (file order)

in a temporary sibling folder renamed into place: a refused input leaves nothing. Every refusal is a
one-line UserInputError naming the problem and the fix. `imported_inputs` gives back, for a loaded
checkpoint, what a DecoderContext needs to prompt it (decoding/base.py).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from genrec.workloads.errors import UserInputError
from genrec.workloads.models.checkpoint import Checkpoint, save_checkpoint
from genrec.workloads.models.hf_import import load_hf_model
from genrec.workloads.models.inputs import left_pad
from genrec.workloads.sid_codec import SIDCodec
from genrec.workloads.sid_table import SIDTokenTable
from genrec.workloads.tokenize.prompt_template import TEMPLATE_FILE, PromptEncoder, PromptTemplate
from genrec.workloads.tokenize.sid_tokens import (
    SIDPattern,
    load_tokenizer,
    sid_pattern,
    sid_table_from_tokenizer,
)

BACKBONE_KEYS = ("family", "architecture", "n_params", "dtype", "vocab_size")
ITEMS_FILE, TOKENIZER_FILE, GENERATION_FILE = "item_sids.npy", "tokenizer.json", "generation_config.json"
# LC-Rec's instruction shape, worded neutrally; a checkpoint fine-tuned on another prompt passes its own
DEFAULT_TEMPLATE = PromptTemplate(
    text="The user has interacted with the following items in order: {history}. "
    "Predict the next item the user will interact with.",
    response_prefix="\nResponse: ",
)


@dataclass(frozen=True)
class ImportedInputs:
    """What decoding an imported checkpoint needs beyond the model and codec: its prompts and its origin."""

    encoder: PromptEncoder  # histories -> prompt token ids with the checkpoint's own tokenizer
    pad_id: int  # left padding (masked out; any id of the vocabulary would do)
    bos_id: int | None  # the tokenizer's BOS if its template adds one (HF generate's bos_token_id)
    hf_path: str  # the original HF folder: hf_beam runs transformers on it
    backbone: dict  # family, architecture, n_params, dtype, vocab_size: what result rows record


@dataclass(frozen=True)
class ImportReport:
    out: Path
    backbone: dict  # meta["hf"]: family, architecture, n_params, dtype, vocab_size, ...
    codebook_sizes: tuple[int, ...]
    items: int
    sid_tokens: int
    gaps: int  # codes without a token (LC-Rec adds only the codes some item uses)
    overridden_generation_flags: tuple[str, ...]  # generation_config.json flags hf_beam neutralises


def read_generation_config(path: Path) -> dict:
    """generation_config.json as recorded (hf_beam overrides its search flags); {} when absent."""
    file = path / GENERATION_FILE
    if not file.is_file():
        return {}
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        fix = "restore it from the checkpoint or delete it"
        raise UserInputError(f"{file}: not valid JSON ({e}); {fix}") from None
    if not isinstance(raw, dict):
        raise UserInputError(f"{file}: expected a JSON object; restore it from the checkpoint or delete it")
    return raw


SEARCH_FLAGS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "num_beams")


def overridden(gen: dict) -> tuple[str, ...]:
    """Flags of the checkpoint's generation config that would change a beam search (hf_beam sets them)."""
    neutral = {"do_sample": False, "temperature": 1.0, "top_k": None, "top_p": 1.0, "repetition_penalty": 1.0}
    return tuple(f"{k}={gen[k]!r}" for k in SEARCH_FLAGS if k in gen and gen[k] != neutral.get(k, gen[k]))


def check_template(template: PromptTemplate, encoder: PromptEncoder, codes: np.ndarray) -> None:
    """The template renders and tokenises a real history into exactly its SID tokens (else refused)."""
    encoder.encode(codes[: min(3, len(codes))])


def load_template(file: str | os.PathLike | None) -> PromptTemplate:
    return DEFAULT_TEMPLATE if file is None else PromptTemplate.load(file)


def special_ids(path: Path, tokenizer, vocab_size: int) -> tuple[int, int | None]:
    """(pad id, bos id) from config.json, else the tokenizer; pad 0 when neither names one."""
    cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    pad = cfg.get("pad_token_id")
    pad = pad if isinstance(pad, int) and 0 <= pad < vocab_size else 0
    bos = cfg.get("bos_token_id")
    return pad, bos if isinstance(bos, int) and 0 <= bos < vocab_size else None


def import_hf_checkpoint(
    path: str | os.PathLike,
    items: str | os.PathLike,
    out: str | os.PathLike,
    pattern: str | SIDPattern = "lcrec",
    prompt_template: str | os.PathLike | None = None,
    dtype: str | None = None,
    max_items: int = 20,
) -> ImportReport:
    """Check every input, then write the checkpoint folder atomically (module doc)."""
    from genrec.workloads.data.item_sids import read_item_sids

    path, out = Path(path), Path(out)
    pat = sid_pattern(pattern)
    template = load_template(prompt_template)  # a template that does not parse fails before any weights
    model, info = load_hf_model(path, "cpu", dtype)
    tokenizer = load_tokenizer(path)
    table = sid_table_from_tokenizer(tokenizer, pat, model.config.vocab_size, str(path / TOKENIZER_FILE))
    sids = read_item_sids(items, pat, table)
    encoder = PromptEncoder(template, tokenizer, pat, table)
    check_template(template, encoder, sids.codes)
    gen = read_generation_config(path)
    codec = SIDCodec.from_table(table)
    pad, bos = special_ids(path, tokenizer, model.config.vocab_size)
    meta = {
        "hf": info.to_dict(),
        "imported": {
            "sid_pattern": pat.to_dict(),
            "items_path": str(Path(items).resolve()),
            "item_ids": [str(i) for i in sids.item_ids],
            "pad_id": pad,
            "bos_id": bos,
            "generation_config": gen,
        },
    }
    write_checkpoint_folder(out, Checkpoint(model, codec, max_items, meta), path, template, sids.codes)
    present = sum(len(table.level_present_ids(level)) for level in range(table.levels))
    gaps = sum(table.codebook_sizes) - present
    sizes, n = table.codebook_sizes, len(sids.codes)
    return ImportReport(out.resolve(), info.to_dict(), sizes, n, present, gaps, overridden(gen))


def write_checkpoint_folder(
    out: Path,
    ckpt: Checkpoint,
    hf_path: Path,
    template: PromptTemplate,
    codes: np.ndarray,
    extra: Callable[[Path], object] | None = None,
) -> Path:
    """Checkpoint + tokenizer + template + items in a temporary sibling, renamed into place at the end;
    `extra(folder)` adds files before the rename (an HF export of a fine-tuned model)."""
    from genrec.workloads.data.dataset import replace_dir
    from genrec.workloads.io import temp_sibling_dir

    staging = temp_sibling_dir(out)
    try:
        folder = save_checkpoint(staging / "checkpoint", ckpt)
        shutil.copyfile(hf_path / TOKENIZER_FILE, folder / TOKENIZER_FILE)
        template.save(folder)
        np.save(folder / ITEMS_FILE, np.ascontiguousarray(codes, dtype=np.int64), allow_pickle=False)
        if extra is not None:
            extra(folder)
        replace_dir(folder, out.resolve())
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


# --- loading ------------------------------------------------------------------------------------------
def is_imported(ckpt: Checkpoint) -> bool:
    return "imported" in ckpt.meta


def imported_inputs(ckpt: Checkpoint) -> ImportedInputs:
    """The prompt encoder and origin of a loaded imported checkpoint (files written by the import)."""
    folder, raw = Path(ckpt.path), ckpt.meta["imported"]
    table: SIDTokenTable = ckpt.codec.table
    tokenizer = load_tokenizer(folder / TOKENIZER_FILE)
    pat = SIDPattern.from_dict(raw["sid_pattern"])
    encoder = PromptEncoder(PromptTemplate.load(folder / TEMPLATE_FILE), tokenizer, pat, table)
    hf = ckpt.meta["hf"]
    backbone = {k: hf[k] for k in BACKBONE_KEYS}
    return ImportedInputs(encoder, int(raw["pad_id"]), raw.get("bos_id"), str(hf["path"]), backbone)


def imported_prompts(
    inputs: ImportedInputs,
    item_codes: np.ndarray,
    histories: list[list[int]],
    max_items: int,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt tokens and mask [B, S]: the last `max_items` items of each history rendered by
    the checkpoint's template and tokenizer (decoding and head training prompt alike)."""
    if any(len(h) == 0 for h in histories):
        raise ValueError("a history is empty; a prompt needs at least one item")
    codes = [item_codes[np.asarray(h[-max_items:], dtype=np.int64)] for h in histories]
    return left_pad(inputs.encoder.encode_batch(codes), inputs.pad_id, device)


def imported_item_codes(ckpt: Checkpoint) -> np.ndarray:
    """[N, L] item codes stored with an imported checkpoint (row = item id)."""
    file = Path(ckpt.path) / ITEMS_FILE
    if not file.is_file():
        raise UserInputError(f"{file}: missing; import the checkpoint again with `genrec model import hf`")
    return np.load(file, allow_pickle=False)
