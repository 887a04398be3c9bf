"""The GR transformer's building blocks: RMSNorm, RoPE, attention (full and cached block), SwiGLU MLP.

Layer and weight names follow the Llama layout (q_proj, gate_proj, input_layernorm, ...); see
transformer.py.

Decoding on a CPU in fp32 (no autograd) takes fused forms of the same arithmetic: one projection for
q/k/v and one for gate/up (the weights concatenated per call), RMSNorm as one call, the q and k heads
normed and rotated together, GQA and an additive mask inside SDPA. Each gives the unfused result bit
for bit there (tests/test_fused_blocks.py), so results do not depend on the path; a small model's
decode step is bound by per-op overhead, which these cut. Training (autograd on), half precision and
GPUs keep the unfused forms. RoPE tables are looked up in a table of every position (GRTransformer.rope)
on every path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from genrec.workloads.models.kv_cache import KVCache, beam_step_index
from genrec.workloads.models.model_config import ModelConfig


def fused_ok(x: Tensor) -> bool:
    """Whether the fused forms apply to activations `x` (see the module doc): fp32 on a CPU, no autograd."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and not torch.is_grad_enabled()


def fused_linear(x: Tensor, linears: tuple[nn.Linear, ...]) -> Tensor:
    """The outputs of `linears` (all with biases or none) concatenated on the last axis, in one product
    (concatenating the small weights per call costs less than a cached copy's staleness check)."""
    weight = torch.cat([lin.weight for lin in linears])
    bias = None if linears[0].bias is None else torch.cat([lin.bias for lin in linears])
    return F.linear(x, weight, bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        if fused_ok(x):  # the same ops in one call (x * rsqrt(mean(x^2) + eps), then the weight)
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # normalise in fp32 (as Llama does) so bf16 training stays stable; fp32 input is not converted
        xf = x if x.dtype == torch.float32 else x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (xf if x.dtype == torch.float32 else xf.to(x.dtype))


def rope_inv_freq(head_dim: int, theta: float, device: torch.device | None = None) -> Tensor:
    """The RoPE inverse frequencies [head_dim / 2] in fp32: theta^(-2i / head_dim)."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)


def llama3_inv_freq(inv_freq: Tensor, cfg: ModelConfig) -> Tensor:
    """Llama 3.1's frequency scaling: wavelengths longer than original_len / low_freq_factor are
    stretched by `factor`, shorter than original_len / high_freq_factor kept, and the band between
    interpolated linearly in original_len / wavelength."""
    factor, low, high = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    original = cfg.rope_original_max_len
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    middle = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(middle, blended, scaled)


def config_inv_freq(cfg: ModelConfig, device: torch.device | None = None) -> Tensor:
    """The inverse frequencies a config's RoPE uses (theta, then its scaling type)."""
    inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, device)
    return llama3_inv_freq(inv_freq, cfg) if cfg.rope_type == "llama3" else inv_freq


