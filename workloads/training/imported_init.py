"""`genrec train --objective nezha|mtp --init MODEL`: a draft head on an imported frozen backbone.

MODEL is a folder written by `genrec model import hf` (or by an earlier run of this). The dataset's
items must be spellable by the checkpoint's SID token table (LC-Rec tokenizers hold only the codes some
item uses, so codebook sizes may differ from the dataset's); item tokens come from that table and
prompts from the checkpoint's stored template and tokenizer, exactly as decoding builds them. The
placeholders <SP_1>..<SP_L> are the checkpoint's pad id at every level: an imported vocabulary has no
tokens of ours, and a frozen backbone cannot learn new ones; the placeholder states still differ by
position and by the earlier placeholders each one attends. The result is again an imported checkpoint
(its tokenizer, template and the dataset's item SIDs beside it) with the head added: `genrec eval` and
`load_imported_context` load it like the import, and the backbone tensors are the init's, unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from genrec.workloads.data.dataset import Dataset
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.checkpoint import Checkpoint, load_checkpoint
from genrec.workloads.models.hf_checkpoint import (
    ImportedInputs,
    imported_inputs,
    imported_prompts,
    is_imported,
    write_checkpoint_folder,
)
from genrec.workloads.models.nezha_head import DraftHead
from genrec.workloads.tokenize.prompt_template import TEMPLATE_FILE, PromptTemplate
from genrec.workloads.training.nezha_objective import FrozenBackbone


@dataclass(frozen=True)
class InitModel:
    """The imported checkpoint a run starts from, and how to prompt it."""

    folder: Path
    ckpt: Checkpoint
    inputs: ImportedInputs


def load_init(path: str | os.PathLike, device: torch.device) -> InitModel:
    ckpt = load_checkpoint(path, device)
    if not is_imported(ckpt):
        raise UserInputError(
            f"--init {path}: not an imported checkpoint; import one with `genrec model import hf` "
            "(a head for one of our models trains with the backbone: drop --init)"
        )
    return InitModel(Path(path), ckpt, imported_inputs(ckpt))


def check_dataset(init: InitModel, ds: Dataset, data_dir: str | os.PathLike) -> np.ndarray:
    """The dataset's item codes, refused unless the checkpoint's SID table spells every one."""
    codes = ds.item_codes()
    init.ckpt.codec.table.check_item_codes(codes, where=f"dataset {data_dir}")
    return codes


def frozen_backbone(init: InitModel, item_codes: np.ndarray, max_items: int) -> FrozenBackbone:
    """Prompts of the dataset's items through the checkpoint's template; the pad id as placeholders."""
    device, inputs = init.ckpt.model.device, init.inputs

    def prompts(histories: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return imported_prompts(inputs, item_codes, histories, max_items, device)

    return FrozenBackbone(prompts, (inputs.pad_id,) * init.ckpt.codec.levels)


def init_meta(init: InitModel, data_dir: str | os.PathLike, num_items: int) -> dict:
    """The init's backbone and import records, with the dataset's catalogue as the items."""
    imported = dict(init.ckpt.meta["imported"])
    imported |= {"items_path": str(Path(data_dir).resolve()), "item_ids": [str(i) for i in range(num_items)]}
    return {"hf": init.ckpt.meta["hf"], "imported": imported, "init": str(init.folder.resolve())}


def save_from_init(
    out: str | os.PathLike,
    init: InitModel,
    head: DraftHead,
    max_items: int,
    meta: dict,
    item_codes: np.ndarray,
) -> Path:
    """The init's backbone + the trained head, with its tokenizer, template and the items (atomically)."""
    ckpt = Checkpoint(init.ckpt.model, init.ckpt.codec, max_items, meta, head=head)
    template = PromptTemplate.load(init.folder / TEMPLATE_FILE)
    return write_checkpoint_folder(Path(out), ckpt, init.folder, template, item_codes)
