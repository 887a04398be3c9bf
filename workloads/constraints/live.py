"""Live updates of a STATIC index: add and remove SIDs without rebuilding the transition matrix.

`LiveStaticMask` keeps the built (base) index and layers two cheap structures on it:
- tombstones as live-leaf counts: `edge_count[e]` = live SIDs below edge e of the CSR, and
  `dense_count[t][p]` = live SIDs under dense prefix p (length t + 1). An edge or dense prefix is
  allowed iff its count is > 0, so removing the last SID under a prefix also closes the prefix (as a
  rebuild would). Removing or re-adding a base SID walks its path once (L steps) and adjusts L counts.
- a delta index for SIDs absent from the base trie: a small CSR-only STATIC index over the added
  SIDs, rebuilt when it changes. A beam carries a (base state, delta state) pair; its mask is the
  union of both masks and each part advances on its own (a token missing from one side sends that
  side to the sink).
`merge()` rebuilds the base from the current set and empties the delta (call it periodically, or let
`merge_fraction` trigger it when the delta outgrows that fraction of the base).

It has the mask-backend interface of StaticMask (init_state, mask, advance, memory_bytes), so
the beam core drives it unchanged (decoding.beam.backbone_beam_search); decoding after updates
equals decoding with an index rebuilt from the updated set (tests/test_static.py).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from genrec.kernels.constrained_mask_torch import select_next_state
from genrec.workloads.constraints.backend import BoolMaskBackend
from genrec.workloads.constraints.sets import ConstraintError, ConstraintSet, normalise_codes
from genrec.workloads.constraints.transition import build_transition_matrix
from genrec.workloads.constraints.vntk import StaticMask


def _node_ids(codes: np.ndarray) -> list[np.ndarray]:
    """node_of_row[l][i]: local id of row i's level-l node (rows sorted, unique)."""
    n, L = codes.shape
    changed = np.zeros(n, dtype=bool)
    changed[0] = True
    out = [np.zeros(n, dtype=np.int64)]
    for level in range(L):
        if n > 1:
            changed[1:] |= codes[1:, level] != codes[:-1, level]
        out.append(np.cumsum(changed) - 1)
    return out


