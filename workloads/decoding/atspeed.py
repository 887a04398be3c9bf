"""AtSpeed: speculative beam search with a small draft model (paper Algorithms 1 and 2, appendix A.3).

One SD step for the users whose decided prefix has length t (users are grouped by t, so rows of a
batch that accepted different numbers of levels stay correct):
  1. draft: the draft model beam-searches gamma' = min(gamma, L - 1 - t) levels from the K decided
     beams with N beams (strict: its top N; relaxed: N sequences sampled, Gumbel-top-N);
  2. verify: the target scores every drafted node in ONE `extend` over the flattened draft tree with a
     tree mask (draft_tree.py; `tree_attention=False` is the "w/o TA" ablation: one call per level);
  3. accept, level by level from t:
     strict (Algorithm 1): the target's top-K at level t+j (over the children of its own top-K at
       t+j-1) must all be among the drafted beams of that level; the first level where they are not
       is the step's output, and the level after the last drafted one comes free from the same call.
       The output equals the target's beam search with beam K exactly.
     relaxed (Algorithm 2): each drafted sequence y that extends a decided beam is kept if
       p(y) >= q(y), else with probability p(y)/q(y); a level with at least K kept is accepted, and
       K of the kept, drawn at random weighted by p (Gumbel-top-K), are its beams; at the first level
       with fewer, the missing ones are resampled from norm(max(0, p - q)) (kept ones excluded) and
       the step ends. p and q are the target's and the draft's sequence distributions over the
       children of the decided beams (q renormalised there). Algorithm 2 as printed loops over K
       drafted sequences and never uses its input N; read that way a level passes only if all K pass
       (AS@10 0.05 on Beauty, against about 2 in the paper's Table 1), and its "more than K accepted:
       sample K" line could never run. The authors' code drafts N samples and accepts at K kept, as
       here; it picks the K uniformly, which flattens the output when N drafts without replacement
       cover most of a small support, and it compares p with the draft's q over all N draft beams'
       children, unnormalised, which accepts too often.
Scores are the target's cumulative log-probabilities. Any `constraint` masks both models' levels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from genrec.workloads.decoding.base import DecoderContext, DecodeResult, PhaseTimer, register_decoder
from genrec.workloads.decoding.beam_core import (
    BeamStart,
    GumbelSelector,
    LevelChoice,
    LevelProcessor,
    finish_beams,
    replay_processors,
    run_beam_search,
    select_beams,
)
from genrec.workloads.decoding.draft import require_draft
from genrec.workloads.decoding.draft_tree import DraftLevel, DraftTree, verify_logits
from genrec.workloads.decoding.params import BeamParams
from genrec.workloads.decoding.processors import ConstraintProcessor
from genrec.workloads.decoding.relaxed_sampling import (
    drafted_distribution,
    relaxed_level,
    sample_without_replacement,
)
from genrec.workloads.decoding.scorers import BackboneScorer, level_log_probs
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.kv_cache import KVCache
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec

NEG_INF = float("-inf")
Q_SUPPORTS = ("decided", "drafted")


@dataclass(frozen=True)
class AtSpeedParams(BeamParams):
    """beam_width is the target's beam K (the output equals its beam search for `atspeed_strict`)."""

    draft_beams: int = 40  # N: the draft's beams (strict) or sampled sequences (relaxed) per level
    gamma: int = 3  # levels drafted per SD step
    tree_attention: bool = True  # False: verify each drafted level in its own target call (w/o TA)
    seed: int = 0  # relaxed: the accept / resample randomness of one decode call
    # relaxed: the draft distribution q the p/q test uses. "decided": renormalised over the children of
    # the decided beams, the support p has (correct); "drafted": over the children of all N drafted
    # beams, unnormalised there (the authors' code: it accepts more and follows the draft more)
    q_support: str = "decided"

    def validate(self) -> None:
        super().validate()
        if self.gamma < 1:
            raise UserInputError(f"`gamma` must be >= 1, got {self.gamma}")
        if self.q_support not in Q_SUPPORTS:
            raise UserInputError(f"`q_support` must be one of {list(Q_SUPPORTS)}, got {self.q_support!r}")
        if self.draft_beams < self.beam_width:
            raise UserInputError(
                f"`draft_beams` (N = {self.draft_beams}) must be >= beam_width (K = {self.beam_width}): "
                "verification needs every target top-K sequence (strict) or K accepted ones (relaxed) "
                "among the N drafted ones"
            )


