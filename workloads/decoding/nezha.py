"""NEZHA decoding (paper Algorithm 3, lines 13-30): one prefill, beam search over the draft head only,
model-free verification against the set of valid SIDs on the device.

One prefill of [history, <SP_1>..<SP_L>] gives h_0..h_L for every user of the batch. Step l then
scores, for every beam, its level-l codes with the head (no backbone call), takes each beam's top K
codes (K x K candidates per user), and keeps the K with the largest cumulative log-probability;
each kept beam's context state advances through the head's transition with its chosen code.

The search is the shared beam core (beam_core) with the head as scorer; verification is a level
processor (processors.py). It uses the mixed-radix keys of sid_codec: the valid set is the sorted
int64 key tensor of every valid prefix on the decoding device (prefix_keys.PrefixKeySets):
    verify="final"  the K x K final candidates are filtered, the top K valid ones kept (the paper)
    verify="every"  additionally, each step's codes are masked to valid prefixes before the top K
    verify="none"   no filtering (NEZHA-4); validity is still looked up for reporting
With `constraint` set (any rule or registered set), the set's STATIC mask runs before verification,
so NEZHA returns only items of the set (a NEZHA + STATIC composition).
Counters report how many of the top-K drafts would be valid without verification (drafts_valid)
and how many returned SIDs are valid after it (returned_valid), out of `candidates` (users x K).

`PythonSetVerifier` is the slow reference (a Python set of code tuples on the host) the tests
compare against; `reference_decode` is a per-user, per-beam transcription of Algorithm 3.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from genrec.workloads.decoding.base import (
    DecoderContext,
    DecodeResult,
    PhaseTimer,
    RegisteredDecoder,
)
from genrec.workloads.decoding.beam_core import LevelProcessor, run_beam_search
from genrec.workloads.decoding.needs import NEZHA_HEAD, Need
from genrec.workloads.decoding.params import BeamParams
from genrec.workloads.decoding.prefix_keys import PrefixKeySets
from genrec.workloads.decoding.processors import (
    ConstraintProcessor,
    FinalValidity,
    FinalValidityState,
    PerBeamTopK,
    PrefixValidity,
)
from genrec.workloads.decoding.scorers import HeadScorer
from genrec.workloads.decoding.template import decode_result, finish_timed, timed_prompts
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.nezha_head import DraftHead, append_placeholders, head_states
from genrec.workloads.sid_codec import SIDCodec

VERIFY_MODES = ("final", "every", "none")
NEG_INF = float("-inf")


class PythonSetVerifier:
    """The slow reference: valid SIDs and their prefixes as Python sets of code tuples."""

    def __init__(self, codec: SIDCodec, item_codes: np.ndarray) -> None:
        self.levels = codec.levels
        sids = {tuple(int(c) for c in row) for row in np.asarray(item_codes)}
        self.prefixes = [{s[: l + 1] for s in sids} for l in range(self.levels)]

    def contains(self, codes: tuple[int, ...]) -> bool:
        return codes in self.prefixes[len(codes) - 1]


# --- batched beam search over a draft head ---------------------------------------------------------------
@dataclass
class HeadSearchOutput:
    codes: torch.Tensor  # [B, K, L], best first
    scores: torch.Tensor  # [B, K] cumulative log-probabilities, -inf where no candidate survived
    drafts_valid: int  # valid SIDs among the unverified top K (summed over users); -1 unless verify=final
    verify_ms: float
    draft_ms: float


def nezha_processors(
    prefixes: PrefixKeySets | None, verify: str, beam_width: int, levels: int
) -> list[LevelProcessor]:
    """NEZHA's verification as level processors: every-step masks, or the final K x K filter."""
    if verify not in VERIFY_MODES:
        raise UserInputError(f"`verify` must be one of {list(VERIFY_MODES)}, got {verify!r}")
    if verify == "none":
        return []
    if prefixes is None:
        raise ValueError("verification needs the prefix key sets")
    if verify == "every":
        return [PrefixValidity(prefixes)]
    return [PerBeamTopK(beam_width, levels), FinalValidity(prefixes, beam_width)]


def head_beam_search(
    head: DraftHead,
    states: torch.Tensor,
    beam_width: int,
    codec: SIDCodec,
    prefixes: PrefixKeySets | None,
    verify: str = "final",
    constraint: list[LevelProcessor] | None = None,
) -> HeadSearchOutput:
    """Beam search over the head's own probabilities, batched over users and beams (the beam core).

    states [B, L+1, D] (or [B, 1, D] for heads that read only h_0). At every step each beam
    proposes its top K codes (K x K candidates per user) and the best K cumulative scores survive.
    `prefixes` is needed unless verify == "none"; `constraint` processors (a constraint set's mask)
    run before verification.
    """
    processors = [*(constraint or []), *nezha_processors(prefixes, verify, beam_width, codec.levels)]
    timer = PhaseTimer(states.device)
    with timer.phase("search"):
        res = run_beam_search(
            HeadScorer(head, states),
            processors,
            states.shape[0],
            beam_width,
            codec.levels,
            states.device,
            timer,
        )
    final = [s for s in res.states if isinstance(s, FinalValidityState)]
    drafts_valid = final[0].drafts_valid if final else -1
    verify_ms = timer.ms.get("verify", 0.0)
    return HeadSearchOutput(res.codes, res.scores, drafts_valid, verify_ms, timer.ms["search"] - verify_ms)