class LiveStaticMask(BoolMaskBackend):
    name = "static_live"

    def __init__(
        self,
        cset: ConstraintSet,
        dense_levels: int = 0,
        device: torch.device | str = "cpu",
        merge_fraction: float = 0.0,
    ) -> None:
        self.name_ = cset.name
        self.sizes = tuple(cset.codebook_sizes)
        self.d = dense_levels
        self.device = torch.device(device)
        self.merge_fraction = merge_fraction
        self._rebuild(cset.codes)

    # --- building ------------------------------------------------------------------------------
    def _rebuild(self, codes: np.ndarray) -> None:
        base = ConstraintSet.from_codes(self.name_, self.sizes, codes)
        # dense paths for the dense levels: the live counts and `_path` read the dense_states table
        tm = build_transition_matrix(base, self.d, sparse_fraction=0.0)
        self.base = StaticMask(tm.to(self.device))
        self.tm = self.base.tm
        self.row_ptr = tm.row_ptr.numpy().astype(np.int64)
        self.tok = tm.edges[:, 0].numpy()
        self.nxt = tm.edges[:, 1].numpy()
        self.dense_table = None if tm.dense_states is None else tm.dense_states.numpy()
        nodes = _node_ids(base.codes)
        L, d = len(self.sizes), self.d
        counts = [np.bincount(nodes[level + 1]) for level in range(d, L)]
        edge_count = np.zeros(len(self.tok), dtype=np.int32)
        edge_count[: sum(len(c) for c in counts)] = np.concatenate(counts)
        self.edge_count = torch.from_numpy(edge_count).to(self.device)
        self.dense_count = []
        for t in range(d):
            w = [math.prod(self.sizes[level + 1 : t + 1]) for level in range(t + 1)]
            flat = (base.codes[:, : t + 1].astype(np.int64) * np.asarray(w, dtype=np.int64)).sum(1)
            c = np.bincount(flat, minlength=math.prod(self.sizes[: t + 1])).astype(np.int32)
            self.dense_count.append(torch.from_numpy(c).to(self.device))
        self.base_set = base
        self.removed: set[tuple] = set()
        self.delta: set[tuple] = set()
        self._delta_mask: StaticMask | None = None

    def current_codes(self) -> np.ndarray:
        """The allowed SIDs now: base minus tombstoned, plus the delta (unsorted [N, L])."""
        codes = self.base_set.codes
        if self.removed:
            gone = ConstraintSet.from_codes("removed", self.sizes, sorted(self.removed))
            codes = codes[~gone.contains(codes)]
        extra = np.asarray(sorted(self.delta), dtype=np.int64).reshape(-1, len(self.sizes))
        return np.concatenate([codes.astype(np.int64), extra])

    def merge(self) -> None:
        """Rebuild the base index from the current set (empties the delta and the tombstones)."""
        codes = self.current_codes()
        if len(codes) == 0:
            raise ConstraintError(f"constraint set {self.name_!r} would be empty after the updates")
        self._rebuild(codes)

    # --- updates -------------------------------------------------------------------------------
    def _path(self, sid: tuple) -> tuple[list[int], list[int]]:
        """(dense prefix indexes for t < d, CSR edge indexes for levels d..L-1) of a base SID."""
        flats, edges = [], []
        p = 0
        for t in range(self.d):
            p = p * self.sizes[t] + sid[t]
            flats.append(p)
        s = int(self.dense_table[p]) if self.d else 1
        for level in range(self.d, len(self.sizes)):
            lo, hi = self.row_ptr[s], self.row_ptr[s + 1]
            i = lo + int(np.searchsorted(self.tok[lo:hi], sid[level]))
            edges.append(i)
            s = int(self.nxt[i])
        return flats, edges

    def _bump(self, sid: tuple, delta: int) -> None:
        flats, edges = self._path(sid)
        for t, p in enumerate(flats):
            self.dense_count[t][p] += delta
        idx = torch.as_tensor(edges, device=self.device)
        self.edge_count[idx] += delta

    def add(self, codes: object) -> int:
        """Allow these SIDs; returns how many were not allowed before."""
        arr, _ = normalise_codes(self.sizes, codes, f"additions to {self.name_!r}")
        added = 0
        for sid, in_base in zip(map(tuple, arr.tolist()), self.base_set.contains(arr).tolist()):
            if sid in self.removed:
                self.removed.discard(sid)
                self._bump(sid, +1)
            elif in_base or sid in self.delta:
                continue
            else:
                self.delta.add(sid)
                self._delta_mask = None
            added += 1
        self._maybe_merge()
        return added

    def remove(self, codes: object) -> int:
        """Disallow these SIDs; returns how many were allowed before."""
        arr, _ = normalise_codes(self.sizes, codes, f"removals from {self.name_!r}")
        removed = 0
        for sid, in_base in zip(map(tuple, arr.tolist()), self.base_set.contains(arr).tolist()):
            if sid in self.delta:
                self.delta.discard(sid)
                self._delta_mask = None
            elif in_base and sid not in self.removed:
                self.removed.add(sid)
                self._bump(sid, -1)
            else:
                continue
            removed += 1
        return removed

    def _maybe_merge(self) -> None:
        if self.merge_fraction and len(self.delta) > self.merge_fraction * len(self.base_set):
            self.merge()

    def _delta(self) -> StaticMask | None:
        if self.delta and self._delta_mask is None:
            cs = ConstraintSet.from_codes("delta", self.sizes, sorted(self.delta))
            self._delta_mask = StaticMask(build_transition_matrix(cs, 0).to(self.device))
        return self._delta_mask if self.delta else None

    # --- mask backend interface -----------------------------------------------------------------
    def init_state(self, rows: int, device: torch.device):
        delta = self._delta()
        return (self.base.init_state(rows, device), None if delta is None else delta.init_state(rows, device))

    def mask(self, level: int, state, log_probs: torch.Tensor | None = None):
        sb, sd = state
        t, d = self.sizes[level], self.d
        if level < d:
            m = self.dense_count[level].view(-1, t)[sb] > 0
            aux_b = None  # the advance computes the prefix (and reads dense_states at d - 1)
        else:
            m, aux_b = self._live_vntk(level, sb)
        aux_d = None
        delta = self._delta()
        if delta is not None and sd is not None:
            md, aux_d = delta.mask(level, sd)
            m = m | md
        return m, (aux_b, aux_d)

    def _live_vntk(self, level: int, states: torch.Tensor):
        s = states.long()
        start = self.tm.row_ptr[s].long()
        count = self.tm.row_ptr[s + 1].long() - start
        slot = torch.arange(self.tm.max_branch[level], device=s.device)
        idx = start[:, None] + slot
        valid = (slot < count[:, None]) & (self.edge_count[idx] > 0)  # tombstoned edges are closed
        pair = self.tm.edges[idx]
        tok = torch.where(valid, pair[..., 0], -1)
        nxt = torch.where(valid, pair[..., 1], 0)
        vocab = self.sizes[level]
        mask = torch.zeros(s.shape[0], vocab + 1, dtype=torch.bool, device=s.device)
        mask.scatter_(1, torch.where(valid, tok, vocab).long(), True)
        return mask[:, :vocab], (tok, nxt)

    def advance(self, level: int, state, aux, parent: torch.Tensor, token: torch.Tensor):
        sb, sd = state
        aux_b, aux_d = aux
        d = self.d
        if level < d:
            nb = self.base.advance(level, sb, None, parent, token)
        else:
            nb = select_next_state(*aux_b, parent, token)
        nd = None
        delta = self._delta()
        if delta is not None and sd is not None:
            nd = delta.advance(level, sd, aux_d, parent, token)
        return nb, nd

    def memory_bytes(self) -> int:
        extra = self.edge_count.numel() * 4 + sum(c.numel() * 4 for c in self.dense_count)
        delta = self._delta()
        return self.base.memory_bytes() + extra + (delta.memory_bytes() if delta is not None else 0)
