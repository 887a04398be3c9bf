"""STATIC's constrained-mask step (the VNTK, Algorithm 2) as a Triton kernel, with the torch reference.

Grid (rows, cdiv(branch, BLOCK_B)): program (r, j) reads beam r's CSR state, its edge range from
`row_ptr`, then block j of the fixed-width slice of `branch` stacked (token, next-state) edges; lanes
past the real child count are masked off (branch-free sanitisation); valid tokens are scattered into
the row of the zero-initialised [R, vocab] mask, and every slot's (token, next state) is written out
(-1 / 0 for invalid slots) for the state advance after beam selection.

`vntk_triton` has the signature and outputs of the torch reference
`genrec.kernels.constrained_mask_torch.vntk`. `vntk_apply_triton` is
the fused variant used in decoding (reference `vntk_apply`): instead of a bool mask it copies the valid
children's log-probs into a -inf-filled output, saving the separate [R, vocab] masked fill.
Kept to the Triton 3.6 language (the lent GPU machine's version); tests run it under
TRITON_INTERPRET=1 on CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["vntk_apply_triton", "vntk_triton"]


@triton.jit
def _gather_edges(states_ptr, row_ptr_ptr, edges_ptr, branch, BLOCK_B: tl.constexpr):
    """One block of a row's outgoing edges: (row, slots, slot < branch, slot < count, tokens, next states)."""
    r = tl.program_id(0).to(tl.int64)
    s = tl.load(states_ptr + r).to(tl.int64)
    start = tl.load(row_ptr_ptr + s).to(tl.int64)
    count = tl.load(row_ptr_ptr + s + 1).to(tl.int64) - start
    slot = tl.program_id(1).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    valid = slot < count
    edge = (start + slot) * 2
    tok = tl.load(edges_ptr + edge, mask=valid, other=-1)
    nxt = tl.load(edges_ptr + edge + 1, mask=valid, other=0)
    return r, slot, slot < branch, valid, tok, nxt


@triton.jit
def _vntk_kernel(
    states_ptr,
    row_ptr_ptr,
    edges_ptr,
    mask_ptr,
    tok_ptr,
    nxt_ptr,
    branch,
    vocab,
    BLOCK_B: tl.constexpr,
):
    r, slot, in_slice, valid, tok, nxt = _gather_edges(states_ptr, row_ptr_ptr, edges_ptr, branch, BLOCK_B)
    tl.store(mask_ptr + r * vocab + tok, tl.full([BLOCK_B], 1, tl.int8), mask=valid)
    tl.store(tok_ptr + r * branch + slot, tok, mask=in_slice)
    tl.store(nxt_ptr + r * branch + slot, nxt, mask=in_slice)


@triton.jit
def _vntk_apply_kernel(
    states_ptr,
    row_ptr_ptr,
    edges_ptr,
    lp_ptr,
    out_ptr,
    tok_ptr,
    nxt_ptr,
    branch,
    vocab,
    lp_row_stride,
    BLOCK_B: tl.constexpr,
):
    r, slot, in_slice, valid, tok, nxt = _gather_edges(states_ptr, row_ptr_ptr, edges_ptr, branch, BLOCK_B)
    val = tl.load(lp_ptr + r * lp_row_stride + tok, mask=valid, other=0.0)
    tl.store(out_ptr + r * vocab + tok, val, mask=valid)
    tl.store(tok_ptr + r * branch + slot, tok, mask=in_slice)
    tl.store(nxt_ptr + r * branch + slot, nxt, mask=in_slice)


def vntk_apply_triton(
    log_probs: torch.Tensor, states: torch.Tensor, row_ptr: torch.Tensor, edges: torch.Tensor, branch: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused Triton VNTK + masking: (log-probs with -inf off the trie, child tokens, child states)."""
    rows, vocab = log_probs.shape
    dev = log_probs.device
    # a level's slice of the full-vocabulary log-probs is row-strided but unit-stride inside a row
    lp = log_probs if log_probs.stride(1) == 1 else log_probs.contiguous()
    out = torch.full((rows, vocab), float("-inf"), dtype=lp.dtype, device=dev)
    tok = torch.empty(rows, branch, dtype=torch.int32, device=dev)
    nxt = torch.empty(rows, branch, dtype=torch.int32, device=dev)
    if rows:
        block = min(max(triton.next_power_of_2(branch), 16), 1024)
        _vntk_apply_kernel[(rows, triton.cdiv(branch, block))](
            states.contiguous(),
            row_ptr.contiguous(),
            edges.contiguous(),
            lp,
            out,
            tok,
            nxt,
            branch,
            vocab,
            lp.stride(0),
            BLOCK_B=block,
        )
    return out, tok, nxt


def vntk_triton(
    states: torch.Tensor, row_ptr: torch.Tensor, edges: torch.Tensor, branch: int, vocab: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton VNTK: (mask [R, vocab] bool, child tokens [R, branch] int32, child states [R, branch] int32)."""
    rows = states.shape[0]
    dev = states.device
    mask = torch.zeros(rows, vocab, dtype=torch.int8, device=dev)
    tok = torch.empty(rows, branch, dtype=torch.int32, device=dev)
    nxt = torch.empty(rows, branch, dtype=torch.int32, device=dev)
    if rows:
        block = min(max(triton.next_power_of_2(branch), 16), 1024)
        _vntk_kernel[(rows, triton.cdiv(branch, block))](
            states.contiguous(),
            row_ptr.contiguous(),
            edges.contiguous(),
            mask,
            tok,
            nxt,
            branch,
            vocab,
            BLOCK_B=block,
        )
    return mask.view(torch.bool), tok, nxt