@dataclass
class Models:
    """Both models' prefill results for the batch."""

    target: GRTransformer
    draft: GRTransformer
    target_root: Tensor  # [B, V] logits at the prompt's end
    draft_root: Tensor
    target_prompt: KVCache
    draft_prompt: KVCache


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


@dataclass
class DecodeRun:
    """What every SD step of one decode call shares."""

    models: Models
    params: AtSpeedParams
    relaxed: bool
    codec: SIDCodec
    processors: list[LevelProcessor]
    gen: torch.Generator  # relaxed: the draft's sampling and the accept / resample draws
    timer: PhaseTimer
    count: Counters


def extend_codes(codes: Tensor, parent: Tensor, code: Tensor) -> Tensor:
    """Beams [G, W, l+1]: each new beam's parent's codes [G, w, l], then its own code."""
    level = codes.shape[2]
    return torch.cat([codes.gather(1, parent[..., None].expand(-1, -1, level)), code[..., None]], dim=2)


# --- drafting ------------------------------------------------------------------------------------------
def draft_levels(
    run: DecodeRun, users: Tensor, committed: Tensor, target_scores: Tensor, gamma: int, select
) -> tuple[list[LevelChoice], Tensor, int]:
    """The draft's beam search with N beams over `gamma` levels from the decided beams `committed`
    [G, w, t] (`target_scores` [G, w]: -inf marks a beam that does not exist).

    Returns the levels' choices, the draft's log-probabilities of the decided beams [G, w] and the
    number of draft calls."""
    m, codec, processors = run.models, run.codec, run.processors
    width, attention = run.params.draft_beams, run.params.attention
    g, w, t = committed.shape
    prompt = m.draft_prompt.prompt_of(users)
    root = m.draft_root.index_select(0, users)
    if t == 0:  # from the empty prefix: an ordinary search start
        scorer = BackboneScorer(m.draft, codec, root, prompt, width, attention)
        res = run_beam_search(scorer, processors, g, width, gamma, root.device, select=select)
        return res.choices, torch.zeros(g, 1, device=root.device), scorer.calls - 1
    rows = torch.arange(width, device=root.device).clamp(max=w - 1)  # surplus rows repeat beam w-1, at -inf
    codes = committed[:, rows]
    alive = torch.isfinite(target_scores)[:, rows] & (torch.arange(width, device=root.device) < w)
    cache = prompt.expand(width, codec.levels)
    offsets = torch.tensor([codec.level_offset(l) for l in range(t)], device=root.device)
    logits = m.draft.extend((codes + offsets).view(g * width, t), cache, None, attention).logits
    score = prefix_log_prob(root, logits, codes, codec)
    score = torch.where(alive, score, NEG_INF)
    states = replay_processors(processors, codes, codec.codebook_sizes)
    scorer = BackboneScorer(m.draft, codec, logits[:, -1], cache, width, attention, expanded=True)
    res = run_beam_search(
        scorer,
        processors,
        g,
        width,
        t + gamma,
        root.device,
        select=select,
        start=BeamStart(t, score, codes, states),
    )
    return res.choices, score[:, :w], scorer.calls


def prefix_log_prob(root: Tensor, logits: Tensor, codes: Tensor, codec: SIDCodec) -> Tensor:
    """A model's log-probability [G, W] of prefixes `codes` [G, W, t] from its root logits [G, V] and its
    logits at the prefix positions [G*W, t, V] (teacher forcing)."""
    g, w, t = codes.shape
    total = level_log_probs(root, *codec.level_range(0)).gather(1, codes[:, :, 0])
    for level in range(1, t):
        lp = level_log_probs(logits[:, level - 1], *codec.level_range(level)).view(g, w, -1)
        total = total + lp.gather(2, codes[:, :, level : level + 1])[..., 0]
    return total


