"""A decoder-only transformer (RMSNorm, RoPE, SwiGLU) with the KV-cache API that decoders drive.

Layer and weight names follow the Llama layout (q_proj, gate_proj, input_layernorm, ...) so the
same weights load into a Hugging Face `LlamaForCausalLM` for side-by-side comparisons.

Decoders use these calls:
    out = model.prefill(tokens, mask)          # once per user; logits + hidden of the last position
    cache = out.cache.expand(beams, steps)     # view the prompt cache as `beams` rows per user
    ext = model.extend(tokens, cache, tree)    # append n tokens per beam row, any intra-block pattern
    step = model.step(next_tokens, cache)      # extend with n = 1
    cache.reorder(parent)                      # beams follow their parents after top-k
    cache.keep(start, index) / truncate(steps) # commit a verified draft branch, drop the rest

`extend` is one cached forward over a block of n tokens per row (gpt-fast's shape: speculative
verification is the same forward over the draft). A tree mask [R, n, n] lets each new token see only
its ancestors in a draft tree; RoPE positions follow each token's depth in the tree.

The prompt's keys/values are stored once per user, not once per beam: a decode step attends to
the shared prompt cache and to the beam's own (short) cache through a named attention backend
(genrec.kernels.shared_prefix_attention: two stages merged by online softmax). Reordering beams
therefore copies only the few decoded steps, never the prompt (the layout xGR describes).
`expand(..., indexed=True)` goes further (xGR's in-place reorder): decoded steps stay where they were
written and `reorder` only updates a per-step row table ([B*W, T] ints, shared by all layers); the
attention reads each step through it (a Triton backend that takes `beam_rows` gathers while loading,
any other backend gets the steps gathered per layer first).
Prompts are left-padded: `mask` marks real tokens and positions count real tokens only, so rows
of different lengths decode in lock step.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from genrec.kernels.shared_prefix_attention import get_attention_backend


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


# --- building blocks ------------------------------------------------------------------------------
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


def causal_attention_inputs(tokens: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """RoPE positions [B, S] and attention mask [B, S, S] of left-padded causal rows.

    Positions count real tokens only; a pad query sees only itself, so no softmax row is empty
    (its output is never used).
    """
    if mask is None:
        mask = torch.ones_like(tokens, dtype=torch.bool)
    s = tokens.shape[1]
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    causal = torch.ones(s, s, dtype=torch.bool, device=tokens.device).tril()
    eye = torch.eye(s, dtype=torch.bool, device=tokens.device)
    return positions, (causal & mask[:, None, :]) | eye


# --- the KV cache -----------------------------------------------------------------------------
@dataclass
class KVCache:
    """Prompt cache shared by a user's beams + a per-beam cache of decoded steps.

    prefix_k/v[layer]: [B, H, S, hd]      one copy per user
    prefix_mask:       [B, S] bool        real (non-pad) prompt tokens
    prefix_len:        [B] long           real prompt tokens = position of the first decoded token
    beam_k/v[layer]:   [B*W, H, T, hd]    T = capacity in decoded steps; row b*W + j is beam j of user b
    beam_rows:         [B*W, T] long      indexed layout only (None: copying layout): decoded step t of
                                          row r lives in storage row beam_rows[r, t], at slot t
    """

    prefix_k: list[Tensor]
    prefix_v: list[Tensor]
    prefix_mask: Tensor
    prefix_len: Tensor
    beams: int = 1
    steps: int = 0
    beam_k: list[Tensor] = field(default_factory=list)
    beam_v: list[Tensor] = field(default_factory=list)
    beam_rows: Tensor | None = None

    @property
    def batch(self) -> int:
        return self.prefix_mask.shape[0]

    @property
    def rows(self) -> int:
        return self.batch * self.beams

    def prompt_of(self, users: Tensor | None = None) -> KVCache:
        """The prompt part alone (no decoded steps) for `users` (indices; None = all, not copied)."""
        if users is None:
            return KVCache(self.prefix_k, self.prefix_v, self.prefix_mask, self.prefix_len)
        pick = [t.index_select(0, users) for t in (*self.prefix_k, *self.prefix_v)]
        n = len(self.prefix_k)
        return KVCache(pick[:n], pick[n:], self.prefix_mask[users], self.prefix_len[users])

    def expand(
        self,
        beams: int,
        max_steps: int,
        indexed: bool = False,
        storage: tuple[list[Tensor], list[Tensor], Tensor] | None = None,
    ) -> KVCache:
        """A cache with `beams` rows per user and room for `max_steps` decoded tokens.

        The prompt part is shared, not copied. Any steps already decoded are repeated per beam.
        `indexed` selects the in-place reorder layout (`reorder` records parents in `beam_rows` instead
        of copying steps). `storage` = (beam_k, beam_v, beam_rows) lends preallocated tensors of the
        right shapes (buffer reuse across requests; rows beyond what is written are never read).
        """
        if beams < 1 or max_steps < self.steps:
            raise ValueError(f"expand needs beams >= 1 and max_steps >= {self.steps}")
        if self.steps and beams % self.beams:
            raise ValueError(f"cannot expand {self.beams} beams with decoded steps to {beams} beams")
        rows = self.batch * beams
        new_k, new_v = [], []
        for layer, pk in enumerate(self.prefix_k):
            shape = (rows, pk.shape[1], max_steps, pk.shape[3])
            if storage is None:
                bk, bv = pk.new_zeros(shape), pk.new_zeros(shape)
            else:
                bk, bv = storage[0][layer], storage[1][layer]
                if bk.shape != shape or bv.shape != shape:
                    raise ValueError(f"lent storage {list(bk.shape)} does not match {list(shape)}")
            if self.steps:
                rep = beams // self.beams
                bk[:, :, : self.steps] = self._steps_of(self.beam_k[layer]).repeat_interleave(rep, dim=0)
                bv[:, :, : self.steps] = self._steps_of(self.beam_v[layer]).repeat_interleave(rep, dim=0)
            new_k.append(bk)
            new_v.append(bv)
        table = None
        if indexed:
            table = storage[2] if storage is not None else None
            if table is None or table.shape != (rows, max_steps):
                table = torch.empty(rows, max_steps, dtype=torch.long, device=self.prefix_mask.device)
            table.copy_(torch.arange(rows, device=table.device)[:, None].expand(rows, max_steps))
        return KVCache(
            self.prefix_k,
            self.prefix_v,
            self.prefix_mask,
            self.prefix_len,
            beams,
            self.steps,
            new_k,
            new_v,
            table,
        )

    def reorder(self, parent: Tensor) -> None:
        """Row i takes the decoded steps of row parent[i] (flat indices into B*W), in place.

        Indexed layout: only the [B*W, steps] row table is permuted (one small int gather for all
        layers); the steps' keys and values never move."""
        if self.steps == 0:
            return
        t = self.steps
        if self.beam_rows is not None:
            self.beam_rows[:, :t] = self.beam_rows[:, :t].index_select(0, parent)
            return
        for k, v in zip(self.beam_k, self.beam_v):
            k[:, :, :t] = k[:, :, :t].index_select(0, parent)
            v[:, :, :t] = v[:, :, :t].index_select(0, parent)

    def _steps_of(self, storage: Tensor, end: int | None = None, index: Tensor | None = None) -> Tensor:
        """Decoded steps [0, end) (default: all) of every row of one layer's storage, resolved through
        `beam_rows` in the indexed layout (`index`: a precomputed beam_step_index)."""
        end = self.steps if end is None else end
        if self.beam_rows is None:
            return storage[:, :, :end]
        return gather_beam_steps(storage, self.beam_rows[:, :end], index)

    def materialize(self) -> None:
        """Indexed layout: copy every row's steps into its own storage row and reset the table to the
        identity (what `keep` needs, since it moves steps between slots)."""
        if self.beam_rows is None:
            return
        t = self.steps
        if t:
            for k, v in zip(self.beam_k, self.beam_v):
                k[:, :, :t], v[:, :, :t] = self._steps_of(k), self._steps_of(v)
        self.beam_rows.copy_(
            torch.arange(self.rows, device=self.beam_rows.device)[:, None].expand_as(self.beam_rows)
        )

    @property
    def capacity(self) -> int:
        return self.beam_k[0].shape[2] if self.beam_k else 0

    def keep(self, start: int, index: Tensor) -> None:
        """Keep steps [0, start) and then, per row, the decoded steps `index` [R, m] (in that order).

        How a verifier commits an accepted draft branch: the block's tokens on the branch become steps
        start..start+m-1 and every other drafted token is dropped. Indices are absolute step numbers
        (>= start, < steps). Their RoPE positions were their tree depth, so a root-to-node path keeps
        consistent positions."""
        rows, m = index.shape
        if rows != self.rows or not 0 <= start <= self.steps or start + m > self.capacity:
            raise ValueError(
                f"keep({start}, [{rows}, {m}]) does not fit a cache of {self.rows} rows x {self.steps}"
            )
        # the indexed layout addresses step t at slot t; keep moves steps between slots, so resolve first
        self.materialize()
        if m:
            gather = index.to(torch.long)[:, None, :, None]
            for k, v in zip(self.beam_k, self.beam_v):
                g = gather.expand(-1, k.shape[1], -1, k.shape[3])
                k[:, :, start : start + m] = k.gather(2, g)
                v[:, :, start : start + m] = v.gather(2, g)
        self.steps = start + m

    def truncate(self, steps: int) -> None:
        """Drop every decoded step from `steps` on (their storage is reused by the next extend).

        Safe in the indexed layout too: step t always lives at slot t, so no kept step reads a slot
        the next extend overwrites."""
        if not 0 <= steps <= self.steps:
            raise ValueError(f"truncate({steps}) on a cache holding {self.steps} steps")
        self.steps = steps


