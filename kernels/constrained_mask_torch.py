"""STATIC's constrained-mask step (the VNTK, Algorithm 2) in PyTorch: the reference the Triton kernel in
`genrec.kernels.constrained_mask` is tested against, and what decoding runs without a GPU.

Torch only (no triton import), so CPU installs without triton can use it.

`vntk(states, row_ptr, edges, branch, vocab)` for R beams in CSR states:
  1. boundary lookup: start = row_ptr[s], count = row_ptr[s + 1] - start;
  2. speculative slicing: read `branch` (= B_l) consecutive stacked (token, next) edges from start,
     whatever the real child count (the edge array is padded so the read stays in bounds);
  3. branch-free sanitisation: slot j is valid iff j < count; invalid slots get token -1, state 0;
  4. projection: scatter the valid tokens into a dense [R, vocab] bool mask (invalid slots are sent
     to a spare column that is dropped, so they can never clear a valid token).
Returns (mask [R, vocab] bool, child tokens [R, branch] int32, child states [R, branch] int32).

`vntk_apply` is the same kernel fused with the masking (what decoding uses): the valid children's
log-probs are scattered into a -inf tensor, so no bool mask and no separate masked fill are needed.

`select_next_state` is the state advance after beam selection: the chosen token's next state, found
among the parent's slots.
"""

from __future__ import annotations

import torch


def vntk(
    states: torch.Tensor, row_ptr: torch.Tensor, edges: torch.Tensor, branch: int, vocab: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s = states.long()
    start = row_ptr[s].long()  # [R]
    count = row_ptr[s + 1].long() - start
    slot = torch.arange(branch, device=states.device)
    idx = start[:, None] + slot  # [R, B]
    valid = slot < count[:, None]
    pair = edges[idx]  # [R, B, 2]: one gather fetches token and next state
    tok = torch.where(valid, pair[..., 0], -1)
    nxt = torch.where(valid, pair[..., 1], 0)
    mask = torch.zeros(states.shape[0], vocab + 1, dtype=torch.bool, device=states.device)
    mask.scatter_(1, torch.where(valid, tok, vocab).long(), True)
    return mask[:, :vocab], tok, nxt


def vntk_apply(
    log_probs: torch.Tensor, states: torch.Tensor, row_ptr: torch.Tensor, edges: torch.Tensor, branch: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The VNTK fused with the masking: (log-probs with -inf off the trie [R, T], child tokens, child states).

    Instead of a dense bool mask and a masked fill (two more [R, T] passes), the valid children's
    log-probs are scattered into a -inf tensor; invalid slots carry -inf and an amax scatter, so they
    can never overwrite a valid token of the same row."""
    s = states.long()
    start = row_ptr[s].long()
    count = row_ptr[s + 1].long() - start
    slot = torch.arange(branch, device=states.device)
    valid = slot < count[:, None]
    pair = edges[start[:, None] + slot]
    tok = torch.where(valid, pair[..., 0], -1)
    nxt = torch.where(valid, pair[..., 1], 0)
    col = tok.clamp(min=0).long()
    src = torch.where(valid, log_probs.gather(1, col), float("-inf"))
    out = torch.full_like(log_probs, float("-inf")).scatter_reduce_(1, col, src, "amax")
    return out, tok, nxt


def select_next_state(
    child_tokens: torch.Tensor, child_states: torch.Tensor, parent: torch.Tensor, token: torch.Tensor
) -> torch.Tensor:
    """Next state of each chosen (parent row, token): the matching slot's state, or 0 (sink) if none."""
    toks = child_tokens[parent]  # [R', B]
    hit = toks == token[:, None].to(toks.dtype)
    return torch.where(hit, child_states[parent], 0).amax(dim=1).to(torch.int32)