def rope_cos_sin(
    positions: Tensor, head_dim: int, theta: float, inv_freq: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """cos/sin tables [..., head_dim] for integer positions (half-split layout, as in Llama).

    `inv_freq` (config_inv_freq) overrides the plain theta^(-2i / head_dim) frequencies."""
    if inv_freq is None:
        inv_freq = rope_inv_freq(head_dim, theta, positions.device)
    freqs = positions.float()[..., None] * inv_freq.to(positions.device)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


@dataclass(frozen=True)
class RopeTables:
    """cos/sin of one forward's positions, prepared once for every layer: [B, 1, S, hd] in the
    activations' dtype, sin with its first half negated, so that x * cos + rotate_half(x) * sin is
    x * cos + roll(x, hd / 2) * sin: one op for the rotation, same bits (a sign flip is exact)."""

    cos: Tensor
    sin: Tensor

    @classmethod
    def at(cls, positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> RopeTables:
        """Tables for integer positions [B, S] and inverse frequencies [hd / 2] (config_inv_freq)."""
        half = inv_freq.shape[0]
        cos, sin = rope_cos_sin(positions[:, None], 2 * half, 0.0, inv_freq)
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        return cls(cos.to(dtype), sin.to(dtype))

    @property
    def length(self) -> int:
        """Positions a table made `at(arange(P)[None])` covers (P)."""
        return self.cos.shape[-2]

    def take(self, positions: Tensor) -> RopeTables:
        """From a table made `at(arange(P)[None])`: the tables of positions [B, S] (all < P), looked up
        (the same bits as computing them: one lookup instead of the eight ops that make them)."""
        cos, sin = self.cos[0, 0], self.sin[0, 0]
        return RopeTables(F.embedding(positions, cos)[:, None], F.embedding(positions, sin)[:, None])

    def apply(self, x: Tensor) -> Tensor:
        """x [B, H, S, hd] -> x rotated by its positions' angles."""
        return x * self.cos + x.roll(x.shape[-1] // 2, dims=-1) * self.sin

    def apply_seq_major(self, x: Tensor) -> Tensor:
        """x [B, S, H, hd] (heads after positions, as projected) -> rotated, same layout."""
        cos, sin = self.cos.transpose(1, 2), self.sin.transpose(1, 2)  # [B, S, 1, hd]
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class Attention(nn.Module):
    """Self-attention with n_kv_heads <= n_heads key/value heads (grouped-query attention: query head
    h reads key/value head h // (n_heads / n_kv_heads)); optional q/k/v and output biases and a
    per-head q/k RMSNorm applied before RoPE (Qwen3)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, q_out, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.dim, kv_out, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.dim, kv_out, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_out, cfg.dim, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def _qkv(self, x: Tensor, rope: RopeTables) -> tuple[Tensor, Tensor, Tensor]:
        """q [B, H, S, hd], k/v [B, Hkv, S, hd] (RoPE applied to q and k)."""
        b, s, _ = x.shape
        h, hkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        if fused_ok(x):  # q and k heads normed and rotated together: half the ops, the same bits
            qkv = fused_linear(x, (self.q_proj, self.k_proj, self.v_proj)).view(b, s, h + 2 * hkv, hd)
            qk, v = qkv[:, :, : h + hkv], qkv[:, :, h + hkv :]
            if self.q_norm is not None:
                weight = torch.cat([self.q_norm.weight.expand(h, hd), self.k_norm.weight.expand(hkv, hd)])
                qk = F.rms_norm(qk, (hd,), None, self.q_norm.eps) * weight
            qk = rope.apply_seq_major(qk)
            return qk[:, :, :h].transpose(1, 2), qk[:, :, h:].transpose(1, 2), v.transpose(1, 2)
        else:
            q = self.q_proj(x).view(b, s, h, hd)
            k = self.k_proj(x).view(b, s, hkv, hd)
            v = self.v_proj(x).view(b, s, hkv, hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return rope.apply(q.transpose(1, 2)), rope.apply(k.transpose(1, 2)), v.transpose(1, 2)

    def forward_full(
        self, x: Tensor, rope: RopeTables, attn_mask: Tensor, last_only: bool = False
    ) -> tuple[Tensor, Tensor, Tensor]:
        """attn_mask [B, 1, S, S]: bool (True = may attend), or additive (0 / -inf) on the fused path.
        `last_only`: the output [B, 1, D] of the last position only (keys and values of all)."""
        q, k, v = self._qkv(x, rope)
        if last_only:
            q, attn_mask = q[:, :, -1:], attn_mask[:, :, -1:]
        out = full_attention(q, k, v, attn_mask)
        b, _, s, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1)), k, v

    def forward_extend(
        self, x: Tensor, rope: RopeTables, cache: KVCache, layer: int, tree_mask, attention, planned=None
    ) -> Tensor:
        """x [B*W, n, D]: write the block's K/V at steps..steps+n, attend through the backend (`planned`:
        the keyword arguments its plan made for this extend call)."""
        q, k, v = self._qkv(x, rope)  # q [N, H, n, hd], k/v [N, Hkv, n, hd]
        t, n = cache.steps, x.shape[1]
        cache.beam_k[layer][:, :, t : t + n] = k
        cache.beam_v[layer][:, :, t : t + n] = v
        bk, bv, extra = cache.beam_k[layer], cache.beam_v[layer], dict(planned or {})
        if cache.beam_rows is not None:
            if getattr(attention, "reads_beam_rows", False):  # the kernel gathers while it loads
                extra["beam_rows"] = cache.beam_rows
            else:  # a backend without the table reads the steps gathered (the new block is its own row)
                index = beam_step_index(cache.beam_rows[:, : t + n], bk.shape[1], bk.shape[2])
                bk, bv = cache._steps_of(bk, t + n, index), cache._steps_of(bv, t + n, index)
        out = attention(
            q, cache.prefix_k[layer], cache.prefix_v[layer], cache.prefix_mask, bk, bv, t, tree_mask, **extra
        )
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], n, -1))


def full_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor) -> Tensor:
    """Masked softmax attention, q [B, H, S, hd], k/v [B, Hkv, S, hd], mask [B, 1, S, S] bool.

    fp32 (our own models) goes through SDPA as before. Half-precision weights (imported bf16/fp16
    checkpoints) take scores, softmax and the value sum in fp32, so rounding does not depend on
    the attention kernel; the result is cast back to q's dtype."""
    groups = q.shape[1] // k.shape[1]
    if fused_ok(q):  # SDPA reads each key/value head for its group itself
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=groups > 1)
    if groups > 1:  # each key/value head serves `groups` consecutive query heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if q.dtype == torch.float32:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    scores = (q.float() @ k.float().transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    scores = scores.masked_fill(~attn_mask, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v.float()).to(q.dtype)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.hidden_dim, cfg.dim, bias=cfg.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        if fused_ok(x):
            gate, up = fused_linear(x, (self.gate_proj, self.up_proj)).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)
