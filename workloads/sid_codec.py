"""Semantic-ID codec: SID codes <-> model token ids <-> one mixed-radix integer per SID.

A semantic ID (SID) is a tuple of L codes, code l drawn from a codebook of size T_l.

Token ids of our own models are level-offset: special tokens first, then the T_1 codes of level 1,
then the T_2 codes of level 2, and so on, so every (level, code) pair has its own token and a decoder
can restrict a step to one level by slicing a contiguous range of the vocabulary. An imported Hugging
Face checkpoint carries a `SIDTokenTable` instead (sid_table.py: LC-Rec adds its tokens in string
order, so a level's ids are neither contiguous nor in code order); the codec then answers every
token question through the table (`level_token_ids`, `level_of_token`, `code_of_token`, codes <->
tokens), and `level_range` / `level_offset` are only defined where a level happens to be contiguous.
Without a table the level-offset arithmetic is used unchanged.

The mixed-radix integer (NEZHA eq. 4) packs a SID into one int64,
    key = sum_l c_l * prod_{j > l} T_j,
which sorts SIDs lexicographically and makes set membership a searchsorted or hash lookup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from genrec.workloads.sid_table import NO_TOKEN, SIDTokenTable

# Special tokens. The NEZHA placeholder tokens <SP_1>..<SP_L> are reserved from the start so the
# vocabulary (and therefore a checkpoint's embedding table) does not change between decoders.
PAD, BOS, SEP = 0, 1, 2
NUM_FIXED_SPECIAL = 3


@dataclass(frozen=True)
class SIDCodec:
    codebook_sizes: tuple[int, ...]
    token_table: SIDTokenTable | None = None  # an imported checkpoint's ids; None: level-offset ids

    def __post_init__(self) -> None:
        sizes = tuple(int(t) for t in self.codebook_sizes)
        if self.token_table is not None and self.token_table.codebook_sizes != sizes:
            raise ValueError(
                f"codebook sizes {sizes} disagree with the SID token table's "
                f"{self.token_table.codebook_sizes}"
            )
        if not sizes:
            raise ValueError("a semantic ID needs at least one level (codebook_sizes is empty)")
        if any(t < 1 for t in sizes):
            raise ValueError(f"codebook sizes must be >= 1, got {sizes}")
        if math.prod(sizes) >= 2**63:
            raise ValueError(f"codebook sizes {sizes} overflow a 64-bit mixed-radix key")
        object.__setattr__(self, "codebook_sizes", sizes)

    @classmethod
    def from_table(cls, table: SIDTokenTable) -> SIDCodec:
        """The codec of an imported checkpoint whose SID tokens the table lists."""
        return cls(table.codebook_sizes, table)

    # --- shape -------------------------------------------------------------------------------
    @property
    def levels(self) -> int:
        return len(self.codebook_sizes)

    @property
    def is_level_offset(self) -> bool:
        """True for our own models' layout (no token table)."""
        return self.token_table is None

    @property
    def num_special(self) -> int:
        self._require_level_offset("special tokens (PAD, BOS, SEP, NEZHA placeholders)")
        return NUM_FIXED_SPECIAL + self.levels

    @property
    def vocab_size(self) -> int:
        if self.token_table is not None:
            return self.token_table.vocab_size
        return self.num_special + sum(self.codebook_sizes)

    @cached_property
    def table(self) -> SIDTokenTable:
        """The (level, code) -> token id table; for our layout, built from the level offsets."""
        if self.token_table is not None:
            return self.token_table
        return SIDTokenTable.level_offset(self.codebook_sizes, self.num_special, self.vocab_size)

    @property
    def num_sids(self) -> int:
        """Size of the full SID space, prod T_l."""
        return math.prod(self.codebook_sizes)

    def placeholder_token(self, level: int) -> int:
        """Token id of the NEZHA placeholder <SP_{level+1}> (level is 0-based)."""
        self._check_level(level)
        self._require_level_offset("NEZHA placeholder tokens")
        return NUM_FIXED_SPECIAL + level

    def level_offset(self, level: int) -> int:
        """First token id of `level` (0-based); for a token table only where the level is contiguous."""
        return self.level_range(level)[0]

    def level_range(self, level: int) -> tuple[int, int]:
        """Half-open token-id range [start, end) of `level` (0-based): id = start + code.

        A token table's level need not be one such range (LC-Rec's is not); asking for it then is a
        programming error in a decoder that has not moved to `level_token_ids` yet.
        """
        self._check_level(level)
        if self.token_table is None:
            start = self.num_special + sum(self.codebook_sizes[:level])
            return start, start + self.codebook_sizes[level]
        span = self.token_table.contiguous_range(level)
        if span is None:
            raise ValueError(
                f"level {level}'s SID tokens are not one contiguous id range in code order (an imported "
                "vocabulary); use codec.level_token_ids(level) instead of level_range"
            )
        return span

    def level_token_ids(self, level: int) -> np.ndarray:
        """[T_level] token ids of `level` (0-based), indexed by code; -1 for a code without a token (a gap
        in an imported vocabulary: never to be generated)."""
        self._check_level(level)
        if self.token_table is None:
            start, end = self.level_range(level)
            return np.arange(start, end, dtype=np.int64)
        return self.token_table.level_token_ids(level)

    def level_ids_tensor(self, level: int, device: torch.device | str) -> torch.Tensor:
        """level_token_ids as an int64 tensor on `device` (kept on the table: no copy per step)."""
        self._check_level(level)
        return self.table.level_ids_on(level, device)

    def level_tokens(self, level: int, codes: torch.Tensor) -> torch.Tensor:
        """Token ids of `codes` (any shape), all at `level`, to feed the model.

        A gap code of a table (no token) only reaches here on a dead beam (score -inf: a search wider
        than the level's codes); it is fed id 0, whose output no live beam reads."""
        if self.token_table is None:  # our layout: the offset, exactly as before tables existed
            return codes + self.level_offset(level)
        return self.level_ids_tensor(level, codes.device)[codes.long()].clamp(min=0).to(codes.dtype)

    def prefix_to_tokens(self, codes: torch.Tensor) -> torch.Tensor:
        """[..., t] codes of levels 0..t-1 (t <= L) -> token ids: a decided prefix fed to a model (a
        dead beam's gap codes as id 0, see level_tokens)."""
        t = codes.shape[-1]
        if self.token_table is None:
            offsets = torch.tensor([self.level_offset(l) for l in range(t)], device=codes.device)
            return codes + offsets
        return self.token_table.prefix_to_tokens(codes).clamp(min=0)

    def level_allowed_ids(self, level: int) -> np.ndarray:
        """The token ids a decoder may produce at `level`: level_token_ids without a table's gaps (-1)."""
        ids = self.level_token_ids(level)
        return ids if self.token_table is None else ids[ids >= 0]

    def level_of_token(self, tokens: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """The SID level (0-based) of each token id; -1 for an id that is no SID token."""
        return self.table.level_of_token(tokens)

    def code_of_token(self, tokens: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """The SID code of each token id; -1 for an id that is no SID token."""
        return self.table.code_of_token(tokens)

    def _check_level(self, level: int) -> None:
        if not 0 <= level < self.levels:
            raise IndexError(f"level {level} out of range for {self.levels} levels")

    def _require_level_offset(self, what: str) -> None:
        if self.token_table is not None:
            raise ValueError(f"{what}: an imported vocabulary (SID token table) has none of ours")

    # --- codes <-> tokens ----------------------------------------------------------------------
    def offsets(self) -> np.ndarray:
        return np.array([self.level_offset(l) for l in range(self.levels)], dtype=np.int64)

    def validate_codes(self, codes: np.ndarray, what: str = "semantic IDs") -> np.ndarray:
        """Check an [N, L] array of codes against the codebook sizes; returns it as int64."""
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[1] != self.levels:
            raise ValueError(
                f"{what}: expected shape [N, {self.levels}] (one code per level), got {list(codes.shape)}"
            )
        codes = codes.astype(np.int64, copy=False)
        sizes = np.array(self.codebook_sizes, dtype=np.int64)
        bad = (codes < 0) | (codes >= sizes)
        if bad.any():
            row, level = map(int, np.argwhere(bad)[0])
            raise ValueError(
                f"{what}: row {row} level {level} has code {int(codes[row, level])}, "
                f"outside the codebook [0, {self.codebook_sizes[level]})"
            )
        return codes

    def codes_to_tokens(self, codes: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """[..., L] codes -> [..., L] token ids (no range check; use validate_codes on input data)."""
        if self.token_table is not None:
            return self.token_table.codes_to_tokens(codes)
        if isinstance(codes, torch.Tensor):
            return codes + torch.as_tensor(self.offsets(), device=codes.device, dtype=codes.dtype)
        return np.asarray(codes, dtype=np.int64) + self.offsets()

    def tokens_to_codes(self, tokens: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """[..., L] token ids -> codes (a table gives -1 for an id that is no SID token)."""
        if self.token_table is not None:
            return self.token_table.tokens_to_codes(tokens)
        if isinstance(tokens, torch.Tensor):
            return tokens - torch.as_tensor(self.offsets(), device=tokens.device, dtype=tokens.dtype)
        return np.asarray(tokens, dtype=np.int64) - self.offsets()

    # --- codes <-> mixed-radix keys -------------------------------------------------------------
    def radix_weights(self) -> np.ndarray:
        """w_l = prod_{j > l} T_j, so key = codes @ w."""
        w = np.ones(self.levels, dtype=np.int64)
        for l in range(self.levels - 2, -1, -1):
            w[l] = w[l + 1] * self.codebook_sizes[l + 1]
        return w

    def codes_to_keys(self, codes: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        w = self.radix_weights()
        if isinstance(codes, torch.Tensor):
            return (codes.to(torch.int64) * torch.as_tensor(w, device=codes.device)).sum(-1)
        return (np.asarray(codes, dtype=np.int64) * w).sum(-1)

    def keys_to_codes(self, keys: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        w = self.radix_weights()
        sizes = np.array(self.codebook_sizes, dtype=np.int64)
        if isinstance(keys, torch.Tensor):
            wt = torch.as_tensor(w, device=keys.device)
            st = torch.as_tensor(sizes, device=keys.device)
            return (keys.to(torch.int64).unsqueeze(-1) // wt) % st
        keys = np.asarray(keys, dtype=np.int64)
        return (keys[..., None] // w) % sizes

    # --- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        if self.token_table is None:  # our checkpoints' stored form is unchanged
            return {"codebook_sizes": list(self.codebook_sizes)}
        return {"codebook_sizes": list(self.codebook_sizes), "token_table": self.token_table.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> SIDCodec:
        table = d.get("token_table")
        return cls(tuple(d["codebook_sizes"]), None if table is None else SIDTokenTable.from_dict(table))


def codec_with_gaps_of(codec: SIDCodec, table: SIDTokenTable) -> SIDCodec:
    """`codec` (one of our level-offset drafts) with the codes `table` has no token for removed: the
    codec an AtSpeed draft of ours scores with beside an imported target (its token ids, the target's
    code space). A code without a token in the target can never be in its beams, so the draft must not
    spend a beam on it either (it scores -inf, as in the target). Without gaps: `codec` unchanged."""
    if codec.codebook_sizes != table.codebook_sizes:
        raise ValueError(
            f"codebook sizes {codec.codebook_sizes} differ from the table's {table.codebook_sizes}"
        )
    if not table.has_gaps:
        return codec
    own = codec.table
    ids = tuple(
        tuple(NO_TOKEN if theirs == NO_TOKEN else mine for mine, theirs in zip(own.ids[l], table.ids[l]))
        for l in range(codec.levels)
    )
    return SIDCodec(codec.codebook_sizes, SIDTokenTable(ids, codec.vocab_size))


def resolve_collisions(codes: np.ndarray) -> tuple[np.ndarray, dict]:
    """Append a disambiguation level so every item gets a distinct SID (as TIGER does).

    Items that share the same L codes get 0, 1, 2, ... in an extra level, in input order; unique
    items get 0. The new level's codebook size is the largest collision group. Returns the
    [N, L+1] codes and statistics for the manifest.
    """
    codes = np.asarray(codes, dtype=np.int64)
    if codes.ndim != 2:
        raise ValueError(f"expected [N, L] codes, got shape {list(codes.shape)}")
    n = codes.shape[0]
    _, inverse, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    # rank of each item within its group, in input order (stable sort keeps input order)
    order = np.argsort(inverse, kind="stable")
    group_start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank_sorted = np.arange(n) - group_start[inverse[order]]
    extra = np.empty(n, dtype=np.int64)
    extra[order] = rank_sorted
    stats = {
        "items": int(n),
        "distinct_before": int(len(counts)),
        "colliding_items": int(counts[counts > 1].sum()),
        "collision_groups": int((counts > 1).sum()),
        "max_group_size": int(counts.max()) if n else 0,
    }
    return np.concatenate([codes, extra[:, None]], axis=1), stats


def codebook_utilisation(codes: np.ndarray, codebook_sizes: tuple[int, ...]) -> list[float]:
    """Fraction of each level's codebook that at least one item uses."""
    codes = np.asarray(codes)
    return [len(np.unique(codes[:, l])) / t for l, t in enumerate(codebook_sizes)]


def ensure_unique_sids(
    codes: np.ndarray, codebook_sizes: tuple[int, ...]
) -> tuple[np.ndarray, tuple[int, ...], dict]:
    """Return codes with distinct rows: unchanged if already unique, else with a disambiguation level.

    The returned stats always say what happened, so manifests record it either way.
    """
    extended, stats = resolve_collisions(codes)
    if stats["colliding_items"] == 0:
        stats["disambiguation_level"] = False
        return np.asarray(codes, dtype=np.int64), tuple(codebook_sizes), stats
    stats["disambiguation_level"] = True
    return extended, (*codebook_sizes, stats["max_group_size"]), stats
