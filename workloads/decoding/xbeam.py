"""xBeam (xGR section 6): early-terminating top-BW selection and buffer reuse for the beam core.

Early sorting termination (section 6.2). A level's candidates are scores[b, j] + log_probs[b, j, c]
over w beams x T codes; the next beams are the top BW. xGR walks each beam's sorted candidates and
stops a beam once its next candidate falls below the current BW-th best (a min-heap of size BW).
Sorting every beam first costs far more than one flat top-k on a CPU (512 rows of 256: ~30-50x a
flat top-k, measured in studies/xgr/xgr_select.py), so the vectorised form here prunes by
blocks instead of by single candidates:

1. group each beam's codes into `stripes` groups of T / stripes codes (codes r, r + stripes, ...: a
   strided view, so the reduction runs over contiguous memory) and take each group's best candidate
   (s_j + max lp: adding s_j is monotone, so this is exactly the group's best candidate value): the
   one pass over all candidates;
2. keep the BW + 1 best groups; every other group lies wholly at or below tau, the least kept
   maximum: those groups are never scanned again (the early termination);
3. select the top BW among the kept candidates ((BW + 1) x T / stripes of them, ~1/30 of all at
   BW = 512, T = 256). The kept maxima are BW + 1 kept candidates >= tau, so the kept set's
   (BW+1)-th value is >= tau >= every dropped candidate: when it is strictly below the BW-th value,
   the top BW is proven. Otherwise (a tie at the boundary, fewer finite candidates than BW) the exact
   flat selection runs. One host-side check per level.

On CPU the selections in steps 2 and 3 are numpy's argpartition (an introselect, ~5x faster than
torch's CPU top-k on unsorted data); elsewhere torch.topk. A per-candidate min-heap in Python would
be slower than either, so there is no heap form.

Equal candidates are ordered by their flat index j * T + c (lower first), so the result equals a
stable descending sort, ties included, on every path. NaN candidates are not supported (log-probs
have none).

Buffer reuse (section 6.3): `SelectBuffers` holds per-level score / parent / code outputs and the
group-maxima scratch for one (batch, BW, levels) shape, written in place instead of allocated per
step; `buffer_pool.BufferPool` (one per `DecoderContext`) hands such buffers and the beam KV storage
(see xgr.py) to one decode at a time and keeps them for the next request of the same shape.
CUDA-graph capture of the decode loop (which these fixed addresses enable) is not done here.

Valid-path filter (section 6.1): the constraint processor (processors.ConstraintProcessor with
STATIC's index: dense tables for the first levels, CSR rows for the rest) is xGR's item mask; the
decoder reuses it unchanged. `EarlyTopK.top_flat` makes it an exact top-W selector for the beam core,
so the constraint's sparse candidates (a beam's few valid children) are ranked by it too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

NEG_INF = float("-inf")
STRIPES = 32  # groups per beam: the reduction's inner (contiguous) extent; 32 floats = one SIMD sweep


def stable_topk(cand: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top k (<= N) of each row of cand [B, N], best first, equal values by lower index (what a stable
    descending sort puts first): (values [B, k], indices [B, k]).

    One top-(k+1): when its values strictly decrease, the k best and their order are unique, so they
    are the answer (the common case: ties are rare in float log-probs). Otherwise the k-th value v
    decides: the members are every candidate above v plus the first (by index) of those equal to v,
    and a stable sort of the k members (in index order) orders them."""
    b, n = cand.shape
    values, index = cand.topk(min(k + 1, n), dim=-1)
    if bool((values[:, 1:] < values[:, :-1]).all()):
        return values[:, :k], index[:, :k]
    kth = values[:, k - 1 : k]
    above, equal = cand > kth, cand == kth
    need = k - above.sum(dim=-1, keepdim=True)
    members = above | (equal & (equal.cumsum(dim=-1) <= need))
    index = members.nonzero()[:, 1].view(b, k)  # row-major: each row's k members by index
    values, order = cand.gather(1, index).sort(dim=-1, descending=True, stable=True)
    return values, index.gather(1, order)


