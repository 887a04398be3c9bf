"""Shared-prefix attention for beam decoding: the torch reference and the backend registry.

A decode step (or a block of n drafted tokens) of W beams per user attends to two key sets:
  - the user's prompt, stored once per user and shared by all its beams (the shared stage), and
  - the beam's own decoded steps plus the new block, visible through a tree mask (the unshared stage).
Each stage returns (output, log-sum-exp) over its keys; `merge_attention_states` combines them with the
online-softmax rule, so the result equals one softmax over the concatenated keys (xGR's staged
attention, FlashInfer's "merge state"). Kernels implement the same `shared_prefix_attention`
signature and register under a name; the model and the decoders pick one by that name.

Shapes (rows are grouped by user: row b * W + j is beam j of user b):
    q            [B*W, H, n, hd]   queries of the n new tokens of every beam
    prefix_k/v   [B, Hkv, S, hd]   the prompt cache, one copy per user
    prefix_mask  [B, S] bool       real (non-pad) prompt positions
    beam_k/v     [B*W, Hkv, T, hd] per-beam cache; [0, beam_len) = earlier steps (all visible),
                                    [beam_len, beam_len + n) = the new block (already written)
    tree_mask    [B*W, n, n] bool  query i may see new token j (None: causal)

Grouped-query attention: Hkv divides H and query head h reads key/value head h // (H / Hkv) (the
Llama / Qwen layout). Each stage stacks a key/value head's query heads into the query-row dimension,
so a key is read once per key/value head, not once per query head. Half-precision inputs are
computed in fp32 (scores, softmax, merge) and the output cast back.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

NEG_INF = float("-inf")


def _softmax_stage(scores: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Softmax-weighted values and log-sum-exp over the last axis of `scores` (statistics in fp32).

    Every query must see at least one key of the stage: the prompt's last position is always real,
    and a new token always sees itself (both are checked where the cache is built)."""
    s = scores.float()
    p = torch.softmax(s, dim=-1)
    # the largest probability is 1 / sum(exp(s - max)), so lse = max - log(p_max): two cheap
    # reductions beside one fused softmax instead of a separate log-sum-exp pass over the scores
    lse = s.amax(dim=-1) - torch.log(p.amax(dim=-1))
    return p.to(v.dtype) @ v, lse


