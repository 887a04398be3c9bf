"""STATIC's sparse transition matrix: the trie of a constraint set flattened into CSR arrays.

Layout (all int32, built from the set's sorted, duplicate-free codes in O(N * L) vectorised passes):

- Trie nodes are SID prefixes; level l holds the N_l distinct prefixes of length l (level 0 = root).
- States: 0 is the sink (no children; also the "next state" of a completed SID and of a beam that
  left the trie). The CSR covers only the *sparse* levels d..L-1: their nodes get consecutive state
  ids 1, 2, ... level by level, each level in lexicographic order. Levels below d live in the dense
  tables and have no CSR rows (so memory follows the paper's U_max, appendix B).
- `row_ptr` [S + 1]: the edges of state s are `edges[row_ptr[s]:row_ptr[s + 1]]` (row_ptr[0] =
  row_ptr[1] = 0: the sink has none).
- `edges` [E + pad, 2]: the stacked (token, next state) layout of appendix A.1.1, so one read fetches
  both; a node's edges are contiguous and sorted by token. `pad` = the largest sparse branch factor
  rows of (0, 0), so the fixed-width read `row_ptr[s] + range(B_l)` never leaves the array.
- `max_branch` [L]: B_l = the most children of any level-l node (the golden example 12345, 12367,
  12890, 23456 gives (2, 1, 2, 2, 1)).
- Dense levels (d >= 1, appendix A.1.2): during the first d steps a beam's state is the flat
  mixed-radix index p of its prefix. `dense_masks[t]` (t < d - 1) is a bool table over prefixes of
  length t + 1 (the step-t mask of prefix p is its row p); the step d - 1 mask and the switch to the
  CSR come from `dense_states` [prod_{l<d} T_l] int32, the CSR state of each length-d prefix (0 when
  absent): mask = row p != 0, next state = the entry of the chosen token.

d must be < L, and d >= 1 needs prod_{l<d} T_l <= `DENSE_MAX_ENTRIES` (2^28, 1 GiB of int32 states):
at V = 2048 that allows d <= 2; d = 3 (8.6e9 entries, 34 GB) is refused with that reason, while d = 3
on small codebooks (e.g. V = 64: 262144 entries) works.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from genrec.workloads.constraints.sets import ConstraintError, ConstraintSet

DENSE_MAX_ENTRIES = 2**28
K1_BYTES_PER_NODE = 12  # the paper's CSR cost per node (three int32 arrays)
K2_BYTES_PER_DENSE_STATE = 4


@dataclass
class TransitionMatrix:
    codebook_sizes: tuple[int, ...]
    dense_levels: int
    row_ptr: torch.Tensor  # [S + 1] int32
    edges: torch.Tensor  # [E + pad, 2] int32: (token, next state)
    max_branch: tuple[int, ...]  # B_l per level l = 0..L-1
    dense_masks: list[torch.Tensor]  # dense_masks[t]: bool [prod_{l<=t} T_l], t < d - 1
    dense_states: torch.Tensor | None  # [prod_{l<d} T_l] int32, or None when d == 0
    nodes_per_level: tuple[int, ...]  # N_0..N_L (N_0 = 1, N_L = |C|)
    num_items: int
    level_base: tuple[int, ...] = field(default=())  # first CSR state id of each sparse level

    @property
    def levels(self) -> int:
        return len(self.codebook_sizes)

    @property
    def num_states(self) -> int:
        return int(self.row_ptr.numel()) - 1

    @property
    def num_edges(self) -> int:
        return int(self.row_ptr[-1])

    @property
    def root_state(self) -> int:
        """CSR state of the root (only meaningful for d == 0)."""
        return 1

    def to(self, device: torch.device | str) -> TransitionMatrix:
        return TransitionMatrix(
            self.codebook_sizes,
            self.dense_levels,
            self.row_ptr.to(device),
            self.edges.to(device),
            self.max_branch,
            [m.to(device) for m in self.dense_masks],
            None if self.dense_states is None else self.dense_states.to(device),
            self.nodes_per_level,
            self.num_items,
            self.level_base,
        )

    # --- memory (appendix B) ----------------------------------------------------------------
    def memory_bytes(self) -> dict[str, int]:
        def nbytes(t: torch.Tensor | None) -> int:
            return 0 if t is None else t.numel() * t.element_size()

        csr = nbytes(self.row_ptr) + nbytes(self.edges)
        dense = sum(nbytes(m) for m in self.dense_masks) + nbytes(self.dense_states)
        return {"csr": csr, "dense": dense, "total": csr + dense}

    def u_max_bytes(self) -> float:
        return u_max_bytes(self.codebook_sizes, self.num_items, self.dense_levels)


def u_max_bytes(
    codebook_sizes: tuple[int, ...],
    num_items: int,
    dense_levels: int,
    k1: int = K1_BYTES_PER_NODE,
    k2: int = K2_BYTES_PER_DENSE_STATE,
) -> float:
    """The paper's upper bound (appendix B.1), with prod_{l<=ell} T_l for |V|^ell (per-level codebooks):
    (1/8 + K2) * prod_{l<d} T_l + K1 * sum_{ell=d+1}^{L} min(prod_{l<ell} T_l, |C|)."""
    d = dense_levels
    dense = (1 / 8 + k2) * math.prod(codebook_sizes[:d]) if d else 0.0
    sparse = sum(
        min(math.prod(codebook_sizes[:ell]), num_items) for ell in range(d + 1, len(codebook_sizes) + 1)
    )
    return dense + k1 * sparse


def check_dense_levels(codebook_sizes: tuple[int, ...], dense_levels: int) -> None:
    d, L = dense_levels, len(codebook_sizes)
    if not 0 <= d < L:
        raise ConstraintError(
            f"dense_levels d={d} is invalid for SIDs of {L} levels: use 0 <= d < L (d = 0: CSR only; "
            "the paper uses d = 2)"
        )
    entries = math.prod(codebook_sizes[:d])
    if d and entries > DENSE_MAX_ENTRIES:
        raise ConstraintError(
            f"dense_levels d={d} needs a dense table of prod(T_1..T_{d}) = {entries:.3g} prefixes "
            f"({4 * entries / 2**30:.1f} GiB of int32 states), above the {DENSE_MAX_ENTRIES:.3g}-entry cap: "
            f"|V|^d grows exponentially, so use d <= {_max_dense(codebook_sizes)} for these codebooks"
        )


def _max_dense(codebook_sizes: tuple[int, ...]) -> int:
    d = 0
    while d + 1 < len(codebook_sizes) and math.prod(codebook_sizes[: d + 1]) <= DENSE_MAX_ENTRIES:
        d += 1
    return d


def build_transition_matrix(cset: ConstraintSet, dense_levels: int = 0) -> TransitionMatrix:
    """Flatten the constraint set's trie into CSR + dense tables (see the module docstring)."""
    sizes = tuple(cset.codebook_sizes)
    L, d = len(sizes), dense_levels
    check_dense_levels(sizes, d)
    codes = cset.codes  # sorted, unique (guaranteed by ConstraintSet)
    n = len(codes)
    if n == 0:
        raise ConstraintError(f"constraint set {cset.name!r} is empty")
    # starts[l][i]: row i begins a new prefix of length l + 1 (a new node at level l + 1)
    starts = np.empty((L, n), dtype=bool)
    changed = np.zeros(n, dtype=bool)
    changed[0] = True
    for level in range(L):
        if n > 1:
            changed[1:] |= codes[1:, level] != codes[:-1, level]
        starts[level] = changed
    if n > 1 and not starts[L - 1, 1:].all():
        raise ConstraintError(
            f"constraint set {cset.name!r} has duplicate SIDs (build it with ConstraintSet)"
        )
    # node_of_row[l][i]: local id of row i's level-l node (level 0: the root, id 0)
    node_of_row = [np.zeros(n, dtype=np.int64)]
    for level in range(L):
        node_of_row.append(np.cumsum(starts[level]) - 1)
    nodes = [1] + [int(starts[level].sum()) for level in range(L)]

    # children of level-l nodes are the level-(l+1) nodes, in order; their parents and tokens
    max_branch = []
    child_rows = [np.flatnonzero(starts[level]) for level in range(L)]
    for level in range(L):
        parent = node_of_row[level][child_rows[level]]
        max_branch.append(int(np.bincount(parent, minlength=nodes[level]).max()))

    # CSR state ids for sparse levels d..L-1
    level_base = {}
    nxt = 1
    for level in range(d, L):
        level_base[level] = nxt
        nxt += nodes[level]
    num_states = nxt
    row_ptr = np.zeros(num_states + 1, dtype=np.int64)
    tokens, next_states = [], []
    edge_base = 0
    for level in range(d, L):
        rows = child_rows[level]
        parent = node_of_row[level][rows]
        counts = np.bincount(parent, minlength=nodes[level])
        b = level_base[level]
        row_ptr[b + 1 : b + 1 + nodes[level]] = edge_base + np.cumsum(counts)
        tokens.append(codes[rows, level].astype(np.int64))
        if level + 1 < L:
            next_states.append(level_base[level + 1] + node_of_row[level + 1][rows])
        else:
            next_states.append(np.zeros(len(rows), dtype=np.int64))
        edge_base += len(rows)
    row_ptr[1] = 0  # the first sparse state starts at edge 0 (row_ptr[0] = row_ptr[1] = 0: the sink)
    pad = max(max_branch[d:])
    edges = np.zeros((edge_base + pad, 2), dtype=np.int64)
    edges[:edge_base, 0] = np.concatenate(tokens)
    edges[:edge_base, 1] = np.concatenate(next_states)
    if num_states >= 2**31 or edge_base + pad >= 2**31:
        raise ConstraintError(f"constraint set {cset.name!r} is too large for int32 state ids")

    dense_masks: list[torch.Tensor] = []
    dense_states = None
    if d:
        weights = [math.prod(sizes[level + 1 : d]) for level in range(d)]
        for t in range(d - 1):  # prefixes of length t + 1
            rows = child_rows[t]
            w = [math.prod(sizes[level + 1 : t + 1]) for level in range(t + 1)]
            flat = (codes[rows, : t + 1].astype(np.int64) * np.asarray(w, dtype=np.int64)).sum(1)
            m = np.zeros(math.prod(sizes[: t + 1]), dtype=bool)
            m[flat] = True
            dense_masks.append(torch.from_numpy(m))
        rows = child_rows[d - 1]
        flat = (codes[rows, :d].astype(np.int64) * np.asarray(weights, dtype=np.int64)).sum(1)
        table = np.zeros(math.prod(sizes[:d]), dtype=np.int32)
        table[flat] = level_base[d] + node_of_row[d][rows]
        dense_states = torch.from_numpy(table)

    return TransitionMatrix(
        codebook_sizes=sizes,
        dense_levels=d,
        row_ptr=torch.from_numpy(row_ptr.astype(np.int32)),
        edges=torch.from_numpy(edges.astype(np.int32)),
        max_branch=tuple(max_branch),
        dense_masks=dense_masks,
        dense_states=dense_states,
        nodes_per_level=tuple(nodes),
        num_items=n,
        level_base=tuple(level_base[level] for level in range(d, L)),
    )