@functools.lru_cache(maxsize=32)
def _group_tables(w: int, t: int, stripes: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """For the group view of [w, t] candidates: each group's beam, its first flat index j * t + r, and
    the offsets of its codes (0, stripes, 2 stripes, ...). Built once per shape (reused every step)."""
    grp = torch.arange(w * stripes, device=device)
    beam = grp // stripes
    return beam, beam * t + grp % stripes, torch.arange(0, t, stripes, device=device)


def pruned_topk(
    scores: Tensor, log_probs: Tensor, k: int, stripes: int = STRIPES, scratch: Tensor | None = None
) -> tuple[Tensor, Tensor] | None:
    """Top k of scores[b, j] + log_probs[b, j, c] by group pruning: (values [B, k], flat j * T + c), or
    None when the kept groups cannot prove the result (ties at the boundary, too few finite values).

    Needs T % stripes == 0, T / stripes >= 2 and w * stripes > k. `scratch` [B, w, stripes] (optional)
    receives the group maxima. On CPU (fp32/fp64) the two selections run in numpy (`argpartition`, an
    introselect, is ~5x faster than torch's CPU top-k on unsorted data); elsewhere in torch."""
    b, w, t = log_probs.shape
    lp = log_probs.contiguous()
    gmax = torch.amax(lp.view(b, w, t // stripes, stripes), dim=2, out=scratch)  # [B, w, stripes]
    # each group's best candidate, exactly (adding s_j is monotone); numpy's add is cheaper on CPU
    if lp.device.type == "cpu" and lp.dtype == scores.dtype and lp.dtype in (torch.float32, torch.float64):
        gm = gmax.numpy()
        gm += scores.numpy()[:, :, None]
        return _prune_numpy(scores, lp, gmax.view(b, w * stripes), k, stripes)
    gmax += scores[:, :, None]
    return _prune_torch(scores, lp, gmax.view(b, w * stripes), k, stripes)


def _prune_torch(
    scores: Tensor, lp: Tensor, gmax: Tensor, k: int, stripes: int
) -> tuple[Tensor, Tensor] | None:
    b, w, t = lp.shape
    g = t // stripes
    beam_of, first_of, offsets = _group_tables(w, t, stripes, lp.device)
    gval, grp = gmax.topk(k + 1, dim=-1, sorted=False)  # the k + 1 best groups
    idx = (first_of[grp][..., None] + offsets).view(b, -1)  # the kept groups' flat indices [B, (k+1) g]
    cand = lp.view(b, w * t).gather(1, idx).view(b, k + 1, g)
    cand += scores.gather(1, beam_of[grp])[..., None]
    top, pos = cand.view(b, -1).topk(k + 1, dim=-1)
    # The k + 1 kept group maxima are kept candidates, so top[k] >= tau (the least kept maximum) >= any
    # dropped candidate. Strictly decreasing top[0..k] thus proves the k best, and their order, unique.
    if bool((top[:, 1:] < top[:, :-1]).all()):
        return top[:, :k], idx.gather(1, pos[:, :k])
    # ties: the kept candidates in flat-index order, so the stable selection breaks ties by index; the
    # membership is exact if the k-th best beats tau (no dropped candidate can equal it)
    idx, order = idx.sort(dim=-1)
    top, pos = stable_topk(cand.view(b, -1).gather(1, order), k)
    if not bool((top[:, -1] > gval.amin(dim=-1)).all()):
        return None
    return top, idx.gather(1, pos)


def _prune_numpy(
    scores: Tensor, lp: Tensor, gmax: Tensor, k: int, stripes: int
) -> tuple[Tensor, Tensor] | None:
    b, w, t = lp.shape
    g, n_groups, n = t // stripes, w * stripes, (k + 1) * (t // stripes)
    beam_of, first_of, offsets = _group_tables_numpy(w, t, stripes)
    users = np.arange(b)[:, None]
    # flat indexing with per-user offsets: take_along_axis costs ~15 us of Python per call
    grp = gmax.numpy().argpartition(n_groups - k - 1, axis=1)[:, n_groups - k - 1 :]  # the k + 1 best
    idx = (first_of.take(grp)[..., None] + offsets).reshape(b, n)  # the kept groups' flat indices
    cand = lp.numpy().reshape(-1).take(idx + users * (w * t)).reshape(b, k + 1, g)
    cand += scores.numpy().reshape(-1).take(beam_of.take(grp) + users * w)[..., None]
    part = cand.reshape(b, n).argpartition(n - k - 1, axis=1)  # [n-k-1]: (k+1)-th best, [n-k:]: k best
    best = part[:, n - k :] + users * n  # flat positions in cand
    values = cand.reshape(-1).take(best)
    # the (k+1)-th kept value is >= tau >= any dropped candidate (see _prune_torch): strictly below the
    # k-th best, it proves the membership
    if not (values.min(axis=1) > cand.reshape(-1).take(part[:, n - k - 1] + users[:, 0] * n)).all():
        return None
    order = (-values).argsort(axis=1) + users * k
    values, flat = values.reshape(-1).take(order), idx.reshape(-1).take(best.reshape(-1).take(order))
    if (values[:, 1:] == values[:, :-1]).any():  # equal values inside: order them by index
        order = np.lexsort((flat, -values), axis=-1) + users * k
        values, flat = values.reshape(-1).take(order), flat.reshape(-1).take(order)
    return torch.from_numpy(values), torch.from_numpy(flat)


@functools.lru_cache(maxsize=32)
def _group_tables_numpy(w: int, t: int, stripes: int) -> tuple[np.ndarray, ...]:
    return tuple(x.numpy() for x in _group_tables(w, t, stripes, torch.device("cpu")))


def prunes(w: int, t: int, k: int, stripes: int = STRIPES) -> bool:
    """Whether group pruning applies to a top-k of w x t candidates and pays: T splits into >= 2 codes
    per group, more groups than k + 1, and the kept groups at most half of all candidates."""
    g = t // stripes if t % stripes == 0 else 0
    return g >= 2 and w * stripes > k + 1 and 2 * (k + 1) * g <= w * t


def early_topk(
    scores: Tensor, log_probs: Tensor, beam_width: int, stripes: int = STRIPES, scratch: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Top `beam_width` of scores[b, j] + log_probs[b, j, c]: (values [B, W], flat index j * T + c [B, W]).

    Equal to `stable_topk` over the flat candidates (ties by lower index); padded with -inf (index 0)
    when fewer than W candidates exist. Prunes by groups when the shape allows it and pays off."""
    b, w, t = log_probs.shape
    n = w * t
    k = min(beam_width, n)
    found = None
    if prunes(w, t, k, stripes):
        found = pruned_topk(scores, log_probs, k, stripes, scratch)
    top, flat = found if found is not None else stable_topk((scores[:, :, None] + log_probs).view(b, n), k)
    if k < beam_width:
        top = torch.cat([top, top.new_full((b, beam_width - k), NEG_INF)], dim=1)
        flat = torch.cat([flat, flat.new_zeros(b, beam_width - k)], dim=1)
    return top, flat


@dataclass
class SelectBuffers:
    """Outputs of every level of one (batch, BW, levels) search, plus the group-maxima scratch."""

    scores: Tensor  # [L, B, W]
    parent: Tensor  # [L, B, W] long
    code: Tensor  # [L, B, W] long
    group_max: Tensor  # [B * BW * STRIPES]: room for the group maxima of up to BW beams per user

    @staticmethod
    def build(batch: int, beam_width: int, levels: int, device: torch.device) -> SelectBuffers:
        shape = (levels, batch, beam_width)
        return SelectBuffers(
            torch.empty(shape, device=device),
            torch.empty(shape, dtype=torch.long, device=device),
            torch.empty(shape, dtype=torch.long, device=device),
            torch.empty(batch * beam_width * STRIPES, device=device),
        )


class EarlyTopK:
    """A beam_core.BeamSelector: `early_topk`, writing into reused buffers when given.

    One instance per search: call i writes level i's outputs (earlier levels' outputs stay valid, as
    the beam core keeps them in its LevelChoice records)."""

    def __init__(self, buffers: SelectBuffers | None = None, stripes: int = STRIPES) -> None:
        self.buffers, self.stripes, self.level = buffers, stripes, 0

    def _scratch(self, b: int, w: int) -> Tensor | None:
        size = b * w * self.stripes
        if self.buffers is None or self.buffers.group_max.numel() < size:
            return None
        return self.buffers.group_max[:size].view(b, w, self.stripes)

    def top_flat(self, scores: Tensor, log_probs: Tensor, beam_width: int) -> tuple[Tensor, Tensor]:
        """(values, flat index) of the exact top W of the beam core's sparse candidates (having this
        method makes the selector exact top-W: processors may propose candidates, ranked here; the
        outputs are not written to the buffers)."""
        return early_topk(scores, log_probs, beam_width, self.stripes)

    def __call__(self, scores: Tensor, log_probs: Tensor, beam_width: int) -> tuple[Tensor, Tensor, Tensor]:
        b, w, t = log_probs.shape
        top, flat = early_topk(scores, log_probs, beam_width, self.stripes, self._scratch(b, w))
        level, self.level = self.level, self.level + 1
        bufs = self.buffers
        if bufs is None or level >= bufs.scores.shape[0] or bufs.scores.shape[1:] != top.shape:
            return (top, *split_flat(flat, t))
        out_s = bufs.scores[level]
        out_s.copy_(top)
        return (out_s, *split_flat(flat, t, (bufs.parent[level], bufs.code[level])))


def split_flat(flat: Tensor, t: int, out: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """(parent, code) = divmod(flat, t), into `out` when given (numpy's divmod on CPU: one cheap call)."""
    if flat.device.type == "cpu" and flat.is_contiguous():
        if out is None:
            parent, code = np.divmod(flat.numpy(), t)
            return torch.from_numpy(parent), torch.from_numpy(code)
        np.divmod(flat.numpy(), t, out=(out[0].numpy(), out[1].numpy()))
        return out
    if out is None:
        parent = torch.div(flat, t, rounding_mode="floor")
        return parent, flat - parent * t
    torch.div(flat, t, rounding_mode="floor", out=out[0])
    torch.remainder(flat, t, out=out[1])
    return out
