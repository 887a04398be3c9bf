"""The one batched beam search over SID levels that every beam-based decoder runs.

A search is a `LevelScorer` (where the level's log-probabilities come from: the backbone's cached
steps, a NEZHA/MTP draft head, ...) plus an ordered list of `LevelProcessor`s that edit those
log-probabilities before selection (a STATIC constraint mask, NEZHA's every-step verification, a
per-beam candidate cut and a final validity filter). Per level l:

    lp = scorer.level_log_probs(l)                    [B*w, T_l]  (w = 1 at level 0)
    lp, s_i = processor_i.apply(l, s_i, lp, scores)   in order
    top W of scores[b, j] + lp[b*w + j, c] over (j, c) -> parent beam j, code c (pad with -inf)
    s_i = processor_i.advance(l, s_i, rows, codes);  scorer.advance(l, rows, codes)

Sparse candidates: a processor with a `candidates` method (a `CandidateProcessor`, e.g. STATIC on its
CSR levels) may return, instead of [R, T] log-probs, `Candidates`: each row's few allowed codes and
their log-probs ([R, K], K = the level's branch factor). The selection then ranks w * K slots per user
instead of w * T, maps the chosen slots back to (parent, code), and hands each candidate processor the
chosen slots (`pick`) so it can advance its state without searching. A processor without that method
gets the dense equivalent (`Candidates.dense()`), so mixing them stays exact. Sparse candidates are
used with an exact top-W selection only (select_beams, or a selector with a `top_flat` method such as
xBeam's early-terminating one, which then also ranks the candidates): a sampling selector draws noise
per candidate, so a different candidate layout would change its draws.

Scores are the model's unrenormalised log-probabilities, so a constrained SID scores what it scores
unconstrained. Beams that cannot be filled (fewer valid completions than W) keep score -inf;
`finish_beams` reports those slots as missing (code -1, item -1, not valid), never filled with SIDs
outside the constraint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

from genrec.kernels.constrained_mask_torch import dense_from_candidates
from genrec.workloads.decoding.base import DecoderContext, PhaseTimer

NEG_INF = float("-inf")


class LevelScorer(Protocol):
    """Where each level's log-probabilities come from."""

    def level_log_probs(self, level: int) -> Tensor:
        """[B*w, T_level] log-probabilities of the level's codes for every current beam row."""
        ...

    def advance(self, level: int, parent: Tensor, token: Tensor) -> None:
        """The new beams: row i continues old row parent[i] with code token[i] of `level`."""
        ...


class LevelProcessor(Protocol):
    """Edits a level's log-probabilities (e.g. -inf on disallowed codes) and tracks per-beam state."""

    phase: ClassVar[str]  # the timing phase its work is counted in ("mask", "verify", "decode")

    def init_state(self, batch: int, device: torch.device) -> Any:
        """State before level 0: one row per user."""
        ...

    def apply(self, level: int, state: Any, log_probs: Tensor, beam_scores: Tensor) -> tuple[Tensor, Any]:
        """(edited log_probs [R, T], state for `advance`); beam_scores [R] are the rows' scores so far."""
        ...

    def advance(self, level: int, state: Any, parent: Tensor, token: Tensor) -> Any:
        """State of each new beam from its parent row and chosen code."""
        ...


@dataclass(frozen=True)
class Candidates:
    """A level's sparse candidates, returned by a processor in place of dense log-probs [R, T].

    Slot j of row r proposes code codes[r, j] with log-prob log_probs[r, j]; -inf marks an empty slot,
    whose code is arbitrary (in [0, vocab), possibly a repeat of a real one). A row's real codes are
    distinct."""

    log_probs: Tensor  # [R, K]
    codes: Tensor  # [R, K] integer codes
    vocab: int  # T of the level

    def dense(self) -> Tensor:
        """The same scores as dense log-probs [R, T]: -inf off the candidates."""
        return dense_from_candidates(self.log_probs, self.codes, self.vocab)


def as_dense(log_probs: Tensor | Candidates) -> Tensor:
    return log_probs.dense() if isinstance(log_probs, Candidates) else log_probs


