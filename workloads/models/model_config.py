"""The GR transformer's configuration (`ModelConfig`, stored in a checkpoint's config.json) and the named
sizes (`MODEL_SIZES`) that `genrec train --model-size` picks from.

Our own models use the first eight fields. The rest describe what imported Hugging Face Llama /
Mistral / Qwen2 / Qwen3 checkpoints need (hf_import.py): grouped-query attention (`n_kv_heads`), a head
size not equal to dim / n_heads (Qwen3), q/k/v and output biases, per-head q/k RMSNorm, tied embeddings
and the `llama3` RoPE frequency scaling. `to_dict` writes those fields only where they differ from
the plain model, so our own checkpoints' config.json stays byte-identical.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

ROPE_TYPES = ("default", "llama3")


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
    # --- what imported families add (defaults: our own model) ---------------------------------
    n_kv_heads: int = 0  # key/value heads (grouped-query attention); 0 -> n_heads
    head_dim: int = 0  # per-head size; 0 -> dim // n_heads
    qkv_bias: bool = False  # biases on q/k/v projections (Qwen2; Llama/Qwen3 `attention_bias`)
    o_bias: bool = False  # bias on the output projection (Llama/Qwen3 `attention_bias`)
    mlp_bias: bool = False  # biases on the SwiGLU projections (Llama `mlp_bias`)
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3)
    tie_embeddings: bool = False  # the LM head is the token embedding matrix
    rope_type: str = "default"  # "default" or "llama3" (Llama 3.1 frequency scaling)
    rope_factor: float = 1.0  # llama3: the scaling factor
    rope_low_freq_factor: float = 1.0  # llama3
    rope_high_freq_factor: float = 4.0  # llama3
    rope_original_max_len: int = 8192  # llama3: original_max_position_embeddings

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            if self.dim % self.n_heads:
                raise ValueError(f"dim {self.dim} must split into {self.n_heads} heads of even size")
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.head_dim % 2:
            raise ValueError(f"dim {self.dim} must split into {self.n_heads} heads of even size")
        if self.n_kv_heads == 0:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} must be a multiple of n_kv_heads {self.n_kv_heads}")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {self.rope_type!r} is not one of {list(ROPE_TYPES)}")
        if self.hidden_dim == 0:
            object.__setattr__(self, "hidden_dim", 32 * math.ceil(8 * self.dim / 3 / 32))

    @property
    def kv_groups(self) -> int:
        """Query heads per key/value head (1: plain multi-head attention)."""
        return self.n_heads // self.n_kv_heads

    def to_dict(self) -> dict:
        """The config as stored; fields an own model leaves at their plain value are left out."""
        out = asdict(self)
        plain = {f.name: f.default for f in fields(self) if f.name in EXTENSION_FIELDS}
        plain.update(n_kv_heads=self.n_heads, head_dim=self.dim // self.n_heads)
        for name, value in plain.items():
            if out[name] == value and (name != "head_dim" or self.dim % self.n_heads == 0):
                del out[name]
        return out


EXTENSION_FIELDS = (
    "n_kv_heads",
    "head_dim",
    "qkv_bias",
    "o_bias",
    "mlp_bias",
    "qk_norm",
    "tie_embeddings",
    "rope_type",
    "rope_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_len",
)


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
