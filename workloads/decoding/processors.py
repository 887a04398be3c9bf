"""Level processors for the beam core (beam_core.LevelProcessor): each edits a level's log-probs.

- `ConstraintProcessor`: a constraint set's mask backend (STATIC's CSR index or a baseline), so any
  beam-based decoder decodes only SIDs of the set.
- `PrefixValidity`: NEZHA's every-step verification: codes that do not extend a beam's prefix to a
  valid item prefix get -inf (one child-table row per beam).
- `PerBeamTopK`: NEZHA's candidate cut: at the last level each beam proposes only its top k codes.
- `FinalValidity`: NEZHA's final verification: at the last level, candidates that are no item are
  dropped; it also counts how many of the unverified top k would have been valid.

Processor states are small frozen dataclasses (or tensors), so what a search carries is explicit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from genrec.workloads.constraints.backend import MaskBackend
from genrec.workloads.decoding.beam_core import Candidates, as_dense
from genrec.workloads.decoding.prefix_keys import PrefixKeySets

NEG_INF = float("-inf")


@dataclass(frozen=True)
class ConstraintState:
    node: Any  # the backend's per-row state (trie node, prefix rank, ...)
    aux: Any = None  # what `apply` found for `advance` (the rows' child states)


class ConstraintProcessor:
    """Masks every level with a constraint backend; rows carry the backend's state.

    A beam_core.CandidateProcessor: with a backend that proposes sparse candidates (STATIC), the
    levels it serves sparsely return `Candidates`; a baseline backend, a dense-path level, or
    candidates already proposed by an earlier processor get the dense `apply`."""

    phase: ClassVar[str] = "mask"

    def __init__(self, backend: MaskBackend) -> None:
        self.backend = backend
        self._propose = getattr(backend, "candidates", None)

    def init_state(self, batch: int, device: torch.device) -> ConstraintState:
        return ConstraintState(self.backend.init_state(batch, device))

    def apply(
        self, level: int, state: ConstraintState, log_probs: Tensor, beam_scores: Tensor
    ) -> tuple[Tensor, ConstraintState]:
        masked, aux = self.backend.apply(level, state.node, log_probs)
        return masked, ConstraintState(state.node, aux)

    def candidates(
        self, level: int, state: ConstraintState, log_probs: Tensor | Candidates, beam_scores: Tensor
    ) -> tuple[Tensor | Candidates, ConstraintState]:
        if self._propose is None or isinstance(log_probs, Candidates):
            return self.apply(level, state, as_dense(log_probs), beam_scores)
        found = self._propose(level, state.node, log_probs)
        if found is None:  # this level is cheaper dense
            return self.apply(level, state, log_probs, beam_scores)
        cand, codes, aux = found
        return Candidates(cand, codes, log_probs.shape[1]), ConstraintState(state.node, aux)

    def advance(
        self, level: int, state: ConstraintState, parent: Tensor, token: Tensor, pick: Tensor | None = None
    ) -> ConstraintState:
        if pick is None:
            return ConstraintState(self.backend.advance(level, state.node, state.aux, parent, token))
        return ConstraintState(self.backend.advance(level, state.node, state.aux, parent, token, pick))


def advance_prefix_keys(keys: Tensor, parent: Tensor, token: Tensor, codebook_size: int) -> Tensor:
    """Mixed-radix prefix keys of the new beams: parent key * T_l + code."""
    return keys.index_select(0, parent) * codebook_size + token


class PrefixValidity:
    """NEZHA verify="every": mask codes that leave the set of valid item prefixes."""

    phase: ClassVar[str] = "verify"

    def __init__(self, prefixes: PrefixKeySets) -> None:
        self.prefixes = prefixes
        self.sizes = prefixes.codec.codebook_sizes

    def init_state(self, batch: int, device: torch.device) -> Tensor:
        return torch.zeros(batch, dtype=torch.long, device=device)  # the empty prefix

    def apply(
        self, level: int, state: Tensor, log_probs: Tensor, beam_scores: Tensor
    ) -> tuple[Tensor, Tensor]:
        return self.prefixes.mask_invalid_children(level, state, log_probs), state

    def advance(self, level: int, state: Tensor, parent: Tensor, token: Tensor) -> Tensor:
        return advance_prefix_keys(state, parent, token, self.sizes[level])


class PerBeamTopK:
    """At the last level, keep each beam's top k codes only (-inf elsewhere).

    At earlier levels the cut cannot change the global top k (a candidate among the best k overall is
    among the best k of its own beam), so it is applied where it matters: before a final filter."""

    phase: ClassVar[str] = "draft"

    def __init__(self, k: int, levels: int) -> None:
        self.k, self.last = k, levels - 1

    def init_state(self, batch: int, device: torch.device) -> None:
        return None

    def apply(self, level: int, state: None, log_probs: Tensor, beam_scores: Tensor) -> tuple[Tensor, None]:
        if level != self.last or self.k >= log_probs.shape[-1]:
            return log_probs, None
        _, idx = log_probs.topk(self.k, dim=-1)
        keep = torch.zeros_like(log_probs, dtype=torch.bool).scatter_(-1, idx, True)
        return log_probs.masked_fill(~keep, NEG_INF), None

    def advance(self, level: int, state: None, parent: Tensor, token: Tensor) -> None:
        return None


@dataclass(frozen=True)
class FinalValidityState:
    batch: int
    keys: Tensor  # [R] prefix keys of the rows
    drafts_valid: int = 0  # valid SIDs among the unverified top k (summed over users)


class FinalValidity:
    """NEZHA verify="final": at the last level, drop candidates that are no item."""

    phase: ClassVar[str] = "verify"

    def __init__(self, prefixes: PrefixKeySets, k: int) -> None:
        self.prefixes, self.k = prefixes, k
        self.sizes = prefixes.codec.codebook_sizes
        self.last = len(self.sizes) - 1

    def init_state(self, batch: int, device: torch.device) -> FinalValidityState:
        return FinalValidityState(batch, torch.zeros(batch, dtype=torch.long, device=device))

    def apply(
        self, level: int, state: FinalValidityState, log_probs: Tensor, beam_scores: Tensor
    ) -> tuple[Tensor, FinalValidityState]:
        if level != self.last:
            return log_probs, state
        valid = self.prefixes.valid_children(level, state.keys)  # [R, T]
        b = state.batch
        cand = (beam_scores[:, None] + log_probs).view(b, -1)
        _, raw = cand.topk(min(self.k, cand.shape[1]), dim=-1)  # what the drafts return unverified
        hits = valid.view(b, -1).gather(1, raw) & torch.isfinite(cand.gather(1, raw))
        out = log_probs.masked_fill(~valid, NEG_INF)
        return out, FinalValidityState(b, state.keys, int(hits.sum()))

    def advance(
        self, level: int, state: FinalValidityState, parent: Tensor, token: Tensor
    ) -> FinalValidityState:
        keys = advance_prefix_keys(state.keys, parent, token, self.sizes[level])
        return FinalValidityState(state.batch, keys, state.drafts_valid)
