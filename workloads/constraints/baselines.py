"""Baseline constraint backends, each with StaticMask's interface:

    init_state(rows, device) -> state; mask(level, state, log_probs) -> (bool [R, T_level], aux);
    advance(level, state, aux, parent, token) -> state; memory_bytes() -> int.

- `CpuTrie`: the trie on the host (CSR arrays in numpy); every step copies the beams' states to the
  host, walks each beam's node in a Python loop, and copies the mask back (the host round trip).
- `PPVExact`: per level a sorted int64 array of (parent rank * T_l + token) keys, one per trie edge;
  a binary search (searchsorted) for every vocabulary token of every beam, O(T log |C|) per beam.
  A beam's state is its prefix's rank among the level's prefixes (= the search position).
- `PPVApprox`: the same search for the top-`top_n` tokens of each beam only (50, as in Ye et al.);
  every other token is masked. Compliant, but may miss valid completions.
- `HashBitmap`: every trie prefix hashed into a bitmap (int32 words, one hash function); a token is
  allowed when the hash of (prefix, token) hits a set bit. False positives are possible, so decoded
  SIDs can fall outside the set: measure the rate (`false_positive_rate`), never assume zero.
"""

from __future__ import annotations

import numpy as np
import torch

from genrec.workloads.constraints.backend import BoolMaskBackend
from genrec.workloads.constraints.sets import ConstraintSet
from genrec.workloads.constraints.transition import build_transition_matrix

HASH_MASK = 2**31 - 1  # hashes stay below 2^31, so h * HASH_MUL stays inside int64
HASH_MUL = 1_000_003
HASH_MUL2 = 1_640_531_527  # odd, ~2^31 / golden ratio: spreads hashes into the high bits
HASH_LEVEL = 97_531