def beam_step_index(rows: Tensor, heads: int, capacity: int) -> Tensor:
    """Flat row numbers into storage.view(-1, hd) (storage [R, H, capacity, hd] contiguous) of step j of
    row r read from storage row rows[r, j], in [R, H, t] order (rows [R, t]). Shared by K and V."""
    h = torch.arange(heads, device=rows.device)[None, :, None]
    j = torch.arange(rows.shape[1], device=rows.device)[None, None, :]
    return ((rows[:, None, :] * heads + h) * capacity + j).reshape(-1)


def gather_beam_steps(storage: Tensor, rows: Tensor, index: Tensor | None = None) -> Tensor:
    """[R, H, t, hd]: step j of row r read from storage row rows[r, j]; storage [R, H, T, hd], rows [R, t].

    One index_select of hd-vectors (~3x faster on CPU than advanced indexing over (row, step))."""
    r, h, cap, hd = storage.shape
    if not storage.is_contiguous():
        steps = torch.arange(rows.shape[1], device=rows.device)
        return storage[rows, :, steps].permute(0, 2, 1, 3)  # advanced indices first: [R, t, H, hd]
    index = beam_step_index(rows, h, cap) if index is None else index
    return storage.view(-1, hd).index_select(0, index).view(r, h, rows.shape[1], hd)


