"""STATIC's per-step mask over the VNTK (vectorized node transition kernel, Algorithm 2).

The kernel's torch reference (`vntk`, the fused `vntk_apply`, the sparse `csr_candidates`, and the
state advance `select_next_state`) lives in genrec.kernels.constrained_mask_torch beside its Triton
kernel (genrec.kernels.constrained_mask).

`StaticMask` drives a whole decode and implements constraints.backend.MaskBackend plus the sparse
`candidates` of a CandidateBackend. Per level it takes the path the transition matrix chose:
- CSR levels (>= d) and sparse-path dense levels: `candidates` gathers each beam's B_l children's
  log-probs ([R, B_l], never [R, T]); after selection, the chosen slot's edge is the next state;
- dense-path dense levels (B_l close to T_l): `candidates` returns None and `apply` adds the row of
  the 0 / -inf bias table to the log-probs; the next state is p * T_l + token, or at the last dense
  level the `dense_states` entry of the chosen (p, token), read for the chosen beams only.
`apply` (dense [R, T] output) and `mask` (bool [R, T]) exist for every level, for callers that need
the dense form (sampling selectors, speculative verification, the baselines' tests).
`kernel="triton"` swaps in the Triton kernel of genrec.kernels.constrained_mask for the dense forms of
CSR levels; sparse candidates use the torch ops with either kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from genrec.kernels.constrained_mask_torch import (
    csr_candidates,
    dense_from_candidates,
    packed_edges,
    row_bounds,
    select_next_state,
    vntk,
    vntk_apply,
)
from genrec.workloads.constraints.transition import TransitionMatrix

__all__ = ["Children", "StaticMask"]


class Children(NamedTuple):
    """What a step read for each row: its slots' tokens and (on CSR levels) next states ([R, B] each).

    From the dense VNTK, empty slots have token -1; from sparse candidates they hold whatever the read
    found (maybe a real token of another node, or padding), and `log_probs` (-inf on them) tells them
    apart. A dense level's child table has no next states: they follow from the prefix and the slot."""

    tokens: torch.Tensor
    next_states: torch.Tensor | None
    log_probs: torch.Tensor | None = None

    def real_tokens(self) -> torch.Tensor:
        """Tokens with -1 on empty slots (a -inf slot is empty, or a child no finite beam can choose)."""
        if self.log_probs is None:
            return self.tokens
        return torch.where(torch.isfinite(self.log_probs), self.tokens, -1)

    def slot_of(self, parent: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """Slot of each chosen (parent row, token) among the parent's slots (0 when not found)."""
        return (self.real_tokens().index_select(0, parent) == token[:, None]).int().argmax(dim=1)


class CsrLevel(NamedTuple):
    """How a CSR level's candidates are read."""

    bounds: torch.Tensor  # [S, 2] (first edge, end) per state
    edges64: torch.Tensor  # [E + pad] int64: packed_edges of the [E + pad, 2] int32 edges
    slots: torch.Tensor  # arange(B_l) int32
    token_limit: int | None  # clamp the tokens read (TransitionMatrix.clamps_tokens)


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
        d = tm.dense_levels
        # dense path of level t < d: row p of the bias over prefixes of length t + 1
        self._bias_rows = [
            None if b is None else b.view(-1, self.sizes[t]) for t, b in enumerate(tm.dense_bias)
        ]
        bounds, edges64 = row_bounds(tm.row_ptr), packed_edges(tm.edges)
        self._csr = [
            CsrLevel(
                bounds,
                edges64,
                torch.arange(tm.max_branch[level], dtype=torch.int32, device=tm.edges.device),
                self.sizes[level] if tm.clamps_tokens(level) else None,
            )
            if level >= d
            else None
            for level in range(tm.levels)
        ]
        # after the last dense level, beams enter the CSR at its first level's states
        self._first_csr_state = tm.level_base[0] if tm.level_base else 0

    def init_state(self, rows: int, device: torch.device) -> torch.Tensor:
        """Per-row state before step 0: prefix index 0 (dense) or the root's CSR state."""
        value = 0 if self.tm.dense_levels else self.tm.root_state
        return torch.full(
            (rows,), value, dtype=torch.int64 if self.tm.dense_levels else torch.int32, device=device
        )

    # --- the sparse path ---------------------------------------------------------------------------
    def candidates(
        self, level: int, state: torch.Tensor, log_probs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Children] | None:
        """Each row's children at `level`: (log-probs [R, B_l] (-inf on empty slots), tokens [R, B_l],
        what `advance` needs), or None where the level takes the dense path (use `apply`)."""
        csr = self._csr[level]
        if csr is not None:
            cand, tok, pair = csr_candidates(
                log_probs, state, csr.bounds, csr.edges64, csr.slots, csr.token_limit
            )
            return cand, tok, Children(tok, pair[..., 1], cand)
        table = self.tm.child_tables[level]
        if table is None:
            return None
        tok = table.tokens.index_select(0, state)  # [R, B] the prefix's children, padded
        cand = log_probs.gather(1, tok)
        bias = table.bias.index_select(0, state)  # -inf on padding: an add, no branchy mask
        cand = cand.add_(bias) if cand.dtype == bias.dtype else cand + bias
        return cand, tok, Children(tok, None, cand)

    # --- dense forms ---------------------------------------------------------------------------------
    def apply(self, level: int, state: torch.Tensor, log_probs: torch.Tensor) -> tuple[torch.Tensor, object]:
        """Log-probs [R, T] with -inf on disallowed tokens, and the aux data for `advance`."""
        bias_rows = self._bias_rows[level] if level < self.tm.dense_levels else None
        if bias_rows is not None:  # dense path: one row gather and one add, no branchy mask
            bias = bias_rows.index_select(0, state)
            return (bias.add_(log_probs) if bias.dtype == log_probs.dtype else log_probs + bias), None
        if level < self.tm.dense_levels:
            cand, tok, children = self.candidates(level, state, log_probs)  # type: ignore[misc]
            return dense_from_candidates(cand, tok, self.sizes[level]), children
        out, tok, nxt = self._vntk_apply(
            log_probs, state, self.tm.row_ptr, self.tm.edges, self.tm.max_branch[level]
        )
        return out, Children(tok, nxt)

    def mask(
        self, level: int, state: torch.Tensor, log_probs: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, object]:
        """Allowed tokens of `level` for each row: (bool [R, T_level], auxiliary data for `advance`).

        `log_probs` ([R, T_level]) is part of the backend interface (PPV approx needs it); unused here."""
        if level >= self.tm.dense_levels:
            return self.kernel_step(level, state)
        zeros = torch.zeros(state.shape[0], self.sizes[level], device=state.device)
        masked, aux = self.apply(level, state, zeros)
        return torch.isfinite(masked), aux

    def kernel_step(self, level: int, state: torch.Tensor) -> tuple[torch.Tensor, object]:
        mask, tok, nxt = self._vntk(
            state, self.tm.row_ptr, self.tm.edges, self.tm.max_branch[level], self.sizes[level]
        )
        return mask, Children(tok, nxt)

    # --- the state advance ---------------------------------------------------------------------------
    def advance(
        self,
        level: int,
        state: torch.Tensor,
        aux: object,
        parent: torch.Tensor,
        token: torch.Tensor,
        pick: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """State of each new beam from its parent row (index into `state`) and chosen token.

        `pick` (sparse selection) is the chosen slot's index into the flattened [R * B_l] candidates,
        so the next state needs no search among the parent's slots."""
        d = self.tm.dense_levels
        if level < d - 1:  # the chosen prefix's p (either path)
            return state.index_select(0, parent) * self.sizes[level] + token
        children: Children | None = aux  # type: ignore[assignment]
        if level == d - 1:
            prefix = state.index_select(0, parent)
            if children is None:  # dense path into the CSR: the table entry of (p, token)
                return self.tm.dense_states.index_select(0, prefix * self.sizes[level] + token)  # type: ignore[union-attr]
            # child table: p's children are consecutive level-d states, slot j is the j-th of them
            table = self.tm.child_tables[level]
            slot = (
                children.slot_of(parent, token) if pick is None else pick - parent * children.tokens.shape[1]
            )
            first = table.first_child.index_select(0, prefix)  # type: ignore[union-attr]
            state = (first + slot + self._first_csr_state).to(torch.int32)
            # a padding beam (score -inf, fewer children than beams) sits on a padding slot, where
            # first + slot is another prefix's child or a node of a later level: send it to the sink,
            # whose reads are empty at every level (a later level's edges may hold codes >= T_l)
            real = torch.isfinite(table.bias[prefix, slot])  # type: ignore[union-attr]
            return torch.where(real, state, 0)
        if pick is not None:
            return children.next_states.reshape(-1).index_select(0, pick)  # type: ignore[union-attr]
        return select_next_state(children.real_tokens(), children.next_states, parent, token)  # type: ignore[union-attr]

    def memory_bytes(self) -> int:
        return self.tm.memory_bytes()["total"]