def _level_ranks(codes: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
    """Per level l: for the level-(l+1) nodes in order, their parent's rank and token; node counts."""
    n, L = codes.shape
    changed = np.zeros(n, dtype=bool)
    changed[0] = True
    parent_rank = np.zeros(n, dtype=np.int64)
    parents, tokens, counts = [], [], [1]
    for level in range(L):
        if n > 1:
            changed[1:] |= codes[1:, level] != codes[:-1, level]
        rows = np.flatnonzero(changed)
        parents.append(parent_rank[rows])
        tokens.append(codes[rows, level].astype(np.int64))
        parent_rank = np.cumsum(changed) - 1
        counts.append(len(rows))
    return parents, tokens, counts


class CpuTrie(BoolMaskBackend):
    name = "cpu_trie"

    def __init__(self, cset: ConstraintSet, device: torch.device | str = "cpu") -> None:
        tm = build_transition_matrix(cset, 0)
        self.row_ptr = tm.row_ptr.numpy().astype(np.int64)
        self.tok = tm.edges[:, 0].numpy().copy()
        self.nxt = tm.edges[:, 1].numpy().copy()
        self.sizes = cset.codebook_sizes
        self.device = torch.device(device)

    def init_state(self, rows: int, device: torch.device) -> torch.Tensor:
        return torch.ones(rows, dtype=torch.int64, device=device)

    def mask(self, level: int, state: torch.Tensor, log_probs: torch.Tensor | None = None):
        host = state.cpu().numpy()  # device -> host
        out = np.zeros((len(host), self.sizes[level]), dtype=bool)
        kids = []
        for r, s in enumerate(host.tolist()):  # pointer chasing, one beam at a time
            lo, hi = self.row_ptr[s], self.row_ptr[s + 1]
            toks = self.tok[lo:hi]
            out[r, toks] = True
            kids.append((toks, self.nxt[lo:hi]))
        return torch.from_numpy(out).to(state.device), kids  # host -> device

    def advance(self, level, state, aux, parent, token):
        new = []
        for p, t in zip(parent.cpu().tolist(), token.cpu().tolist()):
            toks, nxt = aux[p]
            i = int(np.searchsorted(toks, t))
            new.append(int(nxt[i]) if i < len(toks) and toks[i] == t else 0)
        return torch.tensor(new, dtype=torch.int64, device=state.device)

    def memory_bytes(self) -> int:
        return self.row_ptr.nbytes + self.tok.nbytes + self.nxt.nbytes


class PPVExact(BoolMaskBackend):
    name = "ppv_exact"

    def __init__(self, cset: ConstraintSet, device: torch.device | str = "cpu") -> None:
        parents, tokens, _ = _level_ranks(cset.codes)
        self.sizes = cset.codebook_sizes
        self.keys = [
            torch.from_numpy(p * t + tok).to(device) for p, tok, t in zip(parents, tokens, self.sizes)
        ]  # sorted: nodes are in lexicographic order

    def init_state(self, rows: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(rows, dtype=torch.int64, device=device)

    def _search(
        self, level: int, state: torch.Tensor, cand: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys = self.keys[level]
        q = state[:, None] * self.sizes[level] + cand  # sink state -1 gives negative keys: never found
        pos = torch.searchsorted(keys, q).clamp_(max=len(keys) - 1)
        return keys[pos] == q, pos

    def mask(self, level: int, state: torch.Tensor, log_probs: torch.Tensor | None = None):
        cand = torch.arange(self.sizes[level], device=state.device)[None]
        ok, pos = self._search(level, state, cand)
        return ok, torch.where(ok, pos, -1)

    def advance(self, level, state, aux, parent, token):
        return aux[parent, token]

    def memory_bytes(self) -> int:
        return sum(k.numel() * 8 for k in self.keys)


class PPVApprox(PPVExact):
    name = "ppv_approx"

    def __init__(self, cset: ConstraintSet, device: torch.device | str = "cpu", top_n: int = 50) -> None:
        super().__init__(cset, device)
        self.top_n = top_n

    def mask(self, level: int, state: torch.Tensor, log_probs: torch.Tensor | None = None):
        if log_probs is None:
            raise ValueError("ppv_approx needs the step's log-probabilities to pick its top tokens")
        top = log_probs.topk(min(self.top_n, self.sizes[level]), dim=-1).indices
        ok, pos = self._search(level, state, top)
        mask = torch.zeros(state.shape[0], self.sizes[level] + 1, dtype=torch.bool, device=state.device)
        mask.scatter_(1, torch.where(ok, top, self.sizes[level]), True)
        return mask[:, :-1], (top, torch.where(ok, pos, -1))

    def advance(self, level, state, aux, parent, token):
        top, pos = aux
        hit = top[parent] == token[:, None]
        return torch.where(hit, pos[parent], -1).amax(dim=1)


class HashBitmap(BoolMaskBackend):
    name = "hash_bitmap"

    def __init__(
        self, cset: ConstraintSet, device: torch.device | str = "cpu", bits_per_prefix: int = 32
    ) -> None:
        self.sizes = cset.codebook_sizes
        codes = cset.codes.astype(np.int64)
        n_prefix = 0
        hashes = []
        h = np.zeros(len(codes), dtype=np.int64)
        for level in range(len(self.sizes)):
            h = self._mix(h, codes[:, level], level)
            hashes.append(np.unique(h))
            n_prefix += len(hashes[-1])
        self.log_bits = min(31, max(5, int(np.ceil(np.log2(max(1, n_prefix * bits_per_prefix))))))
        bits = 1 << self.log_bits
        words = np.zeros(bits // 32, dtype=np.int64)
        for hs in hashes:
            b = self._bit(hs)
            np.bitwise_or.at(words, b >> 5, np.left_shift(1, b & 31))
        self.bits = bits
        self.words = torch.from_numpy(words.astype(np.uint32).view(np.int32)).to(device)

    @staticmethod
    def _mix(h, tok, level: int):
        """Hash of a prefix extended by `tok` (numpy or torch int64; only multiply, xor, and, shift)."""
        h = ((h * HASH_MUL) ^ (tok + 1 + level * HASH_LEVEL)) & HASH_MASK
        return h ^ (h >> 13)

    def _bit(self, h):
        return ((h * HASH_MUL2) & HASH_MASK) >> (31 - self.log_bits)

    def init_state(self, rows: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(rows, dtype=torch.int64, device=device)

    def mask(self, level: int, state: torch.Tensor, log_probs: torch.Tensor | None = None):
        tok = torch.arange(self.sizes[level], device=state.device)[None]
        h = self._mix(state[:, None], tok, level)  # [R, T]: the hash of every extension
        b = self._bit(h)
        hit = (self.words[b >> 5] >> (b & 31).to(torch.int32)) & 1
        return hit.bool(), h

    def advance(self, level, state, aux, parent, token):
        return aux[parent, token]

    def memory_bytes(self) -> int:
        return self.words.numel() * 4


BASELINES = {c.name: c for c in (CpuTrie, PPVExact, PPVApprox, HashBitmap)}
