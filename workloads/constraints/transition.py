"""STATIC's sparse transition matrix: the trie of a constraint set flattened into CSR arrays.

Layout (all int32 unless noted, built from the set's sorted, duplicate-free codes in O(N * L)
vectorised passes):

- Trie nodes are SID prefixes; level l holds the N_l distinct prefixes of length l (level 0 = root).
- States: 0 is the sink (no children; also the "next state" of a completed SID and of a beam that
  left the trie). The CSR covers only the *sparse* levels d..L-1: their nodes get consecutive state
  ids 1, 2, ... level by level, each level in lexicographic order. Levels below d live in the dense
  tables and have no CSR rows (so memory follows the paper's U_max, appendix B).
- `row_ptr` [S + 1]: the edges of state s are `edges[row_ptr[s]:row_ptr[s + 1]]` (row_ptr[0] =
  row_ptr[1] = 0: the sink has none).
- `edges` [E + pad, 2]: the stacked (token, next state) layout of appendix A.1.1, so one read fetches
  both; a node's edges are contiguous and sorted by token. `pad` = the largest sparse branch factor
  rows of (0, 0), so the fixed-width read `row_ptr[s] + range(B_l)` never leaves the array. Such a
  read may run into the next node's (or the next level's) edges; `edge index < row_ptr[s + 1]` tells
  them apart, and a level whose codebook is smaller than a later level's clamps the tokens it reads
  (`clamps_tokens`).
- `max_branch` [L]: B_l = the most children of any level-l node (the golden example 12345, 12367,
  12890, 23456 gives (2, 1, 2, 2, 1)).
- Dense levels (d >= 1, appendix A.1.2): during the first d steps a beam's state is the flat
  mixed-radix index p of its prefix (p of prefix c_0..c_t = ((c_0 * T_1 + c_1) * T_2 + ...) ; the
  next prefix is p * T_t + token). Each dense level t takes the cheaper of two paths, chosen from its
  branch factor (`sparse_fraction`):
  - dense path (B_t close to T_t): `dense_bias[t]`, float32 over the prefixes of length t + 1, 0 where
    the prefix exists and -inf where not, so the level's mask is one row gather and one add (a bool
    mask costs a branchy `where` over [R, T] on CPUs); at t = d - 1, `dense_states`
    [prod_{l<d} T_l] gives the CSR state of each length-d prefix (0 when absent), read only for the
    chosen beams;
  - sparse path (B_t well below T_t): `child_tables[t]`, each length-t prefix's children padded to
    B_t slots ([prod_{l<t} T_l, B_t] int64 tokens and a float32 0 / -inf slot bias), so a beam's
    candidates are one row gather of tokens, one gather of log-probs and one add: no bounds, no
    branchy validity mask (at B_t in the hundreds those dominate a CSR read). The next state is
    p * T_t + token for t < d - 1; at t = d - 1 it is level_base[d] + first_child[p] + slot, since a
    prefix's children are consecutive level-d states in token order (then no `dense_states` table
    is kept).

d must be < L, and d >= 1 needs prod_{l<d} T_l <= `DENSE_MAX_ENTRIES` (2^28, 1 GiB of int32 states,
and as much again for the dense path's float32 bias):
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
# A dense level takes the sparse path when B_t <= SPARSE_FRACTION * T_t. Measured on one CPU thread
# (V = 2048, 140 rows, level 1 of d = 2; docs/results.md, issue 20): the child-table candidates plus a
# top-k over w * B_t beat the dense bias row plus a top-k over w * T_t below B_t of about 0.5 T_t
# (the level takes 0.76x the dense path's time at B_t = 0.24 T_t, 1.07x at 0.55 T_t, 1.49x at 0.93 T_t).
SPARSE_FRACTION = 0.5


@dataclass(frozen=True)
class ChildTable:
    """The sparse path of a dense level t: each length-t prefix's children, padded to B_t slots."""

    tokens: torch.Tensor  # [prod_{l<t} T_l, B_t] int64 (0 on padding)
    bias: torch.Tensor  # [prod_{l<t} T_l, B_t] float32: 0 on a child, -inf on padding
    first_child: torch.Tensor  # [prod_{l<t} T_l] int64: level-(t+1) nodes before p's children

    def to(self, device: torch.device | str) -> ChildTable:
        return ChildTable(self.tokens.to(device), self.bias.to(device), self.first_child.to(device))

    def nbytes(self) -> int:
        return _nbytes(self.tokens) + _nbytes(self.bias) + _nbytes(self.first_child)


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


