"""The interface every constraint mask backend implements (STATIC and the baselines).

A backend masks one SID level at a time for R beam rows and carries a per-row state (a trie node,
a prefix rank, a hash) through beam selection:

    state = backend.init_state(rows, device)                  # before level 0, one row per user
    log_probs, aux = backend.apply(level, state, log_probs)    # -inf on disallowed codes
    state = backend.advance(level, state, aux, parent, token)  # rows follow their chosen parents

Backends that compute a bool mask first derive from `BoolMaskBackend`, which turns `mask` into
`apply`; STATIC implements a fused `apply` directly (no [R, T] bool tensor), and as a
`CandidateBackend` also sparse `candidates`: each row's few allowed tokens and their log-probs, which
the beam core ranks instead of all T tokens (decoding.beam_core.Candidates).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class MaskBackend(Protocol):
    name: str

    def init_state(self, rows: int, device: torch.device) -> Any: ...

    def apply(self, level: int, state: Any, log_probs: torch.Tensor) -> tuple[torch.Tensor, Any]: ...

    def advance(self, level: int, state: Any, aux: Any, parent: torch.Tensor, token: torch.Tensor) -> Any: ...

    def memory_bytes(self) -> int: ...


class BoolMaskBackend:
    """`apply` from a bool `mask(level, state, log_probs) -> (allowed [R, T], aux)`: one masked fill."""

    def mask(self, level: int, state: Any, log_probs: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    def apply(self, level: int, state: Any, log_probs: torch.Tensor) -> tuple[torch.Tensor, Any]:
        allowed, aux = self.mask(level, state, log_probs)
        return log_probs.masked_fill(~allowed, float("-inf")), aux


class CandidateBackend(MaskBackend, Protocol):
    def candidates(
        self, level: int, state: Any, log_probs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Any] | None:
        """(log-probs [R, K] (-inf on empty slots), tokens [R, K], aux for `advance`), or None where
        the level is cheaper dense (the caller then uses `apply`)."""
        ...

    def advance(
        self,
        level: int,
        state: Any,
        aux: Any,
        parent: torch.Tensor,
        token: torch.Tensor,
        pick: torch.Tensor | None = None,
    ) -> Any:
        """As MaskBackend.advance; `pick` is the chosen slot's index into the flattened candidates."""
        ...