@torch.no_grad()
def reference_decode(
    head: DraftHead,
    states: torch.Tensor,
    beam_width: int,
    codec: SIDCodec,
    verifier: PythonSetVerifier | None,
    verify: str = "final",
) -> list[list[tuple[tuple[int, ...], float]]]:
    """Algorithm 3's inference loop, one user and one beam at a time (the slow reference).

    Returns per user the kept (codes, cumulative log-prob) pairs, best first, -inf ones dropped.
    """
    out = []
    for u in range(states.shape[0]):
        st = states[u : u + 1]
        beams: list[tuple[tuple[int, ...], float, torch.Tensor | None]] = [((), 0.0, head.init_state(st))]
        for level in range(codec.levels):
            pool = []
            for prefix, score, s in beams:
                lp = torch.log_softmax(head.level_logits(level, st, s).float(), dim=-1)[0]
                if verify == "every":
                    for c in range(len(lp)):
                        if not verifier.contains((*prefix, c)):
                            lp[c] = NEG_INF
                top_lp, top_code = lp.topk(min(beam_width, len(lp)))
                for p, c in zip(top_lp.tolist(), top_code.tolist()):
                    if p == NEG_INF:
                        continue
                    nxt = head.transition(level, s, torch.tensor([c])) if level < codec.levels - 1 else None
                    pool.append(((*prefix, c), score + p, nxt))
            if level == codec.levels - 1 and verify != "none":
                pool = [c for c in pool if verifier.contains(c[0])]
            pool.sort(key=lambda c: -c[1])  # stable: ties keep proposal order
            beams = pool[:beam_width]
        out.append([(codes, score) for codes, score, _ in beams])
    return out


# --- the decoder ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NezhaParams(BeamParams):
    verify: str = "final"  # final | every | none (NEZHA-4)

    def validate(self) -> None:
        super().validate()
        if self.verify not in VERIFY_MODES:
            raise UserInputError(f"`verify` must be one of {list(VERIFY_MODES)}, got {self.verify!r}")


def head_prompts(
    ctx: DecoderContext, histories: list[list[int]], timer: PhaseTimer
) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts, ending with the placeholders <SP_1>..<SP_L> when the head reads their states."""
    tokens, mask = timed_prompts(ctx, histories, timer)
    if ctx.draft_head.config.needs_placeholders:
        with timer.phase("system"):
            sp = ctx.draft_head.config.placeholders(ctx.codec)
            tokens, mask = append_placeholders(tokens, mask, sp)
    return tokens, mask


def decode_with_head(ctx: DecoderContext, histories: list[list[int]], params: NezhaParams) -> DecodeResult:
    """The template's steps around NEZHA's own search: prompts, one prefill, the head's beam search,
    finish and result (the decoder class declares the head, so `decode` checked it is there)."""
    head = ctx.draft_head
    codec, cfg = ctx.codec, head.config
    timer = PhaseTimer(ctx.device)
    tokens, mask = head_prompts(ctx, histories, timer)
    with timer.phase("system"):
        prefixes = ctx.index.prefix_sets() if params.verify != "none" else None
        constraint = []
        if params.constrained:
            constraint.append(ConstraintProcessor(ctx.constraints.mask_backend(params, ctx.device)))
    with timer.phase("prefill"):
        out = ctx.model.prefill(tokens, mask, return_all_hidden=cfg.needs_placeholders)
        states = head_states(out.all_hidden, cfg) if cfg.needs_placeholders else out.hidden[:, None]
    with torch.no_grad():
        res = head_beam_search(head, states, params.beam_width, codec, prefixes, params.verify, constraint)
    top = finish_timed(ctx, timer, res.codes, res.scores, params.k)
    returned_valid = int(top.valid.sum())
    timings = dict(timer.ms)
    timings["draft"] = res.draft_ms
    timings["verify"] = res.verify_ms
    timings["decode"] = res.draft_ms + res.verify_ms  # the paper's LT = prefill + decode
    drafts_valid = res.drafts_valid if params.verify == "final" else returned_valid
    counters = {
        "model_calls": 1,
        "beams": params.beam_width,
        "candidates": len(histories) * params.k,
        "drafts_valid": drafts_valid,
        "returned_valid": returned_valid,
    }
    return decode_result(top, timings, counters)


class NezhaDecoder(RegisteredDecoder):
    name: ClassVar[str] = "nezha"
    description: ClassVar[str] = (
        "self-drafting: placeholder states + a draft head beam-search the SID in one "
        "prefill, valid-SID hash filter (NEZHA)"
    )
    reads_backbone: ClassVar[bool] = False  # its own head (or none), not next-token logits
    Params: ClassVar[type] = NezhaParams
    needs: ClassVar[tuple[Need, ...]] = (NEZHA_HEAD,)

    def run(self, ctx: DecoderContext, histories: list[list[int]], params: NezhaParams) -> DecodeResult:
        return decode_with_head(ctx, histories, params)
