"""Sorted mixed-radix keys of every valid SID prefix: the set NEZHA verifies drafts against.

Built once per catalogue (ItemIndex.prefix_sets) on the decoding device, so a membership test is
one searchsorted and a per-beam child mask is one table row.
"""

from __future__ import annotations

import torch

from genrec.workloads.sid_codec import SIDCodec

NEG_INF = float("-inf")


class PrefixKeySets:
    """Sorted int64 keys of every valid SID prefix, one tensor per level, on the index's device.

    With the codec's big-endian mixed radix, the key of a SID's first l+1 codes is its full key
    integer-divided by prod_{j > l} T_j, and it grows step by step as key * T_{l+1} + code. The last
    level's tensor is the valid-SID set itself (`keys`, sorted).
    """

    def __init__(self, codec: SIDCodec, keys: torch.Tensor, max_child_table: int = 1 << 26) -> None:
        self.codec = codec
        w = self.codec.radix_weights()
        self.level_keys = [torch.unique(keys // int(w[l])) for l in range(self.codec.levels - 1)] + [keys]
        # child_tables[l][r, c]: whether valid prefix r of level l-1 (its rank in level_keys[l-1]; the
        # empty prefix for l = 0) extends by code c to a valid level-l prefix. One row per beam
        # replaces T_l searches per beam at every step; None where the table would exceed
        # max_child_table entries (the search is used there).
        self.child_tables: list[torch.Tensor | None] = []
        for level, t in enumerate(self.codec.codebook_sizes):
            parents = self.level_keys[level - 1] if level else keys.new_zeros(1)
            if len(parents) * t > max_child_table:
                self.child_tables.append(None)
                continue
            table = torch.zeros(len(parents), t, dtype=torch.bool, device=keys.device)
            children = self.level_keys[level]
            rows = torch.searchsorted(parents, children // t) if level else torch.zeros_like(children)
            table[rows, children % t] = True
            self.child_tables.append(table)

    def contains(self, level: int, prefix_keys: torch.Tensor) -> torch.Tensor:
        """Bool tensor: whether each prefix key (of codes 0..level) is a valid prefix."""
        table = self.level_keys[level]
        if len(table) == 0:
            return torch.zeros_like(prefix_keys, dtype=torch.bool)
        pos = torch.searchsorted(table, prefix_keys).clamp(max=len(table) - 1)
        return table[pos] == prefix_keys

    def valid_children(self, level: int, parent_keys: torch.Tensor) -> torch.Tensor:
        """[..., T_level] bool: which codes extend each parent prefix (codes 0..level-1) validly.

        Equal to contains(level, parent * T_level + code) for every code; a parent that is not a
        valid prefix has no valid child.
        """
        t = self.codec.codebook_sizes[level]
        table = self.child_tables[level]
        if table is None:
            codes = torch.arange(t, device=parent_keys.device)
            return self.contains(level, parent_keys[..., None] * t + codes)
        if level == 0:
            return table[0].expand(*parent_keys.shape, t)
        parents = self.level_keys[level - 1]
        if len(parents) == 0:
            return torch.zeros(*parent_keys.shape, t, dtype=torch.bool, device=parent_keys.device)
        rank = torch.searchsorted(parents, parent_keys).clamp(max=len(parents) - 1)
        return table[rank] & (parents[rank] == parent_keys)[..., None]

    def mask_invalid_children(
        self, level: int, parent_keys: torch.Tensor, logp: torch.Tensor
    ) -> torch.Tensor:
        """logp [..., T_level] with -inf where a code does not extend its parent validly.

        The per-step check of verify="every", cheaper than masking with valid_children: it skips the
        parent's own membership test, so each parent must be a valid prefix. Every beam of the head
        search is one, except beams whose score is already -inf; their rows may come out unmasked,
        which cannot revive them."""
        table = self.child_tables[level]
        if table is not None and level == 0:  # one parent, the empty prefix: broadcast its row
            return logp.masked_fill(~table[0], NEG_INF)
        if table is None or len(self.level_keys[level - 1]) == 0:
            return logp.masked_fill(~self.valid_children(level, parent_keys), NEG_INF)
        parents = self.level_keys[level - 1]
        # right=True - 1 is the parent's own rank; for a key below every parent it is -1 (a real row)
        rank = torch.searchsorted(parents, parent_keys, right=True) - 1
        return logp.masked_fill(~table[rank], NEG_INF)
