"""Ranking checkpoints: `model.safetensors` + `config.json` in one folder (no pickle anywhere).

config.json:

    {"format": "genrec-ranking", "format_version": 1,
     "config": {RankingConfig fields}, "meta": {whatever the trainer adds: steps, seed, valid_auc}}

`save_ranking` writes atomically (a temp sibling folder renamed into place); `load_ranking` turns a
missing or malformed folder into a UserInputError that names the file and the fix.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from genrec.workloads.errors import UserInputError
from genrec.workloads.ranking.model import RankingConfig, RankingModel

FORMAT = "genrec-ranking"
FORMAT_VERSION = 1
HOW_TO_MAKE = "make one with `genrec rank train --out DIR`"


def save_ranking(out_dir: str | os.PathLike, model: RankingModel, meta: dict[str, Any] | None = None) -> Path:
    """Write `model` to `out_dir` (replaced if it exists); nothing half-written on failure."""
    from genrec.workloads.data.dataset import replace_dir

    out = Path(out_dir).expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(state, tmp / "model.safetensors")
        config = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "config": asdict(model.cfg),
            "meta": dict(meta or {}),
        }
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")
        # mkdtemp makes 0700 (and safetensors 0600): a checkpoint should be readable like any folder
        os.chmod(tmp, 0o755)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_ranking_config(path: str | os.PathLike) -> tuple[RankingConfig, dict[str, Any]]:
    """Check a ranking checkpoint folder without loading its weights: (config, meta)."""
    path = Path(path)
    cfg_path, weights = path / "config.json", path / "model.safetensors"
    if not path.is_dir():
        raise UserInputError(f"ranking checkpoint {path}: no such folder; {HOW_TO_MAKE}")
    missing = [p.name for p in (cfg_path, weights) if not p.is_file()]
    if missing:
        raise UserInputError(
            f"ranking checkpoint {path}: {' and '.join(missing)} missing (a ranking checkpoint holds "
            f"config.json and model.safetensors); {HOW_TO_MAKE}"
        )
    try:
        raw = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserInputError(f"{cfg_path}: not valid JSON ({e}); {HOW_TO_MAKE}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise UserInputError(
            f"{cfg_path}: not a ranking checkpoint (format {got!r}, expected {FORMAT!r}); "
            f"a GR model checkpoint goes in `model`, not `ranking`; {HOW_TO_MAKE}"
        )
    if raw.get("format_version") != FORMAT_VERSION:
        raise UserInputError(
            f"{cfg_path}: format_version {raw.get('format_version')!r}, expected {FORMAT_VERSION}; "
            f"{HOW_TO_MAKE}"
        )
    values = raw.get("config")
    if not isinstance(values, dict):
        raise UserInputError(f"{cfg_path}: `config` must be an object of RankingConfig fields; {HOW_TO_MAKE}")
    names = {f.name for f in fields(RankingConfig)}
    unknown, absent = sorted(set(values) - names), sorted(names - set(values))
    if unknown or absent:
        raise UserInputError(
            f"{cfg_path}: `config` has unknown fields {unknown} and lacks {absent}; expected {sorted(names)}"
        )
    try:
        cfg = RankingConfig(**values).validate()
    except UserInputError as e:
        raise UserInputError(f"{cfg_path}: {e}") from None
    meta = raw.get("meta") or {}
    return cfg, meta if isinstance(meta, dict) else {}


def load_ranking(path: str | os.PathLike, device: str | torch.device = "cpu") -> RankingModel:
    """A saved ranking model in eval mode on `device`; its config.json's meta is `model.meta`."""
    path = Path(path)
    cfg, meta = read_ranking_config(path)
    weights = path / "model.safetensors"
    try:
        state = load_file(weights, device="cpu")
    except Exception as e:  # safetensors raises its own error type for a truncated or foreign file
        raise UserInputError(f"{weights}: not a readable safetensors file ({e}); {HOW_TO_MAKE}") from None
    model = RankingModel(cfg)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).splitlines()[0:3]
        raise UserInputError(
            f"{weights}: the tensors do not match config.json's RankingConfig ({' '.join(first)}); "
            f"re-save the model or {HOW_TO_MAKE}"
        ) from None
    model.meta = meta
    return model.to(device).eval()
