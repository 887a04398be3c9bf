"""AtSpeed's relaxed sampling verification at one drafted level (Algorithm 2, appendix A.1): the p/q
test of each drafted sequence, the level's accept rule (at least K of the N drafted kept), and the
resampling from norm(max(0, p - q)) when it fails. Pure tensor functions over one group of users; the
selection that calls them per level is `RelaxedVerification` in tree_verify.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from genrec.workloads.decoding.draft_tree import DraftLevel

NEG_INF = float("-inf")


@dataclass
class RelaxedLevel:
    """Algorithm 2 at one drafted level for a group (flat indices are into the children of the decided
    beams, parent position x T + code)."""

    accept: Tensor  # [G] at least K drafted sequences kept
    next_nodes: Tensor  # [G, K] accepted: the kept drafted nodes picked to go on (indices among N)
    next_flat: Tensor  # [G, K] ... as flat children indices
    next_real: Tensor  # [G, K] ... False where fewer than K children exist at all
    final_flat: Tensor  # [G, K] not accepted: the kept sequences, then resampled ones
    final_real: Tensor  # [G, K]


def drafted_distribution(
    q_lp: Tensor, draft_scores: Tensor, beams: Tensor, support: str = "decided"
) -> Tensor:
    """The draft's log q over the children of the decided beams [G, w*T]: its processed level log-probs
    of those parents plus their draft cumulative scores, normalised over these children only
    ("decided"), or over the children of every drafted parent row ("drafted", the authors' code)."""
    g = q_lp.shape[0]
    rows = beams[..., None].expand(-1, -1, q_lp.shape[-1])
    if support == "drafted":
        parents = draft_scores.shape[1]
        full = torch.log_softmax((q_lp[:, :parents] + draft_scores[..., None]).reshape(g, -1), dim=-1)
        return full.view(g, parents, -1).gather(1, rows).view(g, -1)
    lp = q_lp.gather(1, rows) + draft_scores.gather(1, beams)[..., None]
    return torch.log_softmax(lp.view(g, -1), dim=-1)


def relaxed_level(
    p_log: Tensor,
    q_log: Tensor,
    drafted: DraftLevel,
    drafted_scores: Tensor,
    beams: Tensor,
    tsize: int,
    k: int,
    gen: torch.Generator,
) -> RelaxedLevel:
    """Verify the N drafted sequences [G, N] of one level against the decided beams `beams` [G, w]."""
    pos_hit = drafted.parent[:, :, None] == beams[:, None, :]  # [G, N, w]: the parent is decided
    eligible = pos_hit.any(-1) & torch.isfinite(drafted_scores)
    flat = pos_hit.float().argmax(-1) * tsize + drafted.code  # [G, N]
    ratio = torch.exp(p_log.gather(1, flat) - q_log.gather(1, flat))
    keep = eligible & (torch.rand(ratio.shape, generator=gen, device=ratio.device) <= ratio)
    need = torch.isfinite(p_log).sum(-1).clamp(max=k)  # fewer than K children: all of them
    accept = keep.sum(-1) >= need
    # K of the kept at random (the paper's "randomly sample K sequences"), weighted by p and without
    # replacement (Gumbel-top-K over log p), kept in draft order. A uniform draw would be the same
    # only if the N drafts were i.i.d.; drafted without replacement over a small support they cover
    # most of it, and a uniform pick among them flattens the output (demo: Recall@10 0.084 against the
    # target's sampling beam search's 0.167)
    u = torch.rand(keep.shape, generator=gen, device=keep.device).clamp_(min=1e-20)
    key = torch.where(keep, p_log.gather(1, flat) - torch.log(-torch.log(u)), NEG_INF)
    picked = key.topk(min(k, key.shape[1]), dim=-1).indices.sort(dim=-1).values
    picked_real = keep.gather(1, picked)
    if picked.shape[1] < k:  # N < K cannot happen (validated), but a short level is padded
        pad = k - picked.shape[1]
        picked = torch.cat([picked, picked[:, :1].expand(-1, pad)], dim=1)
        picked_real = torch.cat([picked_real, picked_real.new_zeros(picked.shape[0], pad)], dim=1)
    final_flat, final_real = resample(p_log, q_log, flat, keep, k, gen)
    return RelaxedLevel(accept, picked, flat.gather(1, picked), picked_real, final_flat, final_real)


def sample_without_replacement(log_p: Tensor, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """n indices per row drawn without replacement from exp(log_p) (Gumbel-top-n), and whether each is a
    real draw (False where a row has fewer than n candidates of positive probability)."""
    u = torch.rand(log_p.shape, generator=gen, device=log_p.device).clamp_(min=1e-20)
    m = min(n, log_p.shape[-1])
    idx = (log_p - torch.log(-torch.log(u))).topk(m, dim=-1).indices
    if m < n:
        idx = torch.cat([idx, idx.new_zeros(idx.shape[0], n - m)], dim=-1)
    ok = torch.isfinite(log_p.gather(1, idx)) & (torch.arange(n, device=idx.device) < m)
    return idx, ok


def resample(
    p_log: Tensor, q_log: Tensor, drafted: Tensor, keep: Tensor, k: int, gen: torch.Generator
) -> tuple[Tensor, Tensor]:
    """The K sequences [G, K] of a rejected level and whether each slot is real: the kept drafted ones,
    then draws from norm(max(0, p - q)) with the kept ones excluded. Beams must be distinct, so when
    the residual has fewer sequences than the rejections (p <= q almost everywhere), the rest are drawn
    from p itself, excluding every sequence already chosen (a deviation Algorithm 2 does not need, as
    it samples with replacement)."""
    residual = (p_log.exp() - q_log.exp()).clamp(min=0)
    kept_cols = torch.where(keep, drafted, drafted.new_full((), -1))
    residual = exclude(residual, kept_cols, 0.0)
    res_draws, res_ok = sample_without_replacement(torch.where(residual > 0, residual.log(), NEG_INF), k, gen)
    taken = torch.cat([kept_cols, torch.where(res_ok, res_draws, -1)], dim=1)
    p_draws, p_ok = sample_without_replacement(exclude(p_log, taken, NEG_INF), k, gen)
    order = torch.cat([drafted, res_draws, p_draws], dim=1)
    ok = torch.cat([keep, res_ok, p_ok], dim=1)
    first = torch.argsort((~ok).long(), dim=1, stable=True)[:, :k]  # real ones first, in that order
    return order.gather(1, first), ok.gather(1, first)


def exclude(values: Tensor, columns: Tensor, fill: float) -> Tensor:
    """values [G, C] with `fill` at the given columns [G, n] (entries < 0 are ignored)."""
    out = values.clone()
    hit = columns >= 0
    rows = torch.arange(values.shape[0], device=values.device)[:, None].expand_as(columns)
    out[rows[hit], columns[hit]] = fill
    return out
