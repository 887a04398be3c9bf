"""AtSpeed's verification as the shared beam core over a draft tree's logits (Algorithms 1 and 2).

One target call scores every node of the draft tree (draft_tree.verify_logits). Verifying a step is then
the beam core resumed from the decided beams, with
- `TreeScorer`: the target's log-probs of the children of the current beams, read from the tree call's
  logits at the node each beam is (no model call per level); a beam's node after a level comes from the
  verification's `route`;
- a per-level acceptance hook (`on_level`): it records the users whose step ends at this level (their
  beams are the step's output) and stops the search once every user has ended;
- the selection: strict verification is the target's exact top-K (its beams are located in the tree by
  matching (parent node, code) against the drafted beams; a level is accepted when all K are drafted);
  relaxed verification selects with Algorithm 2's accept / resample draws (relaxed_sampling.py), and
  its kept beams are drafted nodes already.
Constraint processors run on the tree's levels exactly as on the backbone's, so the search is the one
beam search `beam` runs, with a different scorer, an acceptance hook and (relaxed) a different selector.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from genrec.workloads.decoding.beam_core import LevelChoice
from genrec.workloads.decoding.draft_tree import DraftLevel, DraftTree
from genrec.workloads.decoding.relaxed_sampling import (
    drafted_distribution,
    relaxed_level,
    sample_without_replacement,
)
from genrec.workloads.decoding.scorers import codec_log_probs
from genrec.workloads.sid_codec import SIDCodec

NEG_INF = float("-inf")
Route = Callable[
    [int, Tensor, Tensor], Tensor
]  # (drafted level j, parent nodes [G, W], codes [G, W]) -> nodes


@dataclass
class StepOutcome:
    """One SD step's result for a group of G users."""

    codes: Tensor  # [G, K, L] (valid up to `level`)
    scores: Tensor  # [G, K] target cumulative log-probs
    level: Tensor  # [G] levels decided after the step
    accepted: Tensor  # [G] drafted levels accepted
    verified: list[int] = field(default_factory=list)  # per drafted position j: users verified there
    passed: list[int] = field(default_factory=list)  # ... and accepted there

    @classmethod
    def empty(cls, g: int, k: int, levels: int, t: int, device: torch.device) -> StepOutcome:
        return cls(
            torch.zeros(g, k, levels, dtype=torch.long, device=device),
            torch.full((g, k), NEG_INF, device=device),
            torch.full((g,), t, dtype=torch.long, device=device),
            torch.zeros(g, dtype=torch.long, device=device),
        )

    def count(self, active: Tensor, accept: Tensor) -> None:
        """Acceptance statistics of one drafted level."""
        self.verified.append(int(active.sum()))
        self.passed.append(int((active & accept).sum()))

    def settle(self, active: Tensor, accept: Tensor, codes: Tensor, top: Tensor, level: int) -> Tensor:
        """Record the users that stop at `level` (active, not accepted); return who goes on."""
        finish = active & ~accept
        self.codes[finish, :, : level + 1] = codes[finish]
        self.scores[finish] = top[finish]
        self.level[finish] = level + 1
        self.accepted += (active & accept).long()
        return active & accept


LevelRead = Callable[[Tensor, int], Tensor]  # (logits or hidden states, level) -> the level's log-probs


def full_softmax_reader(codec: SIDCodec) -> LevelRead:
    """Levels read from full-vocabulary logits (the default; scorers.LevelReader has both forms)."""
    return lambda logits, level: codec_log_probs(logits, codec, level)


class TreeScorer:
    """beam_core.LevelScorer over a verified draft tree: rows are beams located at tree nodes."""

    def __init__(self, root: Tensor, tree: DraftTree, tree_logits: Tensor, read: LevelRead, route: Route):
        """`root` [G, V]: the target's logits at the prompt's end (the children of the empty prefix);
        `read(x, level)` turns logits (or hidden states, with level_softmax) into a level's log-probs."""
        self.root, self.tree, self.logits, self.read, self.route = root, tree, tree_logits, read, route
        g, w, _ = tree.committed.shape
        self.nodes = torch.arange(w, device=root.device).expand(g, w)  # the decided beams (or the root)

    def level_log_probs(self, level: int) -> Tensor:
        j = level - self.tree.t
        if j == 0 and self.tree.t == 0:
            logits = self.root[:, None]
        else:
            at = (
                self.tree.committed_index(self.nodes)
                if j == 0
                else self.tree.drafted_index(j - 1, self.nodes)
            )
            logits = self.logits.gather(1, at[..., None].expand(-1, -1, self.logits.shape[-1]))
        lp = self.read(logits, level)
        return lp.reshape(-1, lp.shape[-1])

    def advance(self, level: int, parent: Tensor, token: Tensor) -> None:
        g = self.nodes.shape[0]
        parent_nodes = self.nodes.reshape(-1)[parent].view(g, -1)
        self.nodes = self.route(level - self.tree.t, parent_nodes, token.view(g, -1))