@dataclass
class TransitionMatrix:
    codebook_sizes: tuple[int, ...]
    dense_levels: int
    row_ptr: torch.Tensor  # [S + 1] int32
    edges: torch.Tensor  # [E + pad, 2] int32: (token, next state)
    max_branch: tuple[int, ...]  # B_l per level l = 0..L-1
    dense_bias: list[torch.Tensor | None]  # t < d: float32 [prod_{l<=t} T_l] 0 / -inf, None if sparse path
    dense_states: torch.Tensor | None  # [prod_{l<d} T_l] int32 when level d - 1 takes the dense path
    child_tables: list[ChildTable | None]  # t < d: the sparse path's table, None if dense path
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

    def proposes_candidates(self, level: int) -> bool:
        """Whether beams get sparse candidates at `level` (every CSR level, and sparse-path dense ones)."""
        return level >= self.dense_levels or self.child_tables[level] is not None

    def clamps_tokens(self, level: int) -> bool:
        """Whether a fixed-width read at CSR `level` can return tokens outside its codebook: reads past
        a node's edges (or the sink's) reach later levels' edges, whose codebooks may be larger."""
        return level >= self.dense_levels and self.codebook_sizes[level] < max(
            self.codebook_sizes[self.dense_levels :]
        )

    def to(self, device: torch.device | str) -> TransitionMatrix:
        return TransitionMatrix(
            self.codebook_sizes,
            self.dense_levels,
            self.row_ptr.to(device),
            self.edges.to(device),
            self.max_branch,
            [None if b is None else b.to(device) for b in self.dense_bias],
            None if self.dense_states is None else self.dense_states.to(device),
            [None if c is None else c.to(device) for c in self.child_tables],
            self.nodes_per_level,
            self.num_items,
            self.level_base,
        )

    # --- memory (appendix B) ----------------------------------------------------------------
    def memory_bytes(self) -> dict[str, int]:
        csr = _nbytes(self.row_ptr) + _nbytes(self.edges)
        dense = (
            sum(_nbytes(b) for b in self.dense_bias)
            + _nbytes(self.dense_states)
            + sum(c.nbytes() for c in self.child_tables if c is not None)
        )
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


def build_transition_matrix(
    cset: ConstraintSet, dense_levels: int = 0, sparse_fraction: float = SPARSE_FRACTION
) -> TransitionMatrix:
    """Flatten the constraint set's trie into CSR + dense tables (see the module docstring).

    A dense level t takes the sparse path when B_t <= sparse_fraction * T_t (0: always dense,
    1: always sparse)."""
    sizes = tuple(cset.codebook_sizes)
    L, d = len(sizes), dense_levels
    check_dense_levels(sizes, d)
    codes = cset.codes  # sorted, unique (guaranteed by ConstraintSet)
    n = len(codes)
    if n == 0:
        raise ConstraintError(f"constraint set {cset.name!r} is empty")
    trie = _number_trie_nodes(codes, cset.name)
    row_ptr, edges, level_base = _csr_arrays(trie, d)
    if len(row_ptr) - 1 >= 2**31 or len(edges) >= 2**31:
        raise ConstraintError(f"constraint set {cset.name!r} is too large for int32 state ids")
    dense_bias, child_tables, dense_states = _dense_level_tables(trie, sizes, d, sparse_fraction, level_base)

    return TransitionMatrix(
        codebook_sizes=sizes,
        dense_levels=d,
        row_ptr=torch.from_numpy(row_ptr.astype(np.int32)),
        edges=torch.from_numpy(edges),
        max_branch=tuple(trie.max_branch),
        dense_bias=dense_bias,
        dense_states=dense_states,
        child_tables=child_tables,
        nodes_per_level=tuple(trie.nodes),
        num_items=n,
        level_base=tuple(level_base[level] for level in range(d, L)),
    )


@dataclass(frozen=True)
class _TrieNodes:
    """The constraint set's trie, numbered level by level from its sorted SID rows."""

    codes: np.ndarray  # [n, L] the sorted, unique SIDs
    node_of_row: list[np.ndarray]  # [l][i]: local id of row i's level-l node (level 0: the root, id 0)
    nodes: list[int]  # N_0..N_L
    child_rows: list[np.ndarray]  # [l]: the rows that begin a level-(l+1) node, in order
    max_branch: list[int]  # B_l per level l = 0..L-1


