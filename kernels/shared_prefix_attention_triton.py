"""xGR's staged shared-prefix attention as Triton kernels (the `triton` attention backend).

Same signature and result as `shared_prefix_attention.shared_prefix_attention_torch` (shapes in that
module's docstring), computed in three small kernels, each with a thin wrapper (FlashInfer's split):

- `prefix_stage`: one program per (user, key/value head, block of BLOCK_M query rows), where a user's
  query rows are its W beams x the head's query heads (grouped-query attention; one for plain
  multi-head attention) x n new tokens stacked as the M dimension. The program streams the user's prompt
  K/V in BLOCK_N tiles with an online softmax, so the prompt is read once per user and head (per M
  block), never once per beam as over a per-beam-copied cache. Tiles wholly inside a user's left
  padding are skipped, padded positions in a tile masked. Returns (output, log-sum-exp).
- `beam_stage`: one program per (beam row, key/value head): the row's query heads x n queries against
  its `beam_len` earlier steps (all visible) and the new block (visible through the tree mask; causal
  when None). With `beam_rows` [R, T] (the indexed cache of xGR's in-place reorder) step t of row r
  is loaded from row beam_rows[r, t]: the gather happens in the load, no reordered copy is written.
- `merge_states`: the online-softmax merge of the two (output, lse) pairs (torch reference:
  `merge_attention_states`).

fp32 inputs use IEEE dot products so the result matches the torch reference to rounding; bf16/fp16
inputs use the tensor cores as usual (softmax statistics stay fp32). Kept to the Triton 3.6 language
(the lent GPU machine's version); tests run it under TRITON_INTERPRET=1 on CPU.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

LOG2E = 1.4426950408889634

__all__ = ["beam_stage", "merge_states", "prefix_stage", "shared_prefix_attention"]


@triton.jit
def _online_update(m_i, l_i, acc, qk, v, USE_DOT: tl.constexpr):
    """One key tile of the online softmax: qk [BM, BN] in log2 units (-inf = hidden), v [BN, BD].

    A row that has seen only hidden keys so far keeps m = -inf; the max is taken as 0 for the
    exponentials then, so no -inf - -inf = nan appears (its p and alpha are 0)."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if USE_DOT:
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:  # few query rows (a decode step): a broadcast product beats padding M up to 16 for tl.dot
        pv = tl.sum(p[:, :, None] * v[None, :, :].to(tl.float32), 1)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _scores(q, k, USE_DOT: tl.constexpr):
    """q [BM, BD] (pre-scaled, log2 units) x k [BN, BD] -> [BM, BN] fp32."""
    if USE_DOT:
        return tl.dot(q, tl.trans(k), input_precision="ieee")
    return tl.sum(q[:, None, :].to(tl.float32) * k[None, :, :].to(tl.float32), 2)


@triton.jit
def _store_stage(o_ptr, lse_ptr, acc, m_i, l_i, flat, ok, d, d_ok, head_dim):
    """Normalise and store a stage: output [R, H, n, hd] and lse [R, H, n] (contiguous, natural log);
    `flat` = (row * H + head) * n + token of each query row."""
    out = acc / l_i[:, None]
    o_off = flat[:, None].to(tl.int64) * head_dim + d[None, :]
    tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + flat, (m_i + tl.log2(l_i)) / 1.4426950408889634, mask=ok)