@runtime_checkable
class CandidateProcessor(LevelProcessor, Protocol):
    """A processor that can also propose (or edit) sparse candidates."""

    def candidates(
        self, level: int, state: Any, log_probs: Tensor | Candidates, beam_scores: Tensor
    ) -> tuple[Tensor | Candidates, Any]:
        """Like `apply`, for dense or sparse input; returns Candidates (given Candidates: with the same
        slots, only scores edited) or dense log-probs."""
        ...

    def advance(
        self, level: int, state: Any, parent: Tensor, token: Tensor, pick: Tensor | None = None
    ) -> Any:
        """As LevelProcessor.advance; `pick` [R'] (when the level's selection was sparse) is each new
        beam's slot in the flattened [R * K] candidates."""
        ...


@dataclass(frozen=True)
class LevelChoice:
    """The beams chosen at one level: score, parent beam (index into the previous level's beams), code."""

    scores: Tensor  # [B, W]
    parent: Tensor  # [B, W]
    code: Tensor  # [B, W]
    seen: Tensor | Candidates  # what the selection saw (after the processors): [B, w, T] or sparse

    @property
    def log_probs(self) -> Tensor:
        """[B, w, T] what the selection saw, per parent beam (sparse candidates made dense on demand)."""
        if isinstance(self.seen, Candidates):
            return self.seen.dense().view(self.scores.shape[0], -1, self.seen.vocab)
        return self.seen


@dataclass
class BeamStart:
    """A search resumed from beams already decided (speculative decoding continues from its output)."""

    level: int  # levels decided so far
    scores: Tensor  # [B, w]
    codes: Tensor  # [B, w, level]
    states: list[Any]  # each processor's state, one row per beam (see replay_processors)


@dataclass
class BeamSearchOutput:
    codes: Tensor  # [B, W, L] best first; arbitrary where the score is -inf
    scores: Tensor  # [B, W]
    states: list[Any]  # each processor's final state (counters live there)
    choices: list[LevelChoice]  # per searched level, in order


def top_flat(scores: Tensor, log_probs: Tensor, beam_width: int) -> tuple[Tensor, Tensor]:
    """Top `beam_width` of scores[b, j] + log_probs[b, j, c]: (new scores [B, W], flat index j * t + c).

    When fewer than W candidates exist, the rest are padded with score -inf (flat index 0)."""
    b, w, t = log_probs.shape
    cand = (scores[:, :, None] + log_probs).view(b, w * t)
    n = min(beam_width, w * t)
    top, flat = cand.topk(n, dim=-1)
    if n < beam_width:
        top = torch.cat([top, top.new_full((b, beam_width - n), NEG_INF)], dim=1)
        flat = torch.cat([flat, flat.new_zeros(b, beam_width - n)], dim=1)
    return top, flat


def select_beams(scores: Tensor, log_probs: Tensor, beam_width: int) -> tuple[Tensor, Tensor, Tensor]:
    """Top `beam_width` of scores[b, j] + log_probs[b, j, c]: (new scores [B, W], parent [B, W], code [B, W]).

    When fewer than W candidates exist, the rest are padded with score -inf (parent 0, code 0)."""
    top, flat = top_flat(scores, log_probs, beam_width)
    t = log_probs.shape[-1]
    return top, flat // t, flat % t


def select_candidates(
    scores: Tensor, cand: Candidates, beam_width: int, users: Tensor, top: TopW | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """select_beams over sparse candidates: (new scores, parent, code [B, W] long, pick [B*W]).

    Ranks scores[b, j] + cand.log_probs[b*w + j, s] over (j, s); `pick` is the chosen slot's index into
    the flattened [R * K] candidates; `users` = arange(B)[:, None]. Same scores, and the same beams up to
    the order of equal scores, as select_beams over cand.dense()."""
    b, w = scores.shape
    k = cand.log_probs.shape[1]
    best, flat = (top or top_flat)(scores, cand.log_probs.view(b, w, k), beam_width)
    pick = (flat + users * (w * k)).view(-1)
    code = cand.codes.reshape(-1).index_select(0, pick).view(b, -1).long()
    return best, flat // k, code, pick


class BeamSelector(Protocol):
    """How the next beams are chosen among scores[b, j] + log_probs[b, j, c] (top-W by default).

    A selector that picks exactly the W best (any order of equal scores) says so by having a `top_flat`
    method (a `TopW`); the search then also lets processors propose sparse candidates and ranks them
    with it. A sampling selector has none."""

    def __call__(
        self, scores: Tensor, log_probs: Tensor, beam_width: int
    ) -> tuple[Tensor, Tensor, Tensor]: ...


TopW = Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]]  # like top_flat: (values, flat index)
LevelHook = Callable[[int, "LevelChoice", Tensor], bool]  # (level, its choice, codes [B, W, l+1]) -> go on