# --- verification ---------------------------------------------------------------------------------------
def parent_log_probs(
    m: Models, users: Tensor, tree: DraftTree, tree_logits: Tensor, j: int, beams: Tensor, codec: SIDCodec
) -> Tensor:
    """The target's level (t+j) log-probs [G, w, T] for the children of the beams `beams` [G, w]: drafted
    beams of level j-1 (j >= 1), committed beams (j = 0, t >= 1) or the root (j = 0, t = 0)."""
    level = tree.t + j
    if j == 0 and tree.t == 0:
        logits = m.target_root.index_select(0, users)[:, None]
    else:
        nodes = tree.committed_index(beams) if j == 0 else tree.drafted_index(j - 1, beams)
        logits = tree_logits.gather(1, nodes[..., None].expand(-1, -1, tree_logits.shape[-1]))
    return level_log_probs(logits, *codec.level_range(level))


def apply_processors(processors, states, level: int, lp: Tensor, scores: Tensor) -> tuple[Tensor, list]:
    g, w, t = lp.shape
    flat = lp.reshape(g * w, t)
    out = []
    for proc, s in zip(processors, states):
        flat, s = proc.apply(level, s, flat, scores.reshape(-1))
        out.append(s)
    return flat.view(g, w, t), out


def advance_processors(processors, states, level: int, parent: Tensor, code: Tensor, w: int) -> list:
    g = parent.shape[0]
    rows = (torch.arange(g, device=parent.device)[:, None] * w + parent).reshape(-1)
    return [proc.advance(level, s, rows, code.reshape(-1)) for proc, s in zip(processors, states)]


def match_drafted(parent_ids: Tensor, code: Tensor, drafted: DraftLevel, drafted_alive: Tensor, t: int):
    """Whether each (parent drafted id, code) beam [G, K] is among the level's drafted beams, and which."""
    key = parent_ids * t + code
    dkey = drafted.parent * t + drafted.code
    hit = (key[:, :, None] == dkey[:, None, :]) & drafted_alive[:, None, :]
    return hit.any(-1), hit.float().argmax(-1)


def start_verification(
    tree: DraftTree, k: int, codec: SIDCodec, processors: list[LevelProcessor]
) -> tuple[StepOutcome, list, Tensor, Tensor, Tensor]:
    """What both verifications start from: an empty outcome, the processors' states replayed over the
    committed beams, those beams [G, w, t] as the decided ones (indices [G, w]) and every user active."""
    g, w, t = tree.committed.shape
    device = tree.committed.device
    out = StepOutcome.empty(g, k, codec.levels, t, device)
    states = replay_processors(processors, tree.committed, codec.codebook_sizes)
    beams = torch.arange(w, device=device).expand(g, w)
    return out, states, tree.committed, beams, torch.ones(g, dtype=torch.bool, device=device)


def verify_strict(
    run: DecodeRun,
    users: Tensor,
    tree: DraftTree,
    choices: list[LevelChoice],
    tree_logits: Tensor,
    scores: Tensor,
) -> StepOutcome:
    """Algorithm 1 for a group: the target's beam search with beam K, level by level over the tree."""
    m, codec, processors, k = run.models, run.codec, run.processors, run.params.beam_width
    g, _, t = tree.committed.shape
    device = scores.device
    out, states, codes, beams, active = start_verification(tree, k, codec, processors)
    gamma = len(tree.levels)
    for j in range(gamma + 1):
        level = t + j
        lp = parent_log_probs(m, users, tree, tree_logits, j, beams, codec)
        lp, states = apply_processors(processors, states, level, lp, scores)
        top, parent, code = select_beams(scores, lp, k)
        codes = extend_codes(codes, parent, code)
        if j < gamma:
            drafted = tree.levels[j]
            alive = torch.isfinite(choices[j].scores)
            found, index = match_drafted(beams.gather(1, parent), code, drafted, alive, lp.shape[-1])
            accept = (found | ~torch.isfinite(top)).all(-1)
            out.count(active, accept)
        else:
            accept = torch.zeros(g, dtype=torch.bool, device=device)
        active = out.settle(active, accept, codes, top, level)
        if not bool(active.any()):
            break
        states = advance_processors(processors, states, level, parent, code, lp.shape[1])
        scores, beams = top, index
    return out


