"""The GR transformer's building blocks: RMSNorm, RoPE, attention (full and cached block), SwiGLU MLP.

Layer and weight names follow the Llama layout (q_proj, gate_proj, input_layernorm, ...); see
transformer.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from genrec.workloads.models.kv_cache import KVCache, beam_step_index
from genrec.workloads.models.model_config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # normalise in fp32 (as Llama does) so bf16 training stays stable
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos/sin tables [..., head_dim] for integer positions (half-split layout, as in Llama)."""
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    )
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, H, S, hd]; cos/sin [B, S, hd]."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.o_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def _qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, s, _ = x.shape
        shape = (b, s, self.n_heads, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward_full(
        self, x: Tensor, cos: Tensor, sin: Tensor, attn_mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self._qkv(x, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        b, _, s, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1)), k, v

    def forward_extend(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, layer: int, tree_mask, attention
    ) -> Tensor:
        """x [B*W, n, D]: write the block's K/V at steps..steps+n, attend through the backend."""
        q, k, v = self._qkv(x, cos, sin)  # [N, H, n, hd]
        t, n = cache.steps, x.shape[1]
        cache.beam_k[layer][:, :, t : t + n] = k
        cache.beam_v[layer][:, :, t : t + n] = v
        bk, bv, extra = cache.beam_k[layer], cache.beam_v[layer], {}
        if cache.beam_rows is not None:
            if getattr(attention, "reads_beam_rows", False):  # the kernel gathers while it loads
                extra = {"beam_rows": cache.beam_rows}
            else:  # a backend without the table reads the steps gathered (the new block is its own row)
                index = beam_step_index(cache.beam_rows[:, : t + n], bk.shape[1], bk.shape[2])
                bk, bv = cache._steps_of(bk, t + n, index), cache._steps_of(bv, t + n, index)
        out = attention(
            q, cache.prefix_k[layer], cache.prefix_v[layer], cache.prefix_mask, bk, bv, t, tree_mask, **extra
        )
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], n, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.down_proj = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)
