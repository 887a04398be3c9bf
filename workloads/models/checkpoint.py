"""Checkpoints: `model.safetensors` + `config.json` in one folder (no pickle anywhere).

config.json holds the model config, the SID codec, the prompt window and whatever the trainer
adds (dataset path, training config, best validation loss), so a checkpoint folder is all
`genrec eval` needs besides the dataset it names. A model with a draft head (NEZHA, MTP; see
nezha_head.py) also stores the head's config under "head" and its tensors in model.safetensors
under the `draft_head.` prefix.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from genrec.workloads.errors import UserInputError
from genrec.workloads.models.nezha_head import (
    DraftHead,
    HeadConfig,
    build_head,
    head_state_dict,
    split_head_tensors,
)
from genrec.workloads.models.transformer import GRTransformer, ModelConfig
from genrec.workloads.sid_codec import SIDCodec

FORMAT_VERSION = 1


@dataclass
class Checkpoint:
    model: GRTransformer
    codec: SIDCodec
    max_items: int  # history items in a prompt
    meta: dict  # everything else in config.json
    path: Path | None = None
    head: DraftHead | None = None  # a NEZHA / MTP draft head trained on this backbone


def save_checkpoint(out: str | os.PathLike, ckpt: Checkpoint) -> Path:
    """Write atomically: a temp sibling folder renamed into place."""
    from genrec.workloads.data.dataset import replace_dir

    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        state = {k: v.detach().contiguous().cpu() for k, v in ckpt.model.state_dict().items()}
        head = ckpt.head
        if head is not None:  # a draft head (NEZHA, MTP): its tensors under a prefix, same file
            state.update(head_state_dict(head))
        save_file(state, tmp / "model.safetensors")
        config = {
            "format_version": FORMAT_VERSION,
            "model": ckpt.model.config.to_dict(),
            "codec": ckpt.codec.to_dict(),
            "max_items": ckpt.max_items,
            **ckpt.meta,
        }
        if head is not None:
            config["head"] = head.config.to_dict()
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def update_checkpoint_meta(path: str | os.PathLike, updates: dict) -> Path:
    """Merge `updates` into a checkpoint's config.json (atomically); the weights are left alone."""
    from genrec.workloads.io import atomic_write_text

    cfg_path = Path(path) / "config.json"
    config = json.loads(cfg_path.read_text())
    config.update(updates)
    return atomic_write_text(cfg_path, json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> Checkpoint:
    path = Path(path)
    cfg_path, weights = path / "config.json", path / "model.safetensors"
    if not cfg_path.is_file() or not weights.is_file():
        raise UserInputError(
            f"{path}: not a genrec checkpoint (needs config.json and model.safetensors); "
            "train one with `genrec train --data DIR --out DIR`"
        )
    try:
        config = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise UserInputError(f"{cfg_path}: not valid JSON ({e})") from e
    if config.get("format_version") != FORMAT_VERSION:
        raise UserInputError(
            f"{cfg_path}: format_version {config.get('format_version')!r}, expected {FORMAT_VERSION}"
        )
    model_cfg = ModelConfig(**config.pop("model"))
    codec = SIDCodec.from_dict(config.pop("codec"))
    max_items = int(config.pop("max_items"))
    config.pop("format_version")
    head_cfg = config.pop("head", None)
    model = GRTransformer(model_cfg)
    state, head_state = split_head_tensors(load_file(weights, device="cpu"))
    model.load_state_dict(state)
    model.to(device).eval()
    head = None
    if head_cfg is not None:
        head = build_head(HeadConfig.from_dict(head_cfg))
        head.load_state_dict(head_state)
        head = head.to(device).eval()
    elif head_state:
        raise UserInputError(f"{cfg_path}: the weights hold draft-head tensors but the config has no head")
    return Checkpoint(model, codec, max_items, config, path, head)
