"""Decode-state bytes of a beam search, from the model config alone (no tensors allocated).

Our cache (kv_cache.py) keeps the prompt's keys/values once per user and only the decoded steps per
beam row; a Hugging Face beam search copies the prompt into every beam row's cache. With grouped-query
attention both store n_kv_heads heads per token (transformers' caches hold the key/value heads, not
the repeated query heads), so GQA shrinks both sides alike and the ratio is set by the prompt
sharing: roughly W * (S + T) / (S + W * T) for W beams, S prompt and T decoded tokens.

    ours       prompt K/V [B, Hkv, S, hd] per layer (x2 for K and V) + prompt mask [B, S] bool and
               lengths [B] int64; per-beam K/V [B*W, Hkv, T, hd] per layer (x2); the indexed layout's
               row table [B*W, T] int64 (xGR's in-place reorder).
    hf         per-beam K/V [B*W, Hkv, S + T, hd] per layer (x2), steady state; its reorder
               (index_select per layer) briefly holds one more layer (`hf_reorder_transient`).

T is the decoded steps whose keys/values are cached: L - 1 for an L-level SID (the last token is
scored, never attended to). Weights, activations and logits are the same on both sides and left out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from genrec.workloads.models.model_config import ModelConfig

INDEX_BYTES = 8  # int64 row table, prompt lengths


@dataclass(frozen=True)
class DecodeStateBytes:
    shared_prompt: int  # prompt K/V stored once per user (+ its mask and lengths)
    per_beam: int  # decoded steps' K/V of every beam row
    row_table: int  # the indexed layout's [B*W, T] int64 table (0 for the copying layout)
    hf_per_beam: int  # Hugging Face: prompt + decoded K/V copied into every beam row
    hf_reorder_transient: int  # one layer's per-beam K/V copied during HF's reorder

    @property
    def ours(self) -> int:
        return self.shared_prompt + self.per_beam + self.row_table

    @property
    def ratio(self) -> float:
        """HF's steady-state decode state over ours (> 1: ours is smaller)."""
        return self.hf_per_beam / self.ours

    def to_dict(self) -> dict:
        return asdict(self) | {"ours": self.ours, "ratio": self.ratio}


def kv_bytes_per_token(cfg: ModelConfig, elem_bytes: int) -> int:
    """Bytes of one token's keys and values across all layers."""
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * elem_bytes


def decode_state_bytes(
    cfg: ModelConfig,
    *,
    users: int,
    beams: int,
    prompt_len: int,
    steps: int,
    elem_bytes: int = 2,
    indexed: bool = True,
) -> DecodeStateBytes:
    """Decode-state bytes of `users` prompts of `prompt_len` tokens (padded width) decoded with `beams`
    beams for `steps` cached steps; elem_bytes 2 for bf16/fp16, 4 for fp32."""
    if min(users, beams, prompt_len) < 1 or steps < 0 or elem_bytes < 1:
        raise ValueError("users, beams, prompt_len and elem_bytes must be >= 1 and steps >= 0")
    per_token = kv_bytes_per_token(cfg, elem_bytes)
    rows = users * beams
    layer_row_bytes = per_token // cfg.n_layers
    return DecodeStateBytes(
        shared_prompt=users * prompt_len * per_token + users * prompt_len + users * INDEX_BYTES,
        per_beam=rows * steps * per_token,
        row_table=rows * steps * INDEX_BYTES if indexed else 0,
        hf_per_beam=rows * (prompt_len + steps) * per_token,
        hf_reorder_transient=rows * (prompt_len + steps) * layer_row_bytes,
    )