def verify_relaxed(
    run: DecodeRun,
    users: Tensor,
    tree: DraftTree,
    choices: list[LevelChoice],
    tree_logits: Tensor,
    scores: Tensor,
    draft_scores: Tensor,
) -> StepOutcome:
    """Algorithm 2 for a group: of the N drafted sequences of a level, those whose parent is among the K
    decided beams are kept with probability min(1, p/q'); at least K kept accept the level (K of them
    at random are its beams), fewer end the step with the kept ones plus draws from norm(max(0, p - q')).
    p and q' are the target's and the draft's distributions over the children of the decided beams
    (q' renormalised there: the draft sampled over its own N beams' children)."""
    m, codec, processors, gen = run.models, run.codec, run.processors, run.gen
    k, q_support = run.params.beam_width, run.params.q_support
    g, _, t = tree.committed.shape
    out, states, codes, beams, active = start_verification(tree, k, codec, processors)
    gamma = len(tree.levels)
    for j in range(gamma + 1):
        level = t + j
        lp = parent_log_probs(m, users, tree, tree_logits, j, beams, codec)
        lp, states = apply_processors(processors, states, level, lp, scores)
        tsize = lp.shape[-1]
        cand = (scores[:, :, None] + lp).view(g, -1)  # target cumulative scores of the children
        p_log = torch.log_softmax(cand, dim=-1)
        if j == gamma:  # the level after the drafted ones: a target sampling-beam-search step
            chosen, real = sample_without_replacement(p_log, k, gen)
            top = torch.where(real, cand.gather(1, chosen), NEG_INF)
            codes = extend_codes(codes, chosen // tsize, chosen % tsize)
            out.settle(active, torch.zeros_like(active), *sort_beams(codes, top), level)
            break
        q_log = drafted_distribution(choices[j].log_probs, draft_scores, beams, q_support)
        level_out = relaxed_level(p_log, q_log, tree.levels[j], choices[j].scores, beams, tsize, k, gen)
        out.count(active, level_out.accept)
        chosen = torch.where(level_out.accept[:, None], level_out.next_flat, level_out.final_flat)
        real = torch.where(level_out.accept[:, None], level_out.next_real, level_out.final_real)
        top = torch.where(real, cand.gather(1, chosen), NEG_INF)
        new_codes = extend_codes(codes, chosen // tsize, chosen % tsize)
        active = out.settle(active, level_out.accept, *sort_beams(new_codes, top), level)
        if not bool(active.any()):
            break
        # accepted users go on from the K kept sequences picked at random (their order: draft order)
        codes, scores = new_codes, top
        states = advance_processors(processors, states, level, chosen // tsize, chosen % tsize, lp.shape[1])
        beams = level_out.next_nodes
        draft_scores = choices[j].scores
    return out


def sort_beams(codes: Tensor, top: Tensor) -> tuple[Tensor, Tensor]:
    """Beams [G, K, l] and scores [G, K], best first (an output's order)."""
    top, order = top.sort(dim=-1, descending=True)
    return codes.gather(1, order[..., None].expand_as(codes)), top


# --- the decode loop --------------------------------------------------------------------------------------
@dataclass
class Counters:
    target_calls: int = 1  # the prefill
    draft_calls: int = 1
    sd_steps: int = 0  # summed over users
    accepted_levels: int = 0  # drafted levels accepted, summed over users
    verified: list[int] = field(default_factory=list)
    passed: list[int] = field(default_factory=list)

    def add(self, outcome: StepOutcome, users: int) -> None:
        self.sd_steps += users
        self.accepted_levels += int(outcome.accepted.sum())
        for j, (v, p) in enumerate(zip(outcome.verified, outcome.passed)):
            if j >= len(self.verified):
                self.verified.append(0)
                self.passed.append(0)
            self.verified[j] += v
            self.passed[j] += p

    def as_dict(self, k: int) -> dict[str, float]:
        out = {
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "sd_steps": self.sd_steps,
            "accepted_steps": self.accepted_levels / max(1, self.sd_steps),  # AS@K: per SD step
            "model_calls": self.target_calls,
            "beams": k,
        }
        for j, (v, p) in enumerate(zip(self.verified, self.passed)):
            out[f"acceptance_level_{j + 1}"] = p / v if v else 0.0
        return out


@torch.no_grad()
def atspeed_decode(
    ctx: DecoderContext, histories: list[list[int]], p: AtSpeedParams, relaxed: bool
) -> DecodeResult:
    p.validate()
    name = "atspeed_relaxed" if relaxed else "atspeed_strict"
    draft = require_draft(ctx, name)
    codec, k, levels = ctx.codec, p.beam_width, ctx.codec.levels
    timer = PhaseTimer(ctx.device)
    with timer.phase("system"):
        tokens, mask = ctx.prompts(histories)
        processors = (
            [ConstraintProcessor(ctx.constraints.mask_backend(p, ctx.device))] if p.constrained else []
        )
        gen = torch.Generator(device=ctx.device).manual_seed(p.seed)
    with timer.phase("prefill"):
        t_out, d_out = ctx.model.prefill(tokens, mask), draft.prefill(tokens, mask)
    models = Models(ctx.model, draft, t_out.logits, d_out.logits, t_out.cache, d_out.cache)
    run = DecodeRun(models, p, relaxed, codec, processors, gen, timer, Counters())
    b = tokens.shape[0]
    codes = torch.zeros(b, k, levels, dtype=torch.long, device=ctx.device)
    scores = torch.zeros(b, k, device=ctx.device)
    level = torch.zeros(b, dtype=torch.long, device=ctx.device)
    while bool((level < levels).any()):
        for t in sorted(set(level[level < levels].tolist())):
            users = torch.nonzero(level == t).flatten()
            outcome = sd_step(run, users, codes, scores, t)
            codes[users], scores[users], level[users] = outcome.codes, outcome.scores, outcome.level
            run.count.add(outcome, len(users))
    with timer.phase("system"):
        top = finish_beams(ctx, codes, scores, p.k)
    timings = dict(timer.ms)
    timings["decode"] = timings.get("draft", 0.0) + timings.get("verify", 0.0)
    counters = {**run.count.as_dict(k), "missing": top.missing}
    return DecodeResult(top.codes, top.scores, top.item_ids, top.valid, timings, counters)


def sd_step(run: DecodeRun, users: Tensor, codes: Tensor, scores: Tensor, t: int) -> StepOutcome:
    """One SD step for the users whose decided prefix has length t (`codes` [B, K, L], `scores` [B, K])."""
    m, p, codec, timer, count = run.models, run.params, run.codec, run.timer, run.count
    g = len(users)
    committed = codes[users, :, :t] if t else codes.new_zeros(g, 1, 0)
    base = scores[users] if t else scores.new_zeros(g, 1)
    gamma = min(p.gamma, codec.levels - 1 - t)
    # N per drafted level: the draft's top N (strict) or N sampled sequences (relaxed)
    select = GumbelSelector(run.gen) if run.relaxed else select_beams
    choices: list[LevelChoice] = []
    d_base = base.clone()
    if gamma:
        with timer.phase("draft"):
            choices, d_base, calls = draft_levels(run, users, committed, base, gamma, select)
        count.draft_calls += calls
    # beams the draft could not fill (-inf) point at beam 0, so every node's parent comes before it
    tree = DraftTree(
        committed, [DraftLevel(torch.where(torch.isfinite(c.scores), c.parent, 0), c.code) for c in choices]
    )
    with timer.phase("verify"):
        prompt = m.target_prompt.prompt_of(users)
        tree_logits, calls = verify_logits(m.target, prompt, tree, codec, p.tree_attention, p.attention)
        count.target_calls += calls
        if run.relaxed:
            return verify_relaxed(run, users, tree, choices, tree_logits, base, d_base)
        return verify_strict(run, users, tree, choices, tree_logits, base)


@register_decoder
class AtSpeedStrict:
    name: ClassVar[str] = "atspeed_strict"
    Params: ClassVar[type] = AtSpeedParams

    def decode(self, ctx: DecoderContext, histories: list[list[int]], params: AtSpeedParams) -> DecodeResult:
        return atspeed_decode(ctx, histories, params, relaxed=False)


@register_decoder
class AtSpeedRelaxed:
    name: ClassVar[str] = "atspeed_relaxed"
    Params: ClassVar[type] = AtSpeedParams

    def decode(self, ctx: DecoderContext, histories: list[list[int]], params: AtSpeedParams) -> DecodeResult:
        return atspeed_decode(ctx, histories, params, relaxed=True)
