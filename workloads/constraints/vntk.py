"""The vectorized node transition kernel (VNTK, Algorithm 2) in PyTorch, and STATIC's per-step mask.

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

`StaticMask` drives a whole decode: dense lookups for the first d steps, the VNTK after, and the
state advance after beam selection (the chosen token's next state, found among the parent's slots).
Mask backends share its interface: init_state, mask (bool form), optional apply (fused form),
advance, memory_bytes; `apply_constraint` picks the fused form when a backend has one.
`kernel="triton"` swaps in the Triton kernel of genrec.kernels.constrained_mask.
"""

from __future__ import annotations

import torch

from genrec.workloads.constraints.transition import TransitionMatrix


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


def apply_constraint(
    backend: object, level: int, state: object, log_probs: torch.Tensor
) -> tuple[torch.Tensor, object]:
    """Masked log-probs (-inf off the constraint) and the backend's aux data for `advance`.

    Uses the backend's fused `apply` when it has one, else its bool `mask` and a masked fill."""
    fused = getattr(backend, "apply", None)
    if fused is not None:
        return fused(level, state, log_probs)
    allowed, aux = backend.mask(level, state, log_probs)  # type: ignore[attr-defined]
    return log_probs.masked_fill(~allowed, float("-inf")), aux


def select_next_state(
    child_tokens: torch.Tensor, child_states: torch.Tensor, parent: torch.Tensor, token: torch.Tensor
) -> torch.Tensor:
    """Next state of each chosen (parent row, token): the matching slot's state, or 0 (sink) if none."""
    toks = child_tokens[parent]  # [R', B]
    hit = toks == token[:, None].to(toks.dtype)
    return torch.where(hit, child_states[parent], 0).amax(dim=1).to(torch.int32)


class StaticMask:
    """STATIC per-step masking for a transition matrix on a device (torch or Triton VNTK)."""

    name = "static"

    def __init__(self, tm: TransitionMatrix, kernel: str = "torch") -> None:
        if kernel not in ("torch", "triton"):
            raise ValueError(f"kernel must be 'torch' or 'triton', got {kernel!r}")
        self.tm = tm
        self.kernel = kernel
        self._vntk, self._vntk_apply = vntk, vntk_apply
        if kernel == "triton":
            from genrec.kernels.constrained_mask import vntk_apply_triton, vntk_triton

            self._vntk, self._vntk_apply = vntk_triton, vntk_apply_triton
        self.sizes = tm.codebook_sizes
        self._dense_rows = [
            m.view(-1, self.sizes[t]) for t, m in enumerate(tm.dense_masks)
        ]  # step t: [prod_{l<t} T_l, T_t]
        if tm.dense_states is not None:
            self._dense_state_rows = tm.dense_states.view(-1, self.sizes[tm.dense_levels - 1])

    def init_state(self, rows: int, device: torch.device) -> torch.Tensor:
        """Per-row state before step 0: prefix index 0 (dense) or the root's CSR state."""
        value = 0 if self.tm.dense_levels else self.tm.root_state
        return torch.full(
            (rows,), value, dtype=torch.int64 if self.tm.dense_levels else torch.int32, device=device
        )

    def mask(
        self, level: int, state: torch.Tensor, log_probs: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, object]:
        """Allowed tokens of `level` for each row: (bool [R, T_level], auxiliary data for `advance`).

        `log_probs` ([R, T_level]) is part of the backend interface (PPV approx needs it); unused here."""
        d = self.tm.dense_levels
        if level < d - 1:
            return self._dense_rows[level][state], None
        if level == d - 1:
            rows = self._dense_state_rows[state]  # [R, T]: CSR state of each extension (0 = absent)
            return rows != 0, rows
        return self.kernel_step(level, state)

    def apply(self, level: int, state: torch.Tensor, log_probs: torch.Tensor) -> tuple[torch.Tensor, object]:
        """Fused step: log-probs with -inf on disallowed tokens, and the aux data for `advance`."""
        d = self.tm.dense_levels
        neg_inf = float("-inf")
        if level < d - 1:
            return torch.where(self._dense_rows[level][state], log_probs, neg_inf), None
        if level == d - 1:
            rows = self._dense_state_rows[state]
            return torch.where(rows != 0, log_probs, neg_inf), rows
        out, tok, nxt = self._vntk_apply(
            log_probs, state, self.tm.row_ptr, self.tm.edges, self.tm.max_branch[level]
        )
        return out, (tok, nxt)

    def kernel_step(self, level: int, state: torch.Tensor) -> tuple[torch.Tensor, object]:
        mask, tok, nxt = self._vntk(
            state, self.tm.row_ptr, self.tm.edges, self.tm.max_branch[level], self.sizes[level]
        )
        return mask, (tok, nxt)

    def advance(
        self, level: int, state: torch.Tensor, aux: object, parent: torch.Tensor, token: torch.Tensor
    ) -> torch.Tensor:
        """State of each new beam from its parent row (index into `state`) and chosen token."""
        d = self.tm.dense_levels
        if level < d - 1:
            return state[parent] * self.sizes[level] + token
        if level == d - 1:
            return aux[parent, token].to(torch.int32)  # type: ignore[index]
        tok, nxt = aux  # type: ignore[misc]
        return select_next_state(tok, nxt, parent, token)

    def memory_bytes(self) -> int:
        return self.tm.memory_bytes()["total"]