def match_drafted(parent_ids: Tensor, code: Tensor, drafted: DraftLevel, drafted_alive: Tensor, t: int):
    """Whether each (parent drafted id, code) beam [G, K] is among the level's drafted beams, and which."""
    key = parent_ids * t + code
    dkey = drafted.parent * t + drafted.code
    hit = (key[:, :, None] == dkey[:, None, :]) & drafted_alive[:, None, :]
    return hit.any(-1), hit.float().argmax(-1)


def sort_beams(codes: Tensor, top: Tensor) -> tuple[Tensor, Tensor]:
    """Beams [G, K, l] and scores [G, K], best first (an output's order)."""
    top, order = top.sort(dim=-1, descending=True)
    return codes.gather(1, order[..., None].expand_as(codes)), top


class StrictVerification:
    """Algorithm 1 for a group: the target's beam search with beam K over the tree; a drafted level is
    accepted when the target's K beams there are all drafted (or do not exist); the level after the
    last drafted one comes from the same call."""

    def __init__(
        self,
        root: Tensor,
        tree: DraftTree,
        logits: Tensor,
        choices: list[LevelChoice],
        k: int,
        codec,
        read: LevelRead | None = None,
    ):
        g, _, t = tree.committed.shape
        self.tree, self.choices, self.codec = tree, choices, codec
        self.out = StepOutcome.empty(g, k, codec.levels, t, root.device)
        self.active = torch.ones(g, dtype=torch.bool, device=root.device)
        self.scorer = TreeScorer(root, tree, logits, read or full_softmax_reader(codec), self.route)
        self.found: Tensor | None = None

    def route(self, j: int, parent_nodes: Tensor, code: Tensor) -> Tensor:
        alive = torch.isfinite(self.choices[j].scores)
        size = self.codec.codebook_sizes[self.tree.t + j]
        self.found, index = match_drafted(parent_nodes, code, self.tree.levels[j], alive, size)
        return index

    def on_level(self, level: int, choice: LevelChoice, codes: Tensor) -> bool:
        if level - self.tree.t < len(self.tree.levels):  # a drafted level: the scorer located its beams
            accept = (self.found | ~torch.isfinite(choice.scores)).all(-1)
            self.out.count(self.active, accept)
        else:
            accept = torch.zeros_like(self.active)
        self.active = self.out.settle(self.active, accept, codes, choice.scores, level)
        return bool(self.active.any())


class RelaxedVerification:
    """Algorithm 2 for a group: of the N drafted sequences of a level, those whose parent is among the K
    decided beams are kept with probability min(1, p/q'); at least K kept accept the level (K of them
    at random are its beams), fewer end the step with the kept ones plus draws from norm(max(0, p - q')).
    p and q' are the target's and the draft's distributions over the children of the decided beams
    (q' renormalised there unless q_support is "drafted"). The level after the drafted ones is a target
    sampling-beam-search step. The selection is `__call__` (a beam_core.BeamSelector)."""

    def __init__(self, root, tree, logits, choices, k, codec, draft_scores, q_support, gen, read=None):
        g, _, t = tree.committed.shape
        self.tree, self.choices, self.gen, self.q_support = tree, choices, gen, q_support
        self.out = StepOutcome.empty(g, k, codec.levels, t, root.device)
        self.active = torch.ones(g, dtype=torch.bool, device=root.device)
        self.scorer = TreeScorer(root, tree, logits, read or full_softmax_reader(codec), self.route)
        self.draft_scores, self.j = draft_scores, 0
        self.accept = self.active
        self.next_nodes: Tensor | None = None

    def __call__(self, scores: Tensor, lp: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
        j, (g, _, tsize) = self.j, lp.shape
        self.j += 1
        cand = (scores[:, :, None] + lp).view(g, -1)  # target cumulative scores of the children
        p_log = torch.log_softmax(cand, dim=-1)
        if j == len(self.tree.levels):
            chosen, real = sample_without_replacement(p_log, k, self.gen)
            self.accept = torch.zeros_like(self.active)
        else:
            beams, drafted = self.scorer.nodes, self.choices[j]
            q_log = drafted_distribution(drafted.log_probs, self.draft_scores, beams, self.q_support)
            lo = relaxed_level(p_log, q_log, self.tree.levels[j], drafted.scores, beams, tsize, k, self.gen)
            self.accept, self.next_nodes, self.draft_scores = lo.accept, lo.next_nodes, drafted.scores
            chosen = torch.where(lo.accept[:, None], lo.next_flat, lo.final_flat)
            real = torch.where(lo.accept[:, None], lo.next_real, lo.final_real)
        top = torch.where(real, cand.gather(1, chosen), NEG_INF)
        # accepted users go on from the K kept sequences picked at random (their order: draft order)
        return top, chosen // tsize, chosen % tsize

    def route(self, j: int, parent_nodes: Tensor, code: Tensor) -> Tensor:
        return self.next_nodes  # the kept drafted nodes the selection picked

    def on_level(self, level: int, choice: LevelChoice, codes: Tensor) -> bool:
        if level - self.tree.t < len(self.tree.levels):
            self.out.count(self.active, self.accept)
        self.active = self.out.settle(self.active, self.accept, *sort_beams(codes, choice.scores), level)
        return bool(self.active.any())