def exact_top(select: BeamSelector) -> TopW | None:
    """The flat top-W of an exact top-W selector (select_beams: top_flat), None for a sampling one."""
    return top_flat if select is select_beams else getattr(select, "top_flat", None)


class GumbelSelector:
    """Sampling beam search: W candidates drawn without replacement, each with probability proportional
    to its sequence probability (Gumbel-top-k), at temperature 1. Returned scores stay the true
    cumulative log-probabilities; the order of the W beams is by score."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def __call__(self, scores: Tensor, log_probs: Tensor, beam_width: int) -> tuple[Tensor, Tensor, Tensor]:
        b, w, t = log_probs.shape
        cand = (scores[:, :, None] + log_probs).view(b, w * t)
        u = torch.rand(cand.shape, generator=self.generator, device=cand.device).clamp_(min=1e-20)
        perturbed = cand - torch.log(-torch.log(u))  # -inf stays -inf: never drawn
        n = min(beam_width, w * t)
        _, flat = perturbed.topk(n, dim=-1)
        top = cand.gather(1, flat)
        top, order = top.sort(dim=-1, descending=True)
        flat = flat.gather(1, order)
        if n < beam_width:
            top = torch.cat([top, top.new_full((b, beam_width - n), NEG_INF)], dim=1)
            flat = torch.cat([flat, flat.new_zeros(b, beam_width - n)], dim=1)
        return top, flat // t, flat % t


def search_start(
    processors: list[LevelProcessor],
    start: BeamStart | None,
    batch: int,
    device: torch.device,
    timer: PhaseTimer,
) -> tuple[list, Tensor, Tensor, int]:
    """(processor states, beam scores [B, w], codes [B, w, l], first level) a search begins from:
    `start`, or one empty beam per user with score 0."""
    if start is not None:
        return list(start.states), start.scores, start.codes, start.level
    states = []
    for proc in processors:
        with timer.phase(proc.phase):
            states.append(proc.init_state(batch, device))
    codes = torch.zeros(batch, 1, 0, dtype=torch.long, device=device)
    return states, torch.zeros(batch, 1, device=device), codes, 0


def process_level(
    processors: list[LevelProcessor],
    states: list,
    proposes: list[bool],
    level: int,
    seen: Tensor | Candidates,
    scores: Tensor,
    timer: PhaseTimer,
) -> tuple[Tensor | Candidates, list[int]]:
    """Run the processors over one level's log-probs (updating `states` in place); return what the
    selection ranks and the processors whose candidate slots it ranks (their `advance` gets the pick)."""
    flat_scores = scores.reshape(-1)
    owners: list[int] = []
    for i, proc in enumerate(processors):
        with timer.phase(proc.phase):
            if proposes[i]:
                was_sparse = isinstance(seen, Candidates)
                seen, states[i] = proc.candidates(level, states[i], seen, flat_scores)
                sparse = isinstance(seen, Candidates)
                owners = ([*owners, i] if was_sparse else [i]) if sparse else []
            else:
                seen, states[i] = proc.apply(level, states[i], as_dense(seen), flat_scores)
                owners = []
    return seen, owners


def run_beam_search(
    scorer: LevelScorer,
    processors: list[LevelProcessor],
    batch: int,
    beam_width: int,
    levels: int,
    device: torch.device,
    timer: PhaseTimer | None = None,
    select: BeamSelector = select_beams,
    start: BeamStart | None = None,
    on_level: LevelHook | None = None,
) -> BeamSearchOutput:
    """Beam search over SID levels up to `levels` (exclusive), batched over users and beams.

    `select` picks the next beams: the top W (beam search) or a GumbelSelector (sampling beam search).
    `start` resumes from decided beams (the scorer must already score their children); by default the
    search starts from one empty beam per user with score 0. `on_level(level, choice, codes)` runs
    after each level once the scorer and processors follow the chosen beams; False ends the search
    there (speculative verification accepts or rejects a level with it)."""
    timer = timer or PhaseTimer(device)
    states, scores, codes, first = search_start(processors, start, batch, device, timer)
    users = torch.arange(batch, device=device)[:, None]
    # sparse candidates only under an exact top-W selection (see the module doc)
    top = exact_top(select)
    proposes = [top is not None and isinstance(proc, CandidateProcessor) for proc in processors]
    choices = []
    for level in range(first, levels):
        seen, owners = process_level(
            processors, states, proposes, level, scorer.level_log_probs(level), scores, timer
        )
        w = scores.shape[1]
        pick = None
        if isinstance(seen, Candidates):
            scores, parent, code, pick = select_candidates(scores, seen, beam_width, users, top)
        else:
            seen = seen.view(batch, w, -1)
            scores, parent, code = select(scores, seen, beam_width)
        choices.append(LevelChoice(scores, parent, code, seen))
        codes = torch.cat([codes.gather(1, parent[..., None].expand(-1, -1, level)), code[..., None]], dim=2)
        if level < levels - 1:
            rows, token = (users * w + parent).reshape(-1), code.reshape(-1)
            for i, proc in enumerate(processors):
                with timer.phase(proc.phase):
                    if pick is not None and i in owners:
                        states[i] = proc.advance(level, states[i], rows, token, pick)
                    else:
                        states[i] = proc.advance(level, states[i], rows, token)
            scorer.advance(level, rows, token)
        if on_level is not None and not on_level(level, choices[-1], codes):
            break
    return BeamSearchOutput(codes, scores, states, choices)


def level_beams(choices: list[LevelChoice]) -> list[tuple[Tensor, Tensor]]:
    """The beams kept after each level of a search started at level 0: for level l, (codes
    [B, W, l + 1], scores [B, W]), best first, rebuilt from the choices as the search built them
    (codes are arbitrary where the score is -inf). The last entry is the search's output."""
    if not choices:
        return []
    batch = choices[0].code.shape[0]
    codes = choices[0].code.new_zeros(batch, 1, 0)
    out = []
    for level, choice in enumerate(choices):
        kept = codes.gather(1, choice.parent[..., None].expand(-1, -1, level))
        codes = torch.cat([kept, choice.code[..., None]], dim=2)
        out.append((codes, choice.scores))
    return out


