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

`csr_candidates` is the sparse form (what decoding uses on CSR levels): the same speculative read,
but only the [R, B] log-probs of each beam's slots are gathered (-inf on slots past the child count),
with the slots' tokens and edges; nothing of size [R, vocab] is written, and the beam selection then
ranks w * B candidates per user instead of w * vocab. It is written for few, cheap torch ops (about
ten per level), since on a CPU a level's cost at small B is the per-op overhead.

`select_next_state` is the state advance after beam selection: the chosen token's next state, found
among the parent's slots (with sparse candidates, the chosen slot's edge gives it directly).

`csr_level_select` is a whole CSR level of the beam search composed from those pieces (csr_candidates,
the beam core's flat top-W, the chosen slots' edges): the reference of the one-launch Triton kernel in
`genrec.kernels.csr_level_select`, with its signature and outputs.
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


def row_bounds(row_ptr: torch.Tensor) -> torch.Tensor:
    """[S, 2] view of row_ptr [S + 1] whose row s is (first edge, end) of state s: one gather reads both."""
    return row_ptr.as_strided((row_ptr.numel() - 1, 2), (1, 1))


def packed_edges(edges: torch.Tensor) -> torch.Tensor:
    """[E] int64 view of the contiguous [E, 2] int32 (token, next state) rows: gathering 8-byte scalars
    is several times faster than gathering 2-wide rows, and viewing the result back as int32 pairs
    restores them bit for bit (whatever the byte order)."""
    return edges.view(torch.int64).view(-1)


def csr_candidates(
    log_probs: torch.Tensor,
    states: torch.Tensor,
    bounds: torch.Tensor,
    edges64: torch.Tensor,
    slots: torch.Tensor,
    token_limit: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse VNTK: (log-probs [R, B], tokens [R, B] int32, edges read [R, B, 2] int32).

    `bounds` = row_bounds(row_ptr), `edges64` = packed_edges(edges), `slots` = arange(B) (int32, on
    the device). Slot j of row r reads edge row_ptr[s_r] + j; it is a child of s_r iff that edge is
    below the row's end, else its log-prob is -inf and its token and edge are whatever the read found
    (in bounds thanks to the edge padding). `token_limit` clamps the tokens read (a level whose codebook
    is smaller than a later level's, see TransitionMatrix.clamps_tokens), so every token indexes
    `log_probs`."""
    bound = bounds.index_select(0, states)  # [R, 2]
    idx = bound[:, :1] + slots  # [R, B] edge index of each slot
    pair = edges64.index_select(0, idx.view(-1)).view(torch.int32).view(idx.shape[0], slots.numel(), 2)
    tok = pair[..., 0] if token_limit is None else pair[..., 0].clamp(max=token_limit - 1)
    cand = log_probs.gather(1, tok.long())
    return cand.masked_fill_(idx >= bound[:, 1:], float("-inf")), tok, pair


def dense_from_candidates(log_probs: torch.Tensor, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Sparse candidates ([R, B] log-probs, -inf on empty slots, and their tokens) as [R, vocab] log-probs."""
    out = log_probs.new_full((log_probs.shape[0], vocab + 1), float("-inf"))
    # empty slots write to a spare column, so a repeated token can never overwrite a real child's
    col = torch.where(torch.isfinite(log_probs), tokens.long(), vocab)
    return out.scatter_(1, col, log_probs)[:, :vocab]


def select_next_state(
    child_tokens: torch.Tensor, child_states: torch.Tensor, parent: torch.Tensor, token: torch.Tensor
) -> torch.Tensor:
    """Next state of each chosen (parent row, token): the matching slot's state, or 0 (sink) if none."""
    toks = child_tokens[parent]  # [R', B]
    hit = toks == token[:, None].to(toks.dtype)
    return torch.where(hit, child_states[parent], 0).amax(dim=1).to(torch.int32)


def csr_level_select(
    log_probs: torch.Tensor,
    scores: torch.Tensor,
    states: torch.Tensor,
    row_ptr: torch.Tensor,
    edges: torch.Tensor,
    branch: int,
    beam_width: int,
    logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One CSR level of constrained beam search: (new scores [B, W], parent [B, W] int64 (index into the
    user's w beams), code [B, W] int64, next state [B * W] int32).

    The exact top W of scores[b, j] + log_probs[b * w + j, c] over the children c of beam j's state
    (log_probs = log_softmax(logits) with `logits=True`); slots past a user's valid candidates get
    score -inf, parent 0, code 0 and the sink state 0. The steps are the sparse path of decoding
    (csr_candidates, then beam_core.top_flat's padded topk, which kernels may not import, then the
    chosen slots' edges); tokens are clamped to the vocabulary, which is what `token_limit` does on the
    levels that need it and a no-op on the others."""
    if logits:
        log_probs = torch.log_softmax(log_probs, dim=-1)
    batch, w = scores.shape
    slots = torch.arange(branch, dtype=torch.int32, device=states.device)
    cand, tok, pair = csr_candidates(
        log_probs, states, row_bounds(row_ptr), packed_edges(edges), slots, log_probs.shape[1]
    )
    total = (scores[:, :, None] + cand.view(batch, w, branch)).view(batch, w * branch)
    n = min(beam_width, w * branch)
    best, flat = total.topk(n, dim=-1)
    if n < beam_width:
        best = torch.cat([best, best.new_full((batch, beam_width - n), float("-inf"))], dim=1)
        flat = torch.cat([flat, flat.new_zeros(batch, beam_width - n)], dim=1)
    found = torch.isfinite(best)
    pick = (flat + torch.arange(batch, device=flat.device)[:, None] * (w * branch)).view(-1)
    code = tok.reshape(-1).index_select(0, pick).view(batch, -1).long()
    nxt = pair[..., 1].reshape(-1).index_select(0, pick)
    parent = torch.where(found, flat // branch, 0)
    return best, parent, torch.where(found, code, 0), torch.where(found.view(-1), nxt, 0)
