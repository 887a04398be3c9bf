"""Range checks on a checkpoint's config.json, run before any tensor is allocated.

A config.json is a file anyone can edit: `n_layers: 100000` would build modules until memory runs out,
`n_heads: 0` divides by zero, `max_seq_len: 0` or a `max_items` no prompt can hold fail deep inside the
first call. `check_model_section` bounds each number of the `model` section (types too) before the
config object is built; `check_against_weights` compares the smallest parameter count the config
implies with the count the weight file's header lists, so a config describing a far larger model
than its weights is refused without building it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from genrec.workloads.errors import UserInputError

# inclusive bounds; far above any model this project trains or imports, far below what exhausts memory
MODEL_INT_RANGES: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 1 << 24),
    "dim": (2, 1 << 16),
    "n_layers": (1, 1024),
    "n_heads": (1, 1024),
    "hidden_dim": (0, 1 << 18),  # 0: derived from dim
    "max_seq_len": (2, 1 << 20),
}


def check_model_section(cfg_path: Path, raw: dict[str, Any], hint: str) -> None:
    """Each number of the `model` section has its type and range, else UserInputError naming it."""
    for name, (low, high) in MODEL_INT_RANGES.items():
        if name not in raw:
            continue
        value = raw[name]
        if type(value) is not int or not low <= value <= high:
            raise UserInputError(
                f"{cfg_path}: `model.{name}` must be an integer in {low}..{high}, got {value!r:.60}; {hint}"
            )
    for name in ("rope_theta", "norm_eps"):
        value = raw.get(name, 1.0)
        ok = type(value) in (int, float) and math.isfinite(value) and value > 0
        if not ok:
            raise UserInputError(
                f"{cfg_path}: `model.{name}` must be a positive finite number, got {value!r:.60}; {hint}"
            )


def check_prompt_window(cfg_path: Path, max_items: int, levels: int, max_seq_len: int, hint: str) -> None:
    """A prompt of `max_items` items (1 + levels tokens each, as built) must fit the model's positions."""
    need = 1 + levels * max_items
    if need > max_seq_len:
        raise UserInputError(
            f"{cfg_path}: `max_items` {max_items} makes prompts of {need} tokens, beyond the model's "
            f"max_seq_len {max_seq_len}; {hint}"
        )


def minimum_parameters(vocab_size: int, dim: int, n_layers: int, hidden_dim: int) -> int:
    """The fewest parameters a model of this config can have: the token embedding, and per layer the
    query and output projections (dim x dim each, whatever the key/value heads) and SwiGLU's three."""
    return vocab_size * dim + n_layers * (2 * dim * dim + 3 * dim * hidden_dim)


MAX_HEADER_BYTES = 100 << 20  # a safetensors header listing tensors; never near this in practice


def stored_parameters(weights: Path) -> int | None:
    """The number of values the safetensors header of `weights` lists (no tensor is read), or None when
    the header cannot be read (the loader then names the file as unreadable)."""
    try:
        with open(weights, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= MAX_HEADER_BYTES:
                return None
            header = json.loads(f.read(size))
        return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None


def check_against_weights(cfg_path: Path, weights: Path, model_cfg: Any, hint: str) -> None:
    """The weights hold at least the config's smallest parameter count, else UserInputError (before
    anything is allocated for the model)."""
    need = minimum_parameters(model_cfg.vocab_size, model_cfg.dim, model_cfg.n_layers, model_cfg.hidden_dim)
    stored = stored_parameters(weights)
    if stored is not None and need > stored:
        raise UserInputError(
            f"{weights}: holds {stored:,} values but {cfg_path.name}'s `model` needs at least {need:,}: "
            f"{weights.name} does not match its config; {hint}"
        )
