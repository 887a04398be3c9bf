"""AtSpeed: speculative beam search with a small draft model (paper Algorithms 1 and 2, appendix A.3).

One SD step for the users whose decided prefix has length t (users are grouped by t, so rows of a
batch that accepted different numbers of levels stay correct):
  1. draft: the draft model beam-searches gamma' = min(gamma, L - 1 - t) levels from the K decided
     beams with N beams (strict: its top N; relaxed: N sequences sampled, Gumbel-top-N);
  2. verify: the target scores every drafted node in ONE `extend` over the flattened draft tree with a
     tree mask (draft_tree.py; `tree_attention=False` is the "w/o TA" ablation: one call per level);
  3. accept, level by level from t (the shared beam core over the tree's logits with a per-level
     acceptance hook, tree_verify.py):
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

from genrec.workloads.decoding.base import DecoderContext, DecodeResult, PhaseTimer, RegisteredDecoder
from genrec.workloads.decoding.beam_core import (
    BeamStart,
    GumbelSelector,
    LevelChoice,
    LevelProcessor,
    replay_processors,
    run_beam_search,
    select_beams,
)
from genrec.workloads.decoding.draft_tree import DraftLevel, DraftTree, verify_logits
from genrec.workloads.decoding.needs import DRAFT_MODEL, Need
from genrec.workloads.decoding.params import BeamParams
from genrec.workloads.decoding.processors import ConstraintProcessor
from genrec.workloads.decoding.scorers import LevelReader
from genrec.workloads.decoding.template import decode_result, finish_timed, timed_prompts
from genrec.workloads.decoding.tree_verify import RelaxedVerification, StepOutcome, StrictVerification
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
    # both models score a level by the softmax over its own tokens (scorers.LevelReader), as `beam` does
    # with the same flag: strict then equals `beam` with level_softmax, and a draft aligned with
    # `--level-softmax` is decoded by the distribution it was aligned to
    level_softmax: bool = False

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
    target_root: Tensor  # [B, V] logits at the prompt's end ([B, D] hidden states with level_softmax)
    draft_root: Tensor
    target_prompt: KVCache
    draft_prompt: KVCache


@dataclass
class DecodeRun:
    """What every SD step of one decode call shares."""

    models: Models
    params: AtSpeedParams
    relaxed: bool
    codec: SIDCodec
    target_read: LevelReader  # how each model's outputs become level log-probs (logits or hidden states)
    draft_read: LevelReader  # the draft's ids (codes are shared: a draft of ours beside an imported target)
    processors: list[LevelProcessor]
    gen: torch.Generator  # relaxed: the draft's sampling and the accept / resample draws
    timer: PhaseTimer
    count: Counters


# --- drafting ------------------------------------------------------------------------------------------
def draft_levels(
    run: DecodeRun, users: Tensor, committed: Tensor, target_scores: Tensor, gamma: int, select
) -> tuple[list[LevelChoice], Tensor, int]:
    """The draft's beam search with N beams over `gamma` levels from the decided beams `committed`
    [G, w, t] (`target_scores` [G, w]: -inf marks a beam that does not exist).

    Returns the levels' choices, the draft's log-probabilities of the decided beams [G, w] and the
    number of draft calls."""
    m, read, processors = run.models, run.draft_read, run.processors
    codec, width, attention = read.codec, run.params.draft_beams, run.params.attention
    g, w, t = committed.shape
    prompt = m.draft_prompt.prompt_of(users)
    root = m.draft_root.index_select(0, users)
    if t == 0:  # from the empty prefix: an ordinary search start
        scorer = read.scorer(root, prompt, width, attention)
        res = run_beam_search(scorer, processors, g, width, gamma, root.device, select=select)
        return res.choices, torch.zeros(g, 1, device=root.device), scorer.calls - 1
    rows = torch.arange(width, device=root.device).clamp(max=w - 1)  # surplus rows repeat beam w-1, at -inf
    codes = committed[:, rows]
    alive = torch.isfinite(target_scores)[:, rows] & (torch.arange(width, device=root.device) < w)
    cache = prompt.expand(width, codec.levels)
    tokens = codec.prefix_to_tokens(codes).view(g * width, t)
    outs = read.of(m.draft.extend(tokens, cache, None, attention, logits=not read.level_softmax))
    score = prefix_log_prob(root, outs, codes, read)
    score = torch.where(alive, score, NEG_INF)
    states = replay_processors(processors, codes, codec.codebook_sizes)
    scorer = read.scorer(outs[:, -1], cache, width, attention, expanded=True)
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


def prefix_log_prob(root: Tensor, outs: Tensor, codes: Tensor, read: LevelReader) -> Tensor:
    """A model's log-probability [G, W] of prefixes `codes` [G, W, t] from its outputs at the root [G, X]
    and at the prefix positions [G*W, t, X] (teacher forcing; X: logits or hidden states, see `read`)."""
    g, w, t = codes.shape
    total = read.log_probs(root, 0).gather(1, codes[:, :, 0])
    for level in range(1, t):
        lp = read.log_probs(outs[:, level - 1], level).view(g, w, -1)
        total = total + lp.gather(2, codes[:, :, level : level + 1])[..., 0]
    return total


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
    draft = ctx.draft_model  # present: RegisteredDecoder.decode checked the declared needs
    codec, k, levels = ctx.codec, p.beam_width, ctx.codec.levels
    timer = PhaseTimer(ctx.device)
    tokens, mask = timed_prompts(ctx, histories, timer)
    with timer.phase("system"):
        d_tokens, d_mask = (tokens, mask) if ctx.draft_codec is None else ctx.draft_prompts(histories)
        processors = (
            [ConstraintProcessor(ctx.constraints.mask_backend(p, ctx.device))] if p.constrained else []
        )
        gen = torch.Generator(device=ctx.device).manual_seed(p.seed)
    with timer.phase("prefill"):
        t_out, d_out = ctx.model.prefill(tokens, mask), draft.prefill(d_tokens, d_mask)
    t_read = LevelReader(ctx.model, codec, p.level_softmax)
    d_read = LevelReader(draft, ctx.draft_scoring_codec, p.level_softmax)
    models = Models(ctx.model, draft, t_read.of(t_out), d_read.of(d_out), t_out.cache, d_out.cache)
    run = DecodeRun(models, p, relaxed, codec, t_read, d_read, processors, gen, timer, Counters())
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
    top = finish_timed(ctx, timer, codes, scores, p.k)
    timings = dict(timer.ms)
    timings["decode"] = timings.get("draft", 0.0) + timings.get("verify", 0.0)
    return decode_result(top, timings, run.count.as_dict(k))


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
        tree_logits, calls = verify_logits(
            m.target, prompt, tree, codec, p.tree_attention, p.attention, hidden=p.level_softmax
        )
        count.target_calls += calls
        return verify(run, users, tree, choices, tree_logits, base, d_base)


def verify(
    run: DecodeRun,
    users: Tensor,
    tree: DraftTree,
    choices: list[LevelChoice],
    tree_logits: Tensor,
    scores: Tensor,
    draft_scores: Tensor,
) -> StepOutcome:
    """Verify a group's draft tree: the beam core resumed from the decided beams over the tree's logits,
    with strict (Algorithm 1) or relaxed (Algorithm 2) acceptance (tree_verify.py)."""
    m, p, codec, processors = run.models, run.params, run.codec, run.processors
    root, k = m.target_root.index_select(0, users), p.beam_width
    if run.relaxed:
        read = run.target_read.log_probs
        v = RelaxedVerification(
            root, tree, tree_logits, choices, k, codec, draft_scores, p.q_support, run.gen, read
        )
        select = v
    else:
        v = StrictVerification(root, tree, tree_logits, choices, k, codec, run.target_read.log_probs)
        select = select_beams
    t, g = tree.t, len(users)
    start = BeamStart(
        t, scores, tree.committed, replay_processors(processors, tree.committed, codec.codebook_sizes)
    )
    levels = t + len(tree.levels) + 1
    run_beam_search(
        v.scorer, processors, g, k, levels, root.device, select=select, start=start, on_level=v.on_level
    )
    return v.out


class AtSpeedStrict(RegisteredDecoder):
    name: ClassVar[str] = "atspeed_strict"
    description: ClassVar[str] = (
        "speculative beam search, draft verified by strict top-K: same output as beam (AtSpeed)"
    )
    Params: ClassVar[type] = AtSpeedParams
    needs: ClassVar[tuple[Need, ...]] = (DRAFT_MODEL,)

    def run(self, ctx: DecoderContext, histories: list[list[int]], params: AtSpeedParams) -> DecodeResult:
        return atspeed_decode(ctx, histories, params, relaxed=False)


class AtSpeedRelaxed(RegisteredDecoder):
    name: ClassVar[str] = "atspeed_relaxed"
    description: ClassVar[str] = (
        "speculative beam search with relaxed sampling verification: faster, not identical (AtSpeed)"
    )
    Params: ClassVar[type] = AtSpeedParams
    needs: ClassVar[tuple[Need, ...]] = (DRAFT_MODEL,)

    def run(self, ctx: DecoderContext, histories: list[list[int]], params: AtSpeedParams) -> DecodeResult:
        return atspeed_decode(ctx, histories, params, relaxed=True)