@triton.jit
def _prefix_stage_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    mask_ptr,
    first_ptr,
    o_ptr,
    lse_ptr,
    heads,
    groups,
    beams,
    n_new,
    seq,
    head_dim,
    scale,
    sq_r,
    sq_h,
    sq_i,
    sk_b,
    sk_h,
    sk_s,
    sv_b,
    sv_h,
    sv_s,
    sm_b,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)  # key/value head; its `groups` query heads share every key tile
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows: beam j, group head, token i
    m_ok = m < beams * groups * n_new
    row = (b * beams + m // (groups * n_new)).to(tl.int64)
    h = kvh * groups + (m // n_new) % groups
    i = m % n_new
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    q_off = row[:, None] * sq_r + h[:, None] * sq_h + i[:, None] * sq_i + d[None, :]
    q = tl.load(q_ptr + q_off, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    q = (q * scale).to(q.dtype)  # scale the queries once, in log2 units for exp2

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_base = k_ptr + b.to(tl.int64) * sk_b + kvh * sk_h
    v_base = v_ptr + b.to(tl.int64) * sv_b + kvh * sv_h
    # tiles wholly inside the user's left padding are skipped; the key loops are `while` loops because
    # the interpreter (CI) cannot run a `for` over a runtime bound with numpy 2 (1-element arrays)
    s0 = (tl.load(first_ptr + b) // BLOCK_N) * BLOCK_N
    while s0 < seq:
        s = s0 + tl.arange(0, BLOCK_N)
        s_ok = s < seq
        real = tl.load(mask_ptr + b * sm_b + s, mask=s_ok, other=0) != 0
        kv_mask = s_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + s[:, None] * sk_s + d[None, :], mask=kv_mask, other=0.0)
        qk = _scores(q, k, True)
        qk = tl.where(real[None, :], qk, float("-inf"))
        v = tl.load(v_base + s[:, None] * sv_s + d[None, :], mask=kv_mask, other=0.0)
        m_i, l_i, acc = _online_update(m_i, l_i, acc, qk, v, True)
        s0 += BLOCK_N

    _store_stage(o_ptr, lse_ptr, acc, m_i, l_i, (row * heads + h) * n_new + i, m_ok, d, d_ok, head_dim)


@triton.jit
def _beam_stage_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    rows_ptr,
    tree_ptr,
    o_ptr,
    lse_ptr,
    heads,
    groups,
    n_new,
    beam_len,
    head_dim,
    scale,
    sq_r,
    sq_h,
    sq_i,
    sk_r,
    sk_h,
    sk_t,
    sv_r,
    sv_h,
    sv_t,
    srow_r,
    stree_r,
    stree_i,
    HAS_ROWS: tl.constexpr,
    HAS_TREE: tl.constexpr,
    USE_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)  # key/value head; query rows are its `groups` query heads x n tokens
    m = tl.arange(0, BLOCK_M)
    i_ok = m < groups * n_new
    h = kvh * groups + m // n_new
    i = m % n_new
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    q_off = r * sq_r + h[:, None] * sq_h + i[:, None] * sq_i + d[None, :]
    q = tl.load(q_ptr + q_off, mask=i_ok[:, None] & d_ok[None, :], other=0.0)
    q = (q * scale).to(q.dtype)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = beam_len + n_new
    t0 = tl.full([], 0, tl.int32)
    while t0 < end:
        t = t0 + tl.arange(0, BLOCK_N)
        t_ok = t < end
        if HAS_ROWS:  # in-place reorder: step t of this beam lives in storage row beam_rows[r, t]
            src = tl.load(rows_ptr + r * srow_r + t, mask=t_ok, other=0).to(tl.int64)
        else:
            src = tl.zeros([BLOCK_N], tl.int64) + r
        kv_mask = t_ok[:, None] & d_ok[None, :]
        k = tl.load(
            k_ptr + src[:, None] * sk_r + kvh * sk_h + t[:, None] * sk_t + d[None, :], mask=kv_mask, other=0.0
        )
        qk = _scores(q, k, USE_DOT)
        j = t - beam_len  # position in the new block (< 0: an earlier step, always visible)
        is_new = (j >= 0) & t_ok
        if HAS_TREE:
            t_off = r * stree_r + i[:, None] * stree_i + j[None, :]
            sees = tl.load(tree_ptr + t_off, mask=i_ok[:, None] & is_new[None, :], other=0) != 0
        else:
            sees = j[None, :] <= i[:, None]
        visible = ((j < 0) & t_ok)[None, :] | (is_new[None, :] & sees)
        qk = tl.where(visible, qk, float("-inf"))
        v = tl.load(
            v_ptr + src[:, None] * sv_r + kvh * sv_h + t[:, None] * sv_t + d[None, :], mask=kv_mask, other=0.0
        )
        m_i, l_i, acc = _online_update(m_i, l_i, acc, qk, v, USE_DOT)
        t0 += BLOCK_N

    _store_stage(o_ptr, lse_ptr, acc, m_i, l_i, (r * heads + h) * n_new + i, i_ok, d, d_ok, head_dim)


@triton.jit
def _merge_kernel(
    oa_ptr, la_ptr, ob_ptr, lb_ptr, out_ptr, rows, head_dim, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr
):
    x = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    x_ok = x < rows
    mask = x_ok[:, None] & (d < head_dim)[None, :]
    off = x[:, None].to(tl.int64) * head_dim + d[None, :]
    oa = tl.load(oa_ptr + off, mask=mask, other=0.0).to(tl.float32)
    ob = tl.load(ob_ptr + off, mask=mask, other=0.0).to(tl.float32)
    la = tl.load(la_ptr + x, mask=x_ok, other=0.0)
    lb = tl.load(lb_ptr + x, mask=x_ok, other=0.0)
    share_a = tl.sigmoid(la - lb)  # e^la / (e^la + e^lb)
    tl.store(out_ptr + off, (ob + (oa - ob) * share_a[:, None]).to(out_ptr.dtype.element_ty), mask=mask)


# --- wrappers -------------------------------------------------------------------------------------------
def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))  # tl.dot needs K >= 16; masked lanes load zeros


