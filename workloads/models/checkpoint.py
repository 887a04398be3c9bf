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
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from genrec.workloads.errors import UserInputError
from genrec.workloads.io import temp_sibling_dir
from genrec.workloads.models.checkpoint_limits import (
    check_against_weights,
    check_model_section,
    check_prompt_window,
)
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.nezha_head import (
    DraftHead,
    HeadConfig,
    build_head,
    head_state_dict,
    split_head_tensors,
)
from genrec.workloads.models.transformer import GRTransformer
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
    tmp = temp_sibling_dir(out)  # removes what a killed earlier writer of `out` left behind
    try:
        state = model_tensors(ckpt.model)
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


def model_tensors(model: GRTransformer) -> dict[str, torch.Tensor]:
    """The state dict to store: contiguous CPU tensors; a tied LM head is stored once, as the embedding
    (safetensors refuses two names for one storage)."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        del state["lm_head.weight"]
    return state


def weights_dtype(state: dict[str, torch.Tensor]) -> torch.dtype:
    """The floating dtype the weights share (fp32 when mixed or none)."""
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else torch.float32


def update_checkpoint_meta(path: str | os.PathLike, updates: dict) -> Path:
    """Merge `updates` into a checkpoint's config.json (atomically); the weights are left alone."""
    from genrec.workloads.io import atomic_write_text

    cfg_path = Path(path) / "config.json"
    config = json.loads(cfg_path.read_text())
    config.update(updates)
    return atomic_write_text(cfg_path, json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")


CONFIG_SECTIONS = ("format_version", "model", "codec", "max_items")  # what every config.json holds
RETRAIN_HINT = "restore the folder from a copy or retrain it with `genrec train --data DIR --out DIR`"


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> Checkpoint:
    """Load a checkpoint folder; a corrupt or inconsistent file raises UserInputError naming it."""
    path = Path(path)
    cfg_path, weights = path / "config.json", path / "model.safetensors"
    if not cfg_path.is_file() or not weights.is_file():
        raise UserInputError(
            f"{path}: not a genrec checkpoint (needs config.json and model.safetensors); "
            "train one with `genrec train --data DIR --out DIR`"
        )
    config = read_checkpoint_config(cfg_path)
    raw_model = config.pop("model")
    if isinstance(raw_model, dict):  # ranges first: a hostile size must not reach a constructor
        check_model_section(cfg_path, raw_model, RETRAIN_HINT)
    model_cfg = _section(cfg_path, "model", ModelConfig, raw_model)
    codec = _codec(cfg_path, config.pop("codec"))
    max_items = _positive_int(cfg_path, "max_items", config.pop("max_items"))
    check_prompt_window(cfg_path, max_items, codec.levels, model_cfg.max_seq_len, RETRAIN_HINT)
    check_against_weights(cfg_path, weights, model_cfg, RETRAIN_HINT)
    config.pop("format_version")
    head_raw = config.pop("head", None)
    head_cfg = None if head_raw is None else _section(cfg_path, "head", HeadConfig, head_raw)
    if model_cfg.vocab_size < codec.vocab_size:  # some SID tokens would have no logit
        raise UserInputError(
            f"{cfg_path}: model.vocab_size {model_cfg.vocab_size} is smaller than the codec's "
            f"{codec.vocab_size} tokens (codebook sizes {list(codec.codebook_sizes)}); {RETRAIN_HINT}"
        )
    state, head_state = split_head_tensors(read_weights(weights))
    model = _build(cfg_path, "model", GRTransformer, model_cfg)
    if model_cfg.tie_embeddings and "embed_tokens.weight" in state:  # stored once (see model_tensors)
        state.setdefault("lm_head.weight", state["embed_tokens.weight"])
    model.to(weights_dtype(state))  # bf16/fp16 weights (imported checkpoints) stay in their dtype
    _load_state(model, state, weights, cfg_path)
    model.tie_weights()
    model.to(device).eval()
    head = None
    if head_cfg is not None:
        head = _build(cfg_path, "head", build_head, head_cfg)
        _load_state(head, head_state, weights, cfg_path)
        head = head.to(device).eval()
    elif head_state:
        raise UserInputError(f"{cfg_path}: the weights hold draft-head tensors but the config has no head")
    return Checkpoint(model, codec, max_items, config, path, head)


def read_checkpoint_config(cfg_path: Path) -> dict:
    """config.json as a dict with the sections every checkpoint has, or UserInputError naming the file."""
    try:
        config = json.loads(cfg_path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise UserInputError(f"{cfg_path}: not valid JSON ({e}); {RETRAIN_HINT}") from None
    if not isinstance(config, dict):
        raise UserInputError(
            f"{cfg_path}: expected a JSON object, got {type(config).__name__}; {RETRAIN_HINT}"
        )
    if config.get("format_version") != FORMAT_VERSION:
        raise UserInputError(
            f"{cfg_path}: format_version {config.get('format_version')!r}, expected {FORMAT_VERSION}"
        )
    missing = [k for k in CONFIG_SECTIONS if k not in config]
    if missing:
        raise UserInputError(f"{cfg_path}: missing key(s) {missing}; {RETRAIN_HINT}")
    return config


def _section(cfg_path: Path, name: str, cls: type, raw: object):
    """A config section -> its dataclass; unknown or missing keys and bad values name the section."""
    if not isinstance(raw, dict):
        raise UserInputError(
            f"{cfg_path}: `{name}` must be an object, got {type(raw).__name__}; {RETRAIN_HINT}"
        )
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UserInputError(
            f"{cfg_path}: unknown key(s) {unknown} in `{name}`; valid keys are {sorted(known)}. "
            + RETRAIN_HINT
        )
    try:
        return cls.from_dict(raw) if hasattr(cls, "from_dict") else cls(**raw)
    except (TypeError, ValueError, KeyError) as e:
        raise UserInputError(f"{cfg_path}: `{name}` is invalid ({e}); {RETRAIN_HINT}") from None


def _build(cfg_path: Path, name: str, build, cfg):
    """A module from its config; sizes no module can have (0 or negative dims) name the section."""
    try:
        return build(cfg)
    except (RuntimeError, ValueError, TypeError) as e:
        raise UserInputError(f"{cfg_path}: `{name}` describes no valid model ({e}); {RETRAIN_HINT}") from None


def _codec(cfg_path: Path, raw: object) -> SIDCodec:
    sizes = raw.get("codebook_sizes") if isinstance(raw, dict) else None
    if not (isinstance(sizes, list) and sizes and all(type(s) is int and s > 0 for s in sizes)):
        raise UserInputError(
            f'{cfg_path}: `codec` must be {{"codebook_sizes": [positive ints]}}, got {raw!r:.200}; '
            + RETRAIN_HINT
        )
    try:
        return SIDCodec.from_dict(raw)
    except (TypeError, ValueError) as e:
        raise UserInputError(f"{cfg_path}: `codec` is invalid ({e}); {RETRAIN_HINT}") from None


def _positive_int(cfg_path: Path, name: str, value: object) -> int:
    if type(value) is not int or value < 1:
        raise UserInputError(f"{cfg_path}: `{name}` must be a positive integer, got {value!r:.100}")
    return value


def read_weights(weights: Path) -> dict[str, torch.Tensor]:
    """model.safetensors -> tensors; a truncated, empty or foreign file is a UserInputError."""
    try:
        return load_file(weights, device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        raise UserInputError(
            f"{weights}: not a readable safetensors file ({e}; {weights.stat().st_size} bytes); "
            f"the file is truncated or corrupt: {RETRAIN_HINT}"
        ) from None


def _load_state(
    module: torch.nn.Module, state: dict[str, torch.Tensor], weights: Path, cfg_path: Path
) -> None:
    """Weights that do not fit the config (a changed dim or vocab_size, missing tensors) name both files."""
    try:
        module.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        detail = "; ".join(line.strip() for line in first[1:4]) or first[0]
        raise UserInputError(
            f"{weights} does not match {cfg_path} ({detail}); the two files come from different "
            f"models or one was edited: {RETRAIN_HINT}"
        ) from None
