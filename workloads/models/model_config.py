"""The GR transformer's configuration (`ModelConfig`, stored in a checkpoint's config.json) and the named
sizes (`MODEL_SIZES`) that `genrec train --model-size` picks from."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    hidden_dim: int = 0  # SwiGLU width; 0 -> 8/3 * dim rounded up to a multiple of 32
    max_seq_len: int = 1024
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 2:
            raise ValueError(f"dim {self.dim} must split into {self.n_heads} heads of even size")
        if self.hidden_dim == 0:
            object.__setattr__(self, "hidden_dim", 32 * math.ceil(8 * self.dim / 3 / 32))

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)


# Named sizes. tiny trains in seconds in CI; small is the CPU benchmark model; base is for GPUs.
MODEL_SIZES: dict[str, dict] = {
    "tiny": dict(dim=64, n_layers=2, n_heads=4),
    "small": dict(dim=128, n_layers=4, n_heads=4),
    "base": dict(dim=512, n_layers=8, n_heads=8),
}


def model_config_for(size: str, vocab_size: int, max_seq_len: int) -> ModelConfig:
    if size not in MODEL_SIZES:
        from genrec.workloads.errors import UserInputError

        raise UserInputError(f"unknown model size {size!r}; choose one of {sorted(MODEL_SIZES)}")
    return ModelConfig(vocab_size=vocab_size, max_seq_len=max_seq_len, **MODEL_SIZES[size])
