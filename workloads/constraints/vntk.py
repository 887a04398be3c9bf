"""STATIC's per-step mask over the VNTK (vectorized node transition kernel, Algorithm 2).

The kernel's torch reference (`vntk`, the fused `vntk_apply`, and the state advance `select_next_state`)
lives in genrec.kernels.constrained_mask_torch beside its Triton kernel (genrec.kernels.constrained_mask);
it is re-exported here under the same names.

`StaticMask` drives a whole decode: dense lookups for the first d steps, the VNTK after, and the
state advance after beam selection (the chosen token's next state, found among the parent's slots).
It implements constraints.backend.MaskBackend with a fused `apply` (no [R, T] bool mask); the
baselines derive `apply` from their bool `mask`.
`kernel="triton"` swaps in the Triton kernel of genrec.kernels.constrained_mask.
"""

from __future__ import annotations

import torch

from genrec.kernels.constrained_mask_torch import select_next_state, vntk, vntk_apply
from genrec.workloads.constraints.transition import TransitionMatrix


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
