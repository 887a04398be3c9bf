"""The KV cache that decoders drive through GRTransformer (prefill -> expand -> extend/step -> reorder,
keep/truncate); see transformer.py for the calls.

The prompt's keys/values are stored once per user, not once per beam: a decode step attends to
the shared prompt cache and to the beam's own (short) cache through a named attention backend
(genrec.kernels.shared_prefix_attention: two stages merged by online softmax). Reordering beams
therefore copies only the few decoded steps, never the prompt (the layout xGR describes).
`expand(..., indexed=True)` goes further (xGR's in-place reorder): decoded steps stay where they were
written and `reorder` only updates a per-step row table ([B*W, T] ints, shared by all layers); the
attention reads each step through it (a Triton backend that takes `beam_rows` gathers while loading,
any other backend gets the steps gathered per layer first).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class KVCache:
    """Prompt cache shared by a user's beams + a per-beam cache of decoded steps.

    prefix_k/v[layer]: [B, Hkv, S, hd]    one copy per user (Hkv: key/value heads, GQA)
    prefix_mask:       [B, S] bool        real (non-pad) prompt tokens
    prefix_len:        [B] long           real prompt tokens = position of the first decoded token
    beam_k/v[layer]:   [B*W, Hkv, T, hd]  T = capacity in decoded steps; row b*W + j is beam j of user b
    beam_rows:         [B*W, T] long      indexed layout only (None: copying layout): decoded step t of
                                          row r lives in storage row beam_rows[r, t], at slot t
    """

    prefix_k: list[Tensor]
    prefix_v: list[Tensor]
    prefix_mask: Tensor
    prefix_len: Tensor
    beams: int = 1
    steps: int = 0
    beam_k: list[Tensor] = field(default_factory=list)
    beam_v: list[Tensor] = field(default_factory=list)
    beam_rows: Tensor | None = None

    @property
    def batch(self) -> int:
        return self.prefix_mask.shape[0]

    @property
    def rows(self) -> int:
        return self.batch * self.beams

    def prompt_of(self, users: Tensor | None = None) -> KVCache:
        """The prompt part alone (no decoded steps) for `users` (indices; None = all, not copied)."""
        if users is None:
            return KVCache(self.prefix_k, self.prefix_v, self.prefix_mask, self.prefix_len)
        pick = [t.index_select(0, users) for t in (*self.prefix_k, *self.prefix_v)]
        n = len(self.prefix_k)
        return KVCache(pick[:n], pick[n:], self.prefix_mask[users], self.prefix_len[users])

    def expand(
        self,
        beams: int,
        max_steps: int,
        indexed: bool = False,
        storage: tuple[list[Tensor], list[Tensor], Tensor] | None = None,
    ) -> KVCache:
        """A cache with `beams` rows per user and room for `max_steps` decoded tokens.

        The prompt part is shared, not copied. Any steps already decoded are repeated per beam.
        `indexed` selects the in-place reorder layout (`reorder` records parents in `beam_rows` instead
        of copying steps). `storage` = (beam_k, beam_v, beam_rows) lends preallocated tensors of the
        right shapes (buffer reuse across requests; rows beyond what is written are never read).
        """
        if beams < 1 or max_steps < self.steps:
            raise ValueError(f"expand needs beams >= 1 and max_steps >= {self.steps}")
        if self.steps and beams % self.beams:
            raise ValueError(f"cannot expand {self.beams} beams with decoded steps to {beams} beams")
        rows = self.batch * beams
        new_k, new_v = [], []
        for layer, pk in enumerate(self.prefix_k):
            shape = (rows, pk.shape[1], max_steps, pk.shape[3])
            if storage is None:
                bk, bv = pk.new_zeros(shape), pk.new_zeros(shape)
            else:
                bk, bv = storage[0][layer], storage[1][layer]
                if bk.shape != shape or bv.shape != shape:
                    raise ValueError(f"lent storage {list(bk.shape)} does not match {list(shape)}")
            if self.steps:
                rep = beams // self.beams
                bk[:, :, : self.steps] = self._steps_of(self.beam_k[layer]).repeat_interleave(rep, dim=0)
                bv[:, :, : self.steps] = self._steps_of(self.beam_v[layer]).repeat_interleave(rep, dim=0)
            new_k.append(bk)
            new_v.append(bv)
        table = None
        if indexed:
            table = storage[2] if storage is not None else None
            if table is None or table.shape != (rows, max_steps):
                table = torch.empty(rows, max_steps, dtype=torch.long, device=self.prefix_mask.device)
            table.copy_(torch.arange(rows, device=table.device)[:, None].expand(rows, max_steps))
        return KVCache(
            self.prefix_k,
            self.prefix_v,
            self.prefix_mask,
            self.prefix_len,
            beams,
            self.steps,
            new_k,
            new_v,
            table,
        )

    def reorder(self, parent: Tensor) -> None:
        """Row i takes the decoded steps of row parent[i] (flat indices into B*W), in place.

        Indexed layout: only the [B*W, steps] row table is permuted (one small int gather for all
        layers); the steps' keys and values never move."""
        if self.steps == 0:
            return
        t = self.steps
        if self.beam_rows is not None:
            self.beam_rows[:, :t] = self.beam_rows[:, :t].index_select(0, parent)
            return
        for k, v in zip(self.beam_k, self.beam_v):
            k[:, :, :t] = k[:, :, :t].index_select(0, parent)
            v[:, :, :t] = v[:, :, :t].index_select(0, parent)

    def _steps_of(self, storage: Tensor, end: int | None = None, index: Tensor | None = None) -> Tensor:
        """Decoded steps [0, end) (default: all) of every row of one layer's storage, resolved through
        `beam_rows` in the indexed layout (`index`: a precomputed beam_step_index)."""
        end = self.steps if end is None else end
        if self.beam_rows is None:
            return storage[:, :, :end]
        return gather_beam_steps(storage, self.beam_rows[:, :end], index)

    def materialize(self) -> None:
        """Indexed layout: copy every row's steps into its own storage row and reset the table to the
        identity (what `keep` needs, since it moves steps between slots)."""
        if self.beam_rows is None:
            return
        t = self.steps
        if t:
            for k, v in zip(self.beam_k, self.beam_v):
                k[:, :, :t], v[:, :, :t] = self._steps_of(k), self._steps_of(v)
        self.beam_rows.copy_(
            torch.arange(self.rows, device=self.beam_rows.device)[:, None].expand_as(self.beam_rows)
        )

    @property
    def capacity(self) -> int:
        return self.beam_k[0].shape[2] if self.beam_k else 0

    def keep(self, start: int, index: Tensor) -> None:
        """Keep steps [0, start) and then, per row, the decoded steps `index` [R, m] (in that order).

        How a verifier commits an accepted draft branch: the block's tokens on the branch become steps
        start..start+m-1 and every other drafted token is dropped. Indices are absolute step numbers
        (>= start, < steps). Their RoPE positions were their tree depth, so a root-to-node path keeps
        consistent positions."""
        rows, m = index.shape
        if rows != self.rows or not 0 <= start <= self.steps or start + m > self.capacity:
            raise ValueError(
                f"keep({start}, [{rows}, {m}]) does not fit a cache of {self.rows} rows x {self.steps}"
            )
        # the indexed layout addresses step t at slot t; keep moves steps between slots, so resolve first
        self.materialize()
        if m:
            gather = index.to(torch.long)[:, None, :, None]
            for k, v in zip(self.beam_k, self.beam_v):
                g = gather.expand(-1, k.shape[1], -1, k.shape[3])
                k[:, :, start : start + m] = k.gather(2, g)
                v[:, :, start : start + m] = v.gather(2, g)
        self.steps = start + m

    def truncate(self, steps: int) -> None:
        """Drop every decoded step from `steps` on (their storage is reused by the next extend).

        Safe in the indexed layout too: step t always lives at slot t, so no kept step reads a slot
        the next extend overwrites."""
        if not 0 <= steps <= self.steps:
            raise ValueError(f"truncate({steps}) on a cache holding {self.steps} steps")
        self.steps = steps