@dataclass
class PrefillOutput:
    logits: Tensor  # [B, V] at the last prompt position
    hidden: Tensor  # [B, D] final (normed) hidden state at the last prompt position
    cache: KVCache
    all_hidden: Tensor | None = None  # [B, S, D] when asked for (NEZHA reads the placeholder states)


@dataclass
class StepOutput:
    logits: Tensor  # [B*W, V]
    hidden: Tensor  # [B*W, D]


@dataclass
class ExtendOutput:
    logits: Tensor  # [B*W, n, V]
    hidden: Tensor  # [B*W, n, D]


def tree_depths(tree_mask: Tensor | None, rows: int, n: int, device: torch.device) -> Tensor:
    """[R, n] depth of each new token in its block (ancestors it sees, itself excluded)."""
    if tree_mask is None:
        return torch.arange(n, device=device).expand(rows, n)
    return tree_mask.sum(-1) - 1


def check_tree_mask(tree_mask: Tensor, rows: int, n: int) -> None:
    """A tree mask must be [R, n, n] bool, see itself, and see only earlier tokens (ancestors first)."""
    if tree_mask.shape != (rows, n, n) or tree_mask.dtype != torch.bool:
        raise ValueError(
            f"tree_mask must be bool [{rows}, {n}, {n}], got {tree_mask.dtype} {list(tree_mask.shape)}"
        )
    eye = torch.eye(n, dtype=torch.bool, device=tree_mask.device)
    upper = torch.ones(n, n, dtype=torch.bool, device=tree_mask.device).triu(1)
    if not bool((tree_mask[:, eye].all()) & ~(tree_mask[:, upper].any())):
        raise ValueError("tree_mask must be True on the diagonal and False above it (ancestors come first)")


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


class GRTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        for block in self.layers:  # scale residual outputs by depth (GPT-2 style) for stable training
            for lin in (block.self_attn.o_proj, block.mlp.down_proj):
                nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    # --- full-sequence forward (training and the recomputation reference) --------------------
    def forward(self, tokens: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """tokens [B, S] left-padded, mask [B, S] bool -> (logits [B, S, V], hidden [B, S, D])."""
        hidden = self.hidden_states(tokens, mask)
        return self.lm_head(hidden), hidden

    def hidden_states(
        self,
        tokens: Tensor,
        mask: Tensor | None = None,
        *,
        positions: Tensor | None = None,
        attn_mask: Tensor | None = None,
    ) -> Tensor:
        """Final (normed) hidden states [B, S, D]; training projects only the labelled positions.

        By default the rows are left-padded causal sequences (`mask`). Packed training passes its own
        `positions` [B, S] (RoPE positions) and `attn_mask` [B, S, S] (True = query may attend key)
        instead, e.g. several prompts sharing one history (training/packed_head_batch.py).
        """
        if (positions is None) != (attn_mask is None):
            raise ValueError("give positions and attn_mask together, or neither")
        if attn_mask is None:
            self._check_length(tokens.shape[1])
            positions, attn_mask = causal_attention_inputs(tokens, mask)
        elif int(positions.max()) >= self.config.max_seq_len:  # packed rows may be longer; positions not
            raise ValueError(
                f"position {int(positions.max())} is beyond max_seq_len {self.config.max_seq_len}"
            )
        return self._run_full(tokens, positions, attn_mask, keep_kv=False)[0]

    def _check_length(self, s: int) -> None:
        if s > self.config.max_seq_len:
            raise ValueError(f"sequence of {s} tokens exceeds max_seq_len {self.config.max_seq_len}")

    def _run_full(self, tokens: Tensor, positions: Tensor, attn_mask: Tensor, keep_kv: bool):
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)
        attn_mask = attn_mask[:, None]  # [B, 1, S, S]: one mask for every head
        x = self.embed_tokens(tokens)
        ks, vs = [], []
        for block in self.layers:
            a, k, v = block.self_attn.forward_full(block.input_layernorm(x), cos, sin, attn_mask)
            x = x + a
            x = x + block.mlp(block.post_attention_layernorm(x))
            if keep_kv:
                ks.append(k)
                vs.append(v)
        return self.norm(x), ks, vs

    # --- the decoding API -------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, tokens: Tensor, mask: Tensor, return_all_hidden: bool = False) -> PrefillOutput:
        """Run the left-padded prompts once; the last column must be a real token of every row."""
        if not bool(mask[:, -1].all()):
            raise ValueError("prompts must be left-padded: the last position of every row must be real")
        self._check_length(tokens.shape[1])
        hidden, ks, vs = self._run_full(tokens, *causal_attention_inputs(tokens, mask), keep_kv=True)
        last = hidden[:, -1]
        cache = KVCache(ks, vs, mask, mask.long().sum(-1))
        return PrefillOutput(self.lm_head(last), last, cache, hidden if return_all_hidden else None)

    @torch.no_grad()
    def extend(
        self, tokens: Tensor, cache: KVCache, tree_mask: Tensor | None = None, attention: str = "torch"
    ) -> ExtendOutput:
        """Append n tokens per cache row (tokens [B*W, n]) with any intra-block pattern.

        `tree_mask` [B*W, n, n] (True = query i sees new token j; ancestors before descendants) lets each
        token see only its ancestors; None is causal. Every token also sees the prompt and the row's
        earlier steps. RoPE positions are prefix length + earlier steps + depth in the tree. Returns
        logits and hidden states of all n positions; the block stays in the cache (keep/truncate it)."""
        rows, n = tokens.shape
        if rows != cache.rows or n < 1:
            raise ValueError(
                f"extend expects [{cache.rows}, n >= 1] tokens (batch x beams), got {list(tokens.shape)}"
            )
        if cache.steps + n > cache.capacity:
            raise ValueError(
                f"cache has room for {cache.capacity - cache.steps} more steps, not {n}; "
                "call cache.expand(beams, max_steps) with a larger max_steps"
            )
        if tree_mask is not None:
            check_tree_mask(tree_mask, rows, n)
        attend = get_attention_backend(attention)
        depth = tree_depths(tree_mask, rows, n, tokens.device)
        pos = cache.prefix_len.repeat_interleave(cache.beams)[:, None] + cache.steps + depth  # [N, n]
        # positions, not block length, bound the sequence: a tree of n nodes may be far shallower than n
        deepest = n if tree_mask is None else int(depth.max()) + 1
        self._check_length(int(cache.prefix_mask.shape[1]) + cache.steps + deepest)
        cos, sin = rope_cos_sin(pos, self.config.head_dim, self.config.rope_theta)
        if cache.beam_rows is not None:  # the new block is written into each row's own storage
            t = cache.steps
            cache.beam_rows[:, t : t + n] = torch.arange(rows, device=tokens.device)[:, None]
        x = self.embed_tokens(tokens)  # [N, n, D]
        for i, block in enumerate(self.layers):
            x = x + block.self_attn.forward_extend(
                block.input_layernorm(x), cos, sin, cache, i, tree_mask, attend
            )
            x = x + block.mlp(block.post_attention_layernorm(x))
        cache.steps += n
        hidden = self.norm(x)
        return ExtendOutput(self.lm_head(hidden), hidden)

    @torch.no_grad()
    def step(self, tokens: Tensor, cache: KVCache, attention: str = "torch") -> StepOutput:
        """Append one token per cache row (tokens [B*W]): `extend` with n = 1."""
        if tokens.shape != (cache.rows,):
            raise ValueError(f"step expects {cache.rows} tokens (batch x beams), got {tuple(tokens.shape)}")
        if not cache.beam_k or cache.steps >= cache.capacity:
            raise ValueError("cache has no room for another step; call cache.expand(beams, max_steps) first")
        out = self.extend(tokens[:, None], cache, None, attention)
        return StepOutput(out.logits[:, 0], out.hidden[:, 0])

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