def _prefix_starts(codes: np.ndarray, name: str) -> np.ndarray:
    """starts[l][i]: row i begins a new prefix of length l + 1 (a new node at level l + 1)."""
    n, L = codes.shape
    starts = np.empty((L, n), dtype=bool)
    changed = np.zeros(n, dtype=bool)
    changed[0] = True
    for level in range(L):
        if n > 1:
            changed[1:] |= codes[1:, level] != codes[:-1, level]
        starts[level] = changed
    if n > 1 and not starts[L - 1, 1:].all():
        raise ConstraintError(f"constraint set {name!r} has duplicate SIDs (build it with ConstraintSet)")
    return starts


def _number_trie_nodes(codes: np.ndarray, name: str) -> _TrieNodes:
    """Each row's node at every level, the node counts, and each level's branch factor."""
    starts = _prefix_starts(codes, name)
    n, L = codes.shape
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
    return _TrieNodes(codes, node_of_row, nodes, child_rows, max_branch)


def _csr_arrays(trie: _TrieNodes, d: int) -> tuple[np.ndarray, np.ndarray, dict[int, int]]:
    """The CSR of sparse levels d..L-1: row_ptr (int64, [S + 1]), the padded int32 edges, and each
    sparse level's first state id (state 0 is the sink)."""
    codes, node_of_row, nodes, child_rows = trie.codes, trie.node_of_row, trie.nodes, trie.child_rows
    L = codes.shape[1]
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
    edges = _padded_edges(np.concatenate(tokens), np.concatenate(next_states), max(trie.max_branch[d:]))
    return row_ptr, edges, level_base


def _dense_level_tables(
    trie: _TrieNodes, sizes: tuple[int, ...], d: int, sparse_fraction: float, level_base: dict[int, int]
) -> tuple[list[torch.Tensor | None], list[ChildTable | None], torch.Tensor | None]:
    """Each dense level's path: its bias row (dense) or child table (sparse), and the CSR states of
    level d's nodes by prefix when level d - 1 takes the dense path."""
    codes, max_branch = trie.codes, trie.max_branch
    dense_bias: list[torch.Tensor | None] = []
    child_tables: list[ChildTable | None] = []
    dense_states = None
    for t in range(d):  # level t: prefixes of length t -> length t + 1
        rows = trie.child_rows[t]
        prefix = _mixed_radix(codes[rows, :t], sizes[:t])  # p of each child's parent
        child = prefix * sizes[t] + codes[rows, t]  # p of each child
        if max_branch[t] <= sparse_fraction * sizes[t]:
            child_tables.append(_child_table(prefix, codes[rows, t], math.prod(sizes[:t]), max_branch[t]))
            dense_bias.append(None)
            continue
        bias = np.full(math.prod(sizes[: t + 1]), -np.inf, dtype=np.float32)
        bias[child] = 0.0
        dense_bias.append(torch.from_numpy(bias))
        child_tables.append(None)
        if t == d - 1:
            table = np.zeros(math.prod(sizes[:d]), dtype=np.int32)
            table[child] = level_base[d] + trie.node_of_row[d][rows]  # the children's CSR states
            dense_states = torch.from_numpy(table)
    return dense_bias, child_tables, dense_states


def _mixed_radix(codes: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    """Flat index p of each row's prefix codes [n, t] (0 for the empty prefix)."""
    p = np.zeros(len(codes), dtype=np.int64)
    for level, size in enumerate(sizes):
        p = p * size + codes[:, level]
    return p


def _child_table(prefix: np.ndarray, tokens: np.ndarray, num_prefixes: int, branch: int) -> ChildTable:
    """ChildTable of one dense level from its children in lexicographic order (prefix p
    non-decreasing, tokens ascending within a prefix)."""
    counts = np.bincount(prefix, minlength=num_prefixes)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    slot = np.arange(len(prefix)) - first[prefix]
    table = np.zeros((num_prefixes, branch), dtype=np.int64)
    table[prefix, slot] = tokens
    bias = np.full((num_prefixes, branch), -np.inf, dtype=np.float32)
    bias[prefix, slot] = 0.0
    return ChildTable(torch.from_numpy(table), torch.from_numpy(bias), torch.from_numpy(first))


def _padded_edges(tokens: np.ndarray, next_states: np.ndarray, pad: int) -> np.ndarray:
    """Stacked (token, next state) int32 rows plus `pad` rows of (0, 0) for the fixed-width reads."""
    edges = np.zeros((len(tokens) + pad, 2), dtype=np.int32)
    edges[: len(tokens), 0] = tokens
    edges[: len(tokens), 1] = next_states
    return edges