def beam_step_index(rows: Tensor, heads: int, capacity: int) -> Tensor:
    """Flat row numbers into storage.view(-1, hd) (storage [R, H, capacity, hd] contiguous) of step j of
    row r read from storage row rows[r, j], in [R, H, t] order (rows [R, t]). Shared by K and V."""
    h = torch.arange(heads, device=rows.device)[None, :, None]
    j = torch.arange(rows.shape[1], device=rows.device)[None, None, :]
    return ((rows[:, None, :] * heads + h) * capacity + j).reshape(-1)


def gather_beam_steps(storage: Tensor, rows: Tensor, index: Tensor | None = None) -> Tensor:
    """[R, H, t, hd]: step j of row r read from storage row rows[r, j]; storage [R, H, T, hd], rows [R, t].

    One index_select of hd-vectors (~3x faster on CPU than advanced indexing over (row, step))."""
    r, h, cap, hd = storage.shape
    if not storage.is_contiguous():
        steps = torch.arange(rows.shape[1], device=rows.device)
        return storage[rows, :, steps].permute(0, 2, 1, 3)  # advanced indices first: [R, t, H, hd]
    index = beam_step_index(rows, h, cap) if index is None else index
    return storage.view(-1, hd).index_select(0, index).view(r, h, rows.shape[1], hd)
