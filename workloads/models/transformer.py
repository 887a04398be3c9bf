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

The cache layout (the prompt stored once per user, the indexed reorder) is described in kv_cache.py.
Prompts are left-padded: `mask` marks real tokens and positions count real tokens only, so rows
of different lengths decode in lock step.

Imported Hugging Face Llama / Mistral / Qwen2 / Qwen3 checkpoints (hf_import.py) run in this same
model: their config adds grouped-query attention (the cache holds n_kv_heads heads), q/k/v/o biases,
per-head q/k RMSNorm, a tied head and the llama3 RoPE scaling (model_config.py); bf16/fp16 weights keep
their dtype, with attention scores and softmax in fp32.

Modules: model_config.py (ModelConfig, sizes), transformer_blocks.py (RMSNorm, RoPE, Attention, MLP,
Block), kv_cache.py (KVCache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from genrec.kernels.shared_prefix_attention import get_attention_backend
from genrec.workloads.models.kv_cache import KVCache
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.transformer_blocks import (
    Block,
    RMSNorm,
    RopeTables,
    config_inv_freq,
    fused_ok,
)

__all__ = [
    "ExtendOutput",
    "GRTransformer",
    "PrefillOutput",
    "StepOutput",
    "causal_attention_inputs",
    "check_tree_mask",
    "tree_depths",
]


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


@dataclass
class PrefillOutput:
    logits: Tensor  # [B, V] at the last prompt position
    hidden: Tensor  # [B, D] final (normed) hidden state at the last prompt position
    cache: KVCache
    all_hidden: Tensor | None = None  # [B, S, D] when asked for (NEZHA reads the placeholder states)


@dataclass
class StepOutput:
    logits: Tensor | None  # [B*W, V]; None when step(logits=False)
    hidden: Tensor  # [B*W, D]


@dataclass
class ExtendOutput:
    logits: Tensor | None  # [B*W, n, V]; None when extend(logits=False)
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


class GRTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self._rope_table: RopeTables | None = None  # every position's RoPE tables so far (see rope)
        self.apply(self._init_weights)
        for block in self.layers:  # scale residual outputs by depth (GPT-2 style) for stable training
            for lin in (block.self_attn.o_proj, block.mlp.down_proj):
                nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))
        if cfg.tie_embeddings:
            self.tie_weights()

    def tie_weights(self) -> None:
        """With `tie_embeddings` the LM head is the embedding matrix (one parameter, two names)."""
        if self.config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def rope(self, positions: Tensor, bound: int) -> RopeTables:
        """RoPE tables for integer positions [B, S] (all below `bound`), with the config's scaling, in the
        weights' dtype: looked up in a table of positions 0..P-1, made on first use and remade (at least
        twice as long) when a longer sequence, another device or dtype comes."""
        table, dtype = self._rope_table, self.embed_tokens.weight.dtype
        if (
            table is None
            or table.cos.device != positions.device
            or table.cos.dtype != dtype
            or table.length < bound
        ):
            size = max(bound, 64, 2 * table.length if table is not None else 0)
            size = min(size, max(bound, self.config.max_seq_len))
            every = torch.arange(size, device=positions.device)[None]
            table = RopeTables.at(every, config_inv_freq(self.config, positions.device), dtype)
            self._rope_table = table
        return table.take(positions)

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
            bound = tokens.shape[1]
        else:
            bound = int(positions.max()) + 1
            if bound > self.config.max_seq_len:  # packed rows may be longer; positions not
                raise ValueError(f"position {bound - 1} is beyond max_seq_len {self.config.max_seq_len}")
        return self._run_full(tokens, positions, attn_mask, keep_kv=False, bound=bound)[0]

    def _check_length(self, s: int) -> None:
        if s > self.config.max_seq_len:
            raise ValueError(f"sequence of {s} tokens exceeds max_seq_len {self.config.max_seq_len}")

    def _run_full(
        self,
        tokens: Tensor,
        positions: Tensor,
        attn_mask: Tensor,
        keep_kv: bool,
        last_only: bool = False,
        bound: int | None = None,
    ):
        """(final hidden [B, S, D], keys, values per layer); with `last_only` the hidden state of the last
        position alone ([B, 1, D]): the last layer's attention, output projection and MLP then run for
        that position only (the other positions' keys and values are all a prefill keeps of them).
        Positions are below `bound` (default: S, as in left-padded causal rows)."""
        rope = self.rope(positions, tokens.shape[1] if bound is None else bound)
        attn_mask = attn_mask[:, None]  # [B, 1, S, S]: one mask for every head
        x = self.embed_tokens(tokens)
        if fused_ok(x):  # SDPA's additive form, made once for every layer (what it makes of a bool mask)
            attn_mask = torch.zeros(attn_mask.shape, device=x.device).masked_fill_(~attn_mask, float("-inf"))
        ks, vs = [], []
        for i, block in enumerate(self.layers):
            last = last_only and i == len(self.layers) - 1
            a, k, v = block.self_attn.forward_full(block.input_layernorm(x), rope, attn_mask, last)
            x = (x[:, -1:] if last else x) + a
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
        inputs = causal_attention_inputs(tokens, mask)
        hidden, ks, vs = self._run_full(tokens, *inputs, keep_kv=True, last_only=not return_all_hidden)
        last = hidden[:, -1]
        cache = KVCache(ks, vs, mask, mask.long().sum(-1))
        return PrefillOutput(self.lm_head(last), last, cache, hidden if return_all_hidden else None)

    @torch.no_grad()
    def extend(
        self,
        tokens: Tensor,
        cache: KVCache,
        tree_mask: Tensor | None = None,
        attention: str = "torch",
        logits: bool = True,
    ) -> ExtendOutput:
        """Append n tokens per cache row (tokens [B*W, n]) with any intra-block pattern.

        `tree_mask` [B*W, n, n] (True = query i sees new token j; ancestors before descendants) lets each
        token see only its ancestors; None is causal. Every token also sees the prompt and the row's
        earlier steps. RoPE positions are prefix length + earlier steps + depth in the tree. Returns
        logits and hidden states of all n positions; the block stays in the cache (keep/truncate it).
        `logits=False` skips the LM head (logits None): a caller that projects only some rows itself."""
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
        bound = int(cache.prefix_mask.shape[1]) + cache.steps + deepest
        self._check_length(bound)
        rope = self.rope(pos, bound)
        if cache.beam_rows is not None:  # the new block is written into each row's own storage
            t = cache.steps
            cache.beam_rows[:, t : t + n] = torch.arange(rows, device=tokens.device)[:, None]
        x = self.embed_tokens(tokens)  # [N, n, D]
        planned = self._plan_attention(attend, cache, n, tree_mask, x.dtype)
        for i, block in enumerate(self.layers):
            x = x + block.self_attn.forward_extend(
                block.input_layernorm(x), rope, cache, i, tree_mask, attend, planned
            )
            x = x + block.mlp(block.post_attention_layernorm(x))
        cache.steps += n
        hidden = self.norm(x)
        return ExtendOutput(self.lm_head(hidden) if logits else None, hidden)

    def _plan_attention(self, attend, cache: KVCache, n: int, tree_mask: Tensor | None, dtype) -> dict:
        """Keyword arguments every layer's attention call takes in this extend call (masks made once,
        not once per layer), from the backend's `plan` when it has one."""
        plan = getattr(attend, "plan", None)
        if plan is None:
            return {}
        cfg = self.config
        return plan(
            cache.prefix_mask, cache.steps, tree_mask, cache.beams, n, cfg.n_heads, cfg.n_kv_heads, dtype
        )

    @torch.no_grad()
    def step(
        self, tokens: Tensor, cache: KVCache, attention: str = "torch", logits: bool = True
    ) -> StepOutput:
        """Append one token per cache row (tokens [B*W]): `extend` with n = 1."""
        if tokens.shape != (cache.rows,):
            raise ValueError(f"step expects {cache.rows} tokens (batch x beams), got {tuple(tokens.shape)}")
        if not cache.beam_k or cache.steps >= cache.capacity:
            raise ValueError("cache has no room for another step; call cache.expand(beams, max_steps) first")
        out = self.extend(tokens[:, None], cache, None, attention, logits)
        return StepOutput(out.logits[:, 0] if logits else None, out.hidden[:, 0])

    def kv_cache_shape(self, rows: int, steps: int) -> tuple[int, int, int, int]:
        """Shape of one layer's per-beam K (or V) storage: [rows, n_kv_heads, steps, head_dim] (what
        `KVCache.expand` allocates and a decoder lending preallocated storage must match)."""
        return (rows, self.config.n_kv_heads, steps, self.config.head_dim)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