def replay_processors(
    processors: list[LevelProcessor], codes: Tensor, codebook_sizes: tuple[int, ...]
) -> list[Any]:
    """Processor states of the beams `codes` [B, w, t], as if a search had chosen them level by level.

    Row i of the states is beam i (B*w rows; B rows when t = 0), ready for level t."""
    b, w, t = codes.shape
    device = codes.device
    states = [proc.init_state(b, device) for proc in processors]
    for level in range(t):
        rows = b if level == 0 else b * w
        dummy = torch.zeros(rows, codebook_sizes[level], device=device)
        zeros = torch.zeros(rows, device=device)
        states = [proc.apply(level, s, dummy, zeros)[1] for proc, s in zip(processors, states)]
        parent = (
            torch.arange(b, device=device).repeat_interleave(w)
            if level == 0
            else torch.arange(b * w, device=device)
        )
        token = codes[:, :, level].reshape(-1)
        states = [proc.advance(level, s, parent, token) for proc, s in zip(processors, states)]
    return states


@dataclass
class FinishedBeams:
    codes: Tensor  # [B, K, L], -1 where missing
    scores: Tensor  # [B, K], -inf where missing
    item_ids: Tensor  # [B, K], -1 where missing or no item
    valid: Tensor  # [B, K] bool: found and a catalogue item
    missing: int  # slots with no SID (fewer valid completions than k)


def finish_beams(ctx: DecoderContext, codes: Tensor, scores: Tensor, k: int) -> FinishedBeams:
    """The top k of a finished search as returned to users: missing slots flagged, items looked up."""
    top_codes, top_scores = codes[:, :k], scores[:, :k]
    found = torch.isfinite(top_scores)
    item_ids, in_catalogue = ctx.index.lookup(top_codes.clamp(min=0))
    top_codes = torch.where(found[..., None], top_codes, -1)
    valid = found & in_catalogue
    item_ids = torch.where(valid, item_ids, -1)
    return FinishedBeams(top_codes, top_scores, item_ids, valid, int((~found).sum()))