def _last_dim_unit(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _stage_outputs(q: Tensor) -> tuple[Tensor, Tensor]:
    rows, h, n, hd = q.shape
    return torch.empty(rows, h, n, hd, dtype=q.dtype, device=q.device), torch.empty(
        rows, h, n, dtype=torch.float32, device=q.device
    )


def prefix_stage(
    q: Tensor, prefix_k: Tensor, prefix_v: Tensor, prefix_mask: Tensor, block_m: int = 64, block_n: int = 64
) -> tuple[Tensor, Tensor]:
    """Shared stage: every beam's (unscaled) queries against its user's prompt.

    q [B*W, H, n, hd], prefix_k/v [B, Hkv, S, hd] (Hkv divides H: grouped-query attention, query head
    h reads key/value head h // (H / Hkv)), prefix_mask [B, S] bool (every user has a real key).
    Returns (output [B*W, H, n, hd] in q's dtype, lse [B*W, H, n] fp32), as the torch `prefix_stage`
    over q / sqrt(hd)."""
    q, prefix_k, prefix_v = _last_dim_unit(q), _last_dim_unit(prefix_k), _last_dim_unit(prefix_v)
    rows, h, n, hd = q.shape
    b, hkv, s, _ = prefix_k.shape
    w, g = rows // b, h // hkv
    mask = prefix_mask.contiguous().view(torch.uint8)
    first = mask.argmax(dim=1).to(torch.int32)  # each user's first real position (left padding)
    out, lse = _stage_outputs(q)
    bm = min(block_m, max(16, triton.next_power_of_2(w * g * n)))
    bn = min(block_n, max(16, triton.next_power_of_2(s)))
    grid = (b, hkv, triton.cdiv(w * g * n, bm))
    _prefix_stage_kernel[grid](
        q, prefix_k, prefix_v, mask, first, out, lse,
        h, g, w, n, s, hd, LOG2E / math.sqrt(hd),
        q.stride(0), q.stride(1), q.stride(2),
        prefix_k.stride(0), prefix_k.stride(1), prefix_k.stride(2),
        prefix_v.stride(0), prefix_v.stride(1), prefix_v.stride(2),
        mask.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=_block_d(hd),
    )  # fmt: skip
    return out, lse


def beam_stage(
    q: Tensor,
    beam_k: Tensor,
    beam_v: Tensor,
    beam_len: int,
    tree_mask: Tensor | None = None,
    beam_rows: Tensor | None = None,
    block_n: int = 16,
) -> tuple[Tensor, Tensor]:
    """Unshared stage: each beam's (unscaled) queries against its earlier steps and visible new tokens.

    beam_k/v [R, Hkv, T, hd] with steps [0, beam_len + n) written; tree_mask [R, n, n] bool or None
    (causal); beam_rows [R, >= beam_len + n] integer: step t of row r is read from row beam_rows[r, t]
    (None: row r). Returns (output [R, H, n, hd], lse [R, H, n] fp32)."""
    q, beam_k, beam_v = _last_dim_unit(q), _last_dim_unit(beam_k), _last_dim_unit(beam_v)
    rows, h, n, hd = q.shape
    hkv = beam_k.shape[1]
    g = h // hkv
    if beam_len + n > beam_k.shape[2]:
        raise ValueError(f"beam cache holds {beam_k.shape[2]} steps, not beam_len + n = {beam_len + n}")
    out, lse = _stage_outputs(q)
    tree = tree_mask.view(torch.uint8) if tree_mask is not None else None
    if tree is not None and tree.stride(-1) != 1:
        tree = tree.contiguous()
    table = _last_dim_unit(beam_rows) if beam_rows is not None else None
    bm = triton.next_power_of_2(g * n)
    use_dot = bm >= 16  # a draft tree's block (or a wide GQA group); else the broadcast product
    bn = block_n if use_dot else min(block_n, max(2, triton.next_power_of_2(beam_len + n)))
    _beam_stage_kernel[(rows, hkv)](
        q, beam_k, beam_v,
        table if table is not None else q, tree if tree is not None else q,  # dummies when absent
        out, lse,
        h, g, n, beam_len, hd, LOG2E / math.sqrt(hd),
        q.stride(0), q.stride(1), q.stride(2),
        beam_k.stride(0), beam_k.stride(1), beam_k.stride(2),
        beam_v.stride(0), beam_v.stride(1), beam_v.stride(2),
        table.stride(0) if table is not None else 0,
        tree.stride(0) if tree is not None else 0, tree.stride(1) if tree is not None else 0,
        HAS_ROWS=table is not None, HAS_TREE=tree is not None, USE_DOT=use_dot,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=_block_d(hd) if use_dot else triton.next_power_of_2(hd),
    )  # fmt: skip
    return out, lse


def merge_states(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, block_r: int = 32) -> Tensor:
    """The online-softmax merge of two stage results (contiguous [R, H, n, hd] and [R, H, n])."""
    hd = out_a.shape[-1]
    rows = lse_a.numel()
    out = torch.empty_like(out_a)
    grid = (triton.cdiv(rows, block_r),)
    _merge_kernel[grid](
        out_a, lse_a, out_b, lse_b, out, rows, hd, BLOCK_R=block_r, BLOCK_D=triton.next_power_of_2(hd)
    )
    return out


def shared_prefix_attention(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    prefix_mask: Tensor,
    beam_k: Tensor,
    beam_v: Tensor,
    beam_len: int,
    tree_mask: Tensor | None = None,
    beam_rows: Tensor | None = None,
) -> Tensor:
    """The staged attention: shared stage, unshared stage, merge. Output [B*W, H, n, hd]."""
    out_p, lse_p = prefix_stage(q, prefix_k, prefix_v, prefix_mask)
    out_b, lse_b = beam_stage(q, beam_k, beam_v, beam_len, tree_mask, beam_rows)
    return merge_states(out_p, lse_p, out_b, lse_b)


# the model passes the indexed cache's row table instead of gathering the steps for this backend
shared_prefix_attention.reads_beam_rows = True  # type: ignore[attr-defined]
