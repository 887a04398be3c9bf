"""SID token table: (level, code) -> token id, for vocabularies whose SID tokens are not level-offset.

Our own models put level l's codes in one contiguous id range (sid_codec.py). A Hugging Face checkpoint
extended with SID tokens does not: LC-Rec adds every `<x_N>` string of the item index in sorted string
order, so `<a_10>` gets a smaller id than `<a_2>`, and other frameworks interleave levels or add tokens
in a different order. The table is the one place that knows the mapping; every question a decoder asks
(the ids allowed at a level, the level and code of an id, codes <-> ids of whole SIDs) goes through it.

Codes keep their meaning (code c of level l is the c in the token `<x_c>`), so the items' codes, the
datasets imported from the same index and the mixed-radix keys of sid_codec.py all agree. A level's
codebook is 0..T_l - 1 with T_l = largest code + 1; a code without a token (a gap) has id NO_TOKEN (-1).
Gaps are normal for LC-Rec, which adds only the tokens that some item uses (the Beauty index uses 91
of 256 first-level codes); elsewhere the table builder refuses them unless the pattern allows them
(tokenize/sid_tokens.py). A gap code can never be generated: `level_token_ids` reports it as -1, and the
scorers and HF's allowed-token masks give it no probability (tokenize/level_scores.py, hf_beam.py).
The reverse maps (`level_of`, `code_of`) are arrays over the whole id space, -1 for ids that are no SID
token, so a lookup is one gather in numpy or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from genrec.workloads.errors import UserInputError

NO_TOKEN = -1  # the id of a code that has no token (a gap)


@dataclass(frozen=True)
class SIDTokenTable:
    """`ids[l][c]` is the token id of code c at level l (0-based), NO_TOKEN for a gap; ids < vocab_size."""

    ids: tuple[tuple[int, ...], ...]
    vocab_size: int
    # derived lookups, built once in __post_init__ (not part of equality or the stored form)
    _matrix: np.ndarray = field(init=False, repr=False, compare=False)
    _level_of: np.ndarray = field(init=False, repr=False, compare=False)
    _code_of: np.ndarray = field(init=False, repr=False, compare=False)
    _on_device: dict = field(init=False, repr=False, compare=False)  # (level, device) -> ids tensor

    def __post_init__(self) -> None:
        ids = tuple(tuple(int(t) for t in level) for level in self.ids)
        if not ids or any(max(level, default=NO_TOKEN) == NO_TOKEN for level in ids):
            raise ValueError("a SID token table needs at least one level, each with at least one token")
        flat = np.fromiter((t for level in ids for t in level if t != NO_TOKEN), dtype=np.int64)
        if flat.min() < 0 or flat.max() >= self.vocab_size:
            raise ValueError(
                f"SID token ids must lie in [0, {self.vocab_size}), got {flat.min()}..{flat.max()}"
            )
        if len(np.unique(flat)) != len(flat):
            raise ValueError(
                "a token id appears twice in the SID token table; each (level, code) needs its own"
            )
        matrix = np.full((len(ids), max(len(level) for level in ids)), -1, dtype=np.int64)
        level_of = np.full(self.vocab_size, -1, dtype=np.int64)
        code_of = np.full(self.vocab_size, -1, dtype=np.int64)
        for l, level in enumerate(ids):
            row = np.asarray(level, dtype=np.int64)
            matrix[l, : len(row)] = row
            present = np.flatnonzero(row != NO_TOKEN)
            level_of[row[present]] = l
            code_of[row[present]] = present
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "vocab_size", int(self.vocab_size))
        object.__setattr__(self, "_matrix", matrix)
        object.__setattr__(self, "_level_of", level_of)
        object.__setattr__(self, "_code_of", code_of)
        object.__setattr__(self, "_on_device", {})

    @classmethod
    def level_offset(cls, codebook_sizes: tuple[int, ...], first_id: int, vocab_size: int) -> SIDTokenTable:
        """Our own layout: level l's codes at first_id + sum(T_<l) + code."""
        starts = np.concatenate([[0], np.cumsum(codebook_sizes)[:-1]]) + first_id
        return cls(tuple(tuple(range(s, s + t)) for s, t in zip(starts.tolist(), codebook_sizes)), vocab_size)

    # --- shape -------------------------------------------------------------------------------
    @property
    def levels(self) -> int:
        return len(self.ids)

    @property
    def codebook_sizes(self) -> tuple[int, ...]:
        return tuple(len(level) for level in self.ids)

    @property
    def has_gaps(self) -> bool:
        return any(NO_TOKEN in level for level in self.ids)

    def level_token_ids(self, level: int) -> np.ndarray:
        """[T_level] token ids of `level`, indexed by code (a copy); NO_TOKEN (-1) at a gap."""
        return np.asarray(self.ids[level], dtype=np.int64)

    def level_ids_on(self, level: int, device: torch.device | str) -> torch.Tensor:
        """level_token_ids as an int64 tensor on `device`, made once per (level, device) and kept: the
        scorers gather at it every step, so it must not be copied to the device each time."""
        key = (level, str(torch.device(device)))
        if key not in self._on_device:
            self._on_device[key] = torch.as_tensor(self._matrix[level, : len(self.ids[level])], device=device)
        return self._on_device[key]

    def level_present_ids(self, level: int) -> np.ndarray:
        """The level's token ids without the gaps: the tokens a decoder may produce at this level."""
        row = self.level_token_ids(level)
        return row[row != NO_TOKEN]

    def contiguous_range(self, level: int) -> tuple[int, int] | None:
        """[start, end) when the level's ids are start + code for every code (no gap), else None."""
        row = self.ids[level]
        start = row[0]
        return (start, start + len(row)) if row == tuple(range(start, start + len(row))) else None

    # --- lookups -----------------------------------------------------------------------------
    def matrix(self, like: torch.Tensor | None = None) -> np.ndarray | torch.Tensor:
        """[L, T_max] token ids (-1 past a level's codebook), as a tensor on `like`'s device if given."""
        return self._matrix if like is None else torch.as_tensor(self._matrix, device=like.device)

    def prefix_to_tokens(self, codes: torch.Tensor) -> torch.Tensor:
        """[..., t] codes of levels 0..t-1 (t <= L) -> their token ids (NO_TOKEN at a gap)."""
        t = codes.shape[-1]
        m = torch.as_tensor(self._matrix[:t], device=codes.device)
        return m[torch.arange(t, device=codes.device), codes.long()].to(codes.dtype)

    def codes_to_tokens(self, codes: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """[..., L] codes -> [..., L] token ids, NO_TOKEN for a gap (no range check: see check_item_codes)."""
        levels = np.arange(self.levels)
        if isinstance(codes, torch.Tensor):
            m = torch.as_tensor(self._matrix, device=codes.device)
            lv = torch.as_tensor(levels, device=codes.device)
            return m[lv, codes.long()].to(codes.dtype)
        return self._matrix[levels, np.asarray(codes, dtype=np.int64)]

    def tokens_to_codes(self, tokens: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """[..., L] token ids -> codes; an id that is no SID token gives -1 (see level_of_token)."""
        return self.code_of_token(tokens)

    def level_of_token(self, tokens: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """The SID level of each id, -1 where the id is no SID token."""
        return self._lookup(self._level_of, tokens)

    def code_of_token(self, tokens: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """The SID code of each id, -1 where the id is no SID token."""
        return self._lookup(self._code_of, tokens)

    @staticmethod
    def _lookup(table: np.ndarray, tokens: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        if isinstance(tokens, torch.Tensor):
            return torch.as_tensor(table, device=tokens.device)[tokens.long()].to(tokens.dtype)
        return table[np.asarray(tokens, dtype=np.int64)]

    # --- checks against other inputs ------------------------------------------------------------
    def check_item_codes(self, codes: np.ndarray, where: str = "items file") -> None:
        """Every item's SID needs a token at each level (else a UserInputError naming the first item)."""
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[1] != self.levels:
            have = codes.shape[1] if codes.ndim == 2 else "?"
            raise UserInputError(
                f"{where}: items have {have} SID levels, the checkpoint's tokenizer has {self.levels}; "
                "use the items file the checkpoint was trained with"
            )
        sizes = np.asarray(self.codebook_sizes, dtype=np.int64)
        bad = (codes < 0) | (codes >= sizes)
        if not bad.any() and self.has_gaps:
            bad = self.codes_to_tokens(codes) == NO_TOKEN
        if bad.any():
            row, level = map(int, np.argwhere(bad)[0])
            code = int(codes[row, level])
            have = f"codes 0..{sizes[level] - 1} only" if not 0 <= code < sizes[level] else "other codes only"
            raise UserInputError(
                f"{where}: item row {row} has code {code} at level {level}, but the tokenizer has SID tokens "
                f"for {have}; use the items file the checkpoint was trained with"
            )

    # --- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"vocab_size": self.vocab_size, "ids": [list(level) for level in self.ids]}

    @classmethod
    def from_dict(cls, d: dict) -> SIDTokenTable:
        return cls(tuple(tuple(level) for level in d["ids"]), int(d["vocab_size"]))