_CPU_FUSED = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def attend_with_lse(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """(softmax(q k^T + bias) v, log-sum-exp) for pre-scaled q [..., M, hd]; bias broadcasts to the scores.

    On CPU (fp32) this is aten's fused flash-attention kernel, which returns the log-sum-exp it
    already has; elsewhere the matmul form (`_softmax_stage`), which is also the tests' reference."""
    if _CPU_FUSED is not None and q.device.type == "cpu" and q.dtype == torch.float32 and q.dim() == 4:
        out, lse = _CPU_FUSED(q, k, v, 0.0, False, attn_mask=bias, scale=1.0)
        return out, lse
    scores = q @ k.transpose(-1, -2)
    return _softmax_stage(scores if bias is None else scores + bias, v)


def prefix_bias(prefix_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """[B, 1, 1, S]: 0 on real prompt positions, -inf on padding (made per call: it is B x S, and a cache
    keyed by the mask's version cannot read inference-mode tensors, which serving and sweeps decode with)."""
    bias = torch.zeros(
        prefix_mask.shape[0], 1, 1, prefix_mask.shape[1], dtype=dtype, device=prefix_mask.device
    )
    return bias.masked_fill_(~prefix_mask[:, None, None, :], NEG_INF)


def prefix_stage(q: Tensor, prefix_k: Tensor, prefix_v: Tensor, prefix_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Shared stage: every beam's queries against its user's prompt, one batched product per user.

    q is pre-scaled by 1/sqrt(hd). Returns (output [B*W, H, n, hd], lse [B*W, H, n])."""
    rows, h, n, hd = q.shape
    b, hkv = prefix_k.shape[:2]
    w, g = rows // b, h // hkv
    # a user's query rows per key/value head: (beam, query head of the group, token)
    qg = q.view(b, w, hkv, g, n, hd).permute(0, 2, 1, 3, 4, 5).reshape(b, hkv, w * g * n, hd)
    bias = prefix_bias(prefix_mask, q.dtype)
    out, lse = attend_with_lse(qg, prefix_k, prefix_v, bias)  # [B, Hkv, W*g*n, hd], [B, Hkv, W*g*n]
    out = out.view(b, hkv, w, g, n, hd).permute(0, 2, 1, 3, 4, 5).reshape(rows, h, n, hd)
    return out, lse.view(b, hkv, w, g, n).permute(0, 2, 1, 3, 4).reshape(rows, h, n)


def beam_stage(
    q: Tensor, beam_k: Tensor, beam_v: Tensor, beam_len: int, tree_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Unshared stage: each beam's (pre-scaled) queries against its earlier steps and visible new tokens."""
    rows, h, n, hd = q.shape
    hkv = beam_k.shape[1]
    g = h // hkv
    end = beam_len + n
    bias = None
    if n > 1 or tree_mask is not None:
        block = tree_mask if tree_mask is not None else causal_tree_mask(rows, n, q.device)
        bias = torch.zeros(rows, 1, n, end, dtype=q.dtype, device=q.device)
        bias[..., beam_len:].masked_fill_(~block[:, None], NEG_INF)  # new keys a query must not see
    if g == 1:
        return attend_with_lse(q, beam_k[:, :, :end], beam_v[:, :, :end], bias)
    # the group's query heads become query rows (head-major, token-minor), each seeing its token's keys
    bias = None if bias is None else bias.repeat(1, 1, g, 1)
    out, lse = attend_with_lse(q.reshape(rows, hkv, g * n, hd), beam_k[:, :, :end], beam_v[:, :, :end], bias)
    return out.reshape(rows, h, n, hd), lse.reshape(rows, h, n)


def merge_attention_states(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tensor:
    """Combine two normalised partial attentions over disjoint key sets (the online-softmax rule).

    out = (e^lse_a out_a + e^lse_b out_b) / (e^lse_a + e^lse_b)
        = out_b + (out_a - out_b) * sigmoid(lse_a - lse_b)
    """
    share_a = torch.sigmoid(lse_a - lse_b)[..., None]
    share_a = share_a if share_a.dtype == out_a.dtype else share_a.to(out_a.dtype)
    return out_b + (out_a - out_b) * share_a


def shared_prefix_attention_torch(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    prefix_mask: Tensor,
    beam_k: Tensor,
    beam_v: Tensor,
    beam_len: int,
    tree_mask: Tensor | None = None,
    one_pass: Tensor | None = None,
) -> Tensor:
    """The reference: two stages, each (output, lse), merged. Output [B*W, H, n, hd] in q's dtype.
    With `one_pass` (the mask `plan_one_pass` made for this call's shapes) the one-pass form instead."""
    if one_pass is not None:
        return one_pass_attention(q, prefix_k, prefix_v, beam_k, beam_v, beam_len, one_pass)
    if q.dtype != torch.float32:  # half-precision caches: scores, softmax and merge in fp32
        kv = (prefix_k, prefix_v, beam_k, beam_v)
        pk, pv, bk, bv = (t.float() for t in kv)
        out = shared_prefix_attention_torch(q.float(), pk, pv, prefix_mask, bk, bv, beam_len, tree_mask)
        return out.to(q.dtype)
    q = q * (1.0 / math.sqrt(q.shape[-1]))  # scale the few queries, not the many scores
    out_p, lse_p = prefix_stage(q, prefix_k, prefix_v, prefix_mask)
    out_b, lse_b = beam_stage(q, beam_k, beam_v, beam_len, tree_mask)
    return merge_attention_states(out_p, lse_p, out_b, lse_b)


# --- the one-pass form: few beam keys per user, on a CPU ----------------------------------------------
# A CPU decode step of a small model is bound by per-op overhead, and the staged form spends ~15 ops per
# layer (two attentions, two log-sum-exps, the merge). When a user's beams hold few keys in all, one
# softmax per user and query head over its prompt and ALL its beams' keys costs less, although each
# query also scores its sibling beams' keys (masked out). Measured with a scratch script at B 16,
# S 47, 4 heads / 2 KV heads, 2 threads, one layer (mask included): 0.92 against 1.62 ms at W 20;
# 4.1 against 6.1 ms at W 100 (200 beam keys per user); 6.5 against 7.4 ms at W 128, but 9.8
# against 9.0 ms for W 64 x 3-token trees (256 keys); 9.1 against 9.2 ms at W 160 (320 keys).
# The waste grows as W x keys per beam: past ONE_PASS_SLACK + S keys the staged form is taken.
# In a decode the mask is made once per extend call (`plan_one_pass`).
ONE_PASS_SLACK = 192


def one_pass_pays(
    beams: int, beam_keys: int, prompt_len: int, device: torch.device, dtype: torch.dtype
) -> bool:
    """Whether a layer takes the one-pass form: fp32 on a CPU, and few beam keys per user (see above)."""
    return (
        device.type == "cpu" and dtype == torch.float32 and beams * beam_keys <= ONE_PASS_SLACK + prompt_len
    )


def one_pass_bias(prefix_mask: Tensor, beam_len: int, tree_mask: Tensor | None, beams: int, n: int) -> Tensor:
    """[B, 1, W*n, S + W*(beam_len+n)] fp32 additive mask of the one-pass form (one for every head): 0 where
    a query may see a key, -inf elsewhere. Query rows run (beam, token); keys are the user's prompt,
    then each beam's `beam_len + n` keys. A query sees the real prompt positions, its own beam's earlier
    steps, and the new tokens its tree mask (causal when None) allows; never a sibling beam's keys."""
    b, s = prefix_mask.shape
    end, dev, m = beam_len + n, prefix_mask.device, beams * n
    if tree_mask is None:  # one pattern for every beam: (i, e) visible when e <= beam_len + i
        visible = torch.ones(n, end, dtype=torch.bool, device=dev).tril(beam_len)[None, None]
    else:  # [B, W, n, end]: earlier steps, then the row's tree
        earlier = torch.ones(b * beams, n, beam_len, dtype=torch.bool, device=dev)
        visible = torch.cat([earlier, tree_mask], dim=-1).view(b, beams, n, end)
    users = visible.shape[0]
    # own[u, w, i, w2, e]: query (w, i) against key e of beam w2: -inf unless w2 == w and visible
    own = torch.full((users, beams, n, beams, end), NEG_INF, device=dev)
    seen = torch.zeros(visible.shape, device=dev).masked_fill_(~visible, NEG_INF)
    own.diagonal(dim1=1, dim2=3).copy_(seen.permute(0, 2, 3, 1))
    bias = torch.empty(b, 1, m, s + beams * end, device=dev)
    bias[..., :s] = torch.zeros(b, 1, 1, s, device=dev).masked_fill_(~prefix_mask[:, None, None, :], NEG_INF)
    bias[..., s:] = own.view(users, 1, m, beams * end)
    return bias


def one_pass_attention(
    q: Tensor, prefix_k: Tensor, prefix_v: Tensor, beam_k: Tensor, beam_v: Tensor, beam_len: int, bias: Tensor
) -> Tensor:
    """One softmax per (user, query head) over the prompt and all the user's beams' keys, masked by
    `one_pass_bias`, in aten's fused kernel (which maps query heads to their key/value head itself).
    Same shapes and result (to rounding) as the staged form; fp32."""
    rows, h, n, hd = q.shape
    b, hkv, s, _ = prefix_k.shape
    w, end = rows // b, beam_len + n
    qu = q.view(b, w, h, n, hd).transpose(1, 2).reshape(b, h, w * n, hd)  # a user's queries: (beam, token)

    def keys(prefix: Tensor, beam: Tensor) -> Tensor:  # [B, Hkv, S + W*end, hd]: the prompt, then the beams'
        per_user = beam[:, :, :end].reshape(b, w, hkv, end, hd).transpose(1, 2).reshape(b, hkv, w * end, hd)
        return torch.cat([prefix, per_user], dim=2)

    out = F.scaled_dot_product_attention(
        qu, keys(prefix_k, beam_k), keys(prefix_v, beam_v), attn_mask=bias, enable_gqa=h > hkv
    )
    return out.view(b, h, w, n, hd).transpose(1, 2).reshape(rows, h, n, hd)


def plan_one_pass(
    prefix_mask: Tensor,
    beam_len: int,
    tree_mask: Tensor | None,
    beams: int,
    n: int,
    heads: int,
    kv_heads: int,
    dtype: torch.dtype,
) -> dict[str, Tensor]:
    """What the torch backend takes, beside its arguments, in every layer of one extend call: the
    one-pass mask where that form pays (`one_pass_pays`), else nothing (the staged form)."""
    if not one_pass_pays(beams, beam_len + n, prefix_mask.shape[1], prefix_mask.device, dtype):
        return {}
    return {"one_pass": one_pass_bias(prefix_mask, beam_len, tree_mask, beams, n)}


def causal_tree_mask(rows: int, n: int, device: torch.device | str = "cpu") -> Tensor:
    """[rows, n, n]: a chain, token i sees tokens 0..i (the default block pattern)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril().expand(rows, n, n)


AttentionFn = Callable[..., Tensor]
# a backend with a `plan` is asked once per extend call for keyword arguments every layer's call takes
shared_prefix_attention_torch.plan = plan_one_pass  # type: ignore[attr-defined]


def _triton_backend() -> AttentionFn:
    # imported on first use: CPU installs without triton still import this module (and the model)
    from genrec.kernels.shared_prefix_attention_triton import shared_prefix_attention

    return shared_prefix_attention


_BACKENDS: dict[str, Callable[[], AttentionFn]] = {
    "torch": lambda: shared_prefix_attention_torch,
    "triton": _triton_backend,  # xGR's staged kernels (shared_prefix_attention_triton)
}
ATTENTION_BACKENDS = tuple(_BACKENDS)


def get_attention_backend(name: str) -> AttentionFn:
    """The `shared_prefix_attention` implementation registered as `name`."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {list(ATTENTION_BACKENDS)}")
    return _BACKENDS[name]()


def plain_attention(q: Tensor, k: Tensor, v: Tensor, visible: Tensor) -> Tensor:
    """Softmax attention over one key set with a bool visibility mask [R, n, S] (the test oracle);
    k/v may have fewer (key/value) heads than q, each serving consecutive query heads."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~visible[:, None], NEG_INF)
    return torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v
