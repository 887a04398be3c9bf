"""NEZHA decoding (paper Algorithm 3, lines 13-30): one prefill, beam search over the draft head only,
model-free verification against the set of valid SIDs on the device.

One prefill of [history, <SP_1>..<SP_L>] gives h_0..h_L for every user of the batch. Step l then
scores, for every beam, its level-l codes with the head (no backbone call), takes each beam's top K
codes (K x K candidates per user), and keeps the K with the largest cumulative log-probability;
each kept beam's context state advances through the head's transition with its chosen code.

Verification (eq. 4/5) uses the mixed-radix keys of sid_codec. The valid set is ItemIndex's sorted
int64 key tensor on the decoding device, so a membership test is one searchsorted per batch:
    verify="final"  the K x K final candidates are filtered, the top K valid ones kept (the paper)
    verify="every"  additionally, each step's codes are masked to valid prefixes before the top K,
                    using one sorted tensor of valid prefix keys per level (built once per index)
    verify="none"   no filtering (NEZHA-4); validity is still looked up for reporting
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
    ItemIndex,
    PhaseTimer,
    register_decoder,
)
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.nezha_head import DraftHead, append_placeholders, get_head, head_states
from genrec.workloads.sid_codec import SIDCodec

VERIFY_MODES = ("final", "every", "none")
NEG_INF = float("-inf")


# --- the verification set -------------------------------------------------------------------------
class PrefixKeySets:
    """Sorted int64 keys of every valid SID prefix, one tensor per level, on the index's device.

    With the codec's big-endian mixed radix, the key of a SID's first l+1 codes is its full key
    integer-divided by prod_{j > l} T_j, and it grows step by step as key * T_{l+1} + code. The last
    level's tensor is the valid-SID set itself (ItemIndex.keys).
    """

    def __init__(self, index: ItemIndex, max_child_table: int = 1 << 26) -> None:
        self.codec = index.codec
        w = self.codec.radix_weights()
        keys = index.keys
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


def prefix_sets(index: ItemIndex) -> PrefixKeySets:
    """Built once per ItemIndex (the catalogue) and kept on it, so every batch reuses it."""
    sets = index.__dict__.get("_prefix_key_sets")
    if sets is None:
        sets = index.__dict__["_prefix_key_sets"] = PrefixKeySets(index)
    return sets


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
    drafts_valid: int  # valid SIDs among the unverified top K (summed over users)
    verify_ms: float
    draft_ms: float


def head_beam_search(
    head: DraftHead,
    states: torch.Tensor,
    beam_width: int,
    codec: SIDCodec,
    prefixes: PrefixKeySets | None,
    verify: str = "final",
) -> HeadSearchOutput:
    """Beam search over the head's own probabilities, batched over users and beams.

    states [B, L+1, D] (or [B, 1, D] for heads that read only h_0). At every step each beam
    proposes its top K codes (K x K candidates per user) and the best K cumulative scores survive.
    `prefixes` is needed unless verify == "none".
    """
    if verify not in VERIFY_MODES:
        raise UserInputError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
    if verify != "none" and prefixes is None:
        raise ValueError("verification needs the prefix key sets")
    device = states.device
    timer = PhaseTimer(device)
    b, levels, k = states.shape[0], codec.levels, beam_width
    with timer.phase("draft"):
        w = 1  # beams per user so far (one empty beam)
        scores = torch.zeros(b, 1, device=device)
        codes = torch.zeros(b, 1, 0, dtype=torch.long, device=device)
        pkeys = torch.zeros(b, 1, dtype=torch.long, device=device)  # prefix keys of each beam
        s = head.init_state(states)  # [B, D] or None (one row per beam: B*w rows)
    drafts_valid = 0
    for level in range(levels):
        t = codec.codebook_sizes[level]
        with timer.phase("draft"):
            lp = torch.log_softmax(head.beam_logits(level, states, s, w).float(), dim=-1)  # [B, w, t]
        if verify == "every":
            with timer.phase("verify"):
                lp = prefixes.mask_invalid_children(level, pkeys, lp)  # [B, w, t]
        with timer.phase("draft"):
            kk = min(k, t)
            top_lp, top_code = lp.topk(kk, dim=-1)  # each beam's top K codes: [B, w, kk]
            cand = (scores[:, :, None] + top_lp).view(b, w * kk)
            cand_keys = (pkeys[:, :, None] * t + top_code).view(b, w * kk)  # mixed-radix prefix keys
        last = level == levels - 1
        if last:
            with timer.phase("verify"):
                valid = prefixes.contains(level, cand_keys) if prefixes is not None else None
            with timer.phase("draft"):
                keep = min(k, w * kk)
                if valid is not None:  # what the drafts would return unverified (NEZHA-4's list)
                    _, raw = cand.topk(keep, dim=-1)
                    drafts_valid = int((valid.gather(1, raw) & torch.isfinite(cand.gather(1, raw))).sum())
            if verify != "none":
                with timer.phase("verify"):
                    cand = cand.masked_fill(~valid, NEG_INF)
        with timer.phase("draft"):
            keep = min(k, w * kk)
            new_scores, flat = cand.topk(keep, dim=-1)
            parent = flat // kk
            code = top_code.view(b, w * kk).gather(1, flat)
            codes = torch.cat([codes.gather(1, parent[..., None].expand(-1, -1, level)), code[..., None]], 2)
            pkeys = cand_keys.gather(1, flat)
            if not last:
                rows = (torch.arange(b, device=device)[:, None] * w + parent).reshape(-1)
                s_parent = s.index_select(0, rows) if s is not None else None
                s = head.transition(level, s_parent, code.reshape(-1))
            scores, w = new_scores, keep
    if w < k:  # fewer candidates than K in total (tiny codebooks): pad with impossible entries
        pad = k - w
        scores = torch.cat([scores, scores.new_full((b, pad), NEG_INF)], dim=1)
        codes = torch.cat([codes, codes.new_zeros(b, pad, levels)], dim=1)
    return HeadSearchOutput(
        codes, scores, drafts_valid, timer.ms.get("verify", 0.0), timer.ms.get("draft", 0.0)
    )


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
@dataclass
class NezhaParams:
    beam_width: int = 10
    k: int = 10  # items returned per user (<= beam_width)
    verify: str = "final"  # final | every | none (NEZHA-4)

    def validate(self) -> None:
        if self.beam_width < 1:
            raise UserInputError(f"beam_width must be >= 1, got {self.beam_width}")
        if not 1 <= self.k <= self.beam_width:
            raise UserInputError(f"k must be between 1 and beam_width ({self.beam_width}), got {self.k}")
        if self.verify not in VERIFY_MODES:
            raise UserInputError(f"verify must be one of {list(VERIFY_MODES)}, got {self.verify!r}")


def require_head(ctx: DecoderContext, kind: str) -> DraftHead:
    head = get_head(ctx.model)
    if head is None or head.config.kind != kind:
        have = "no draft head" if head is None else f"a {head.config.kind!r} head"
        raise UserInputError(
            f"decoder {kind!r} needs a model trained with a {kind} head, but this checkpoint has {have}; "
            f"train one with `genrec train --objective {kind} ...`"
        )
    return head


def decode_with_head(
    ctx: DecoderContext, histories: list[list[int]], params: NezhaParams, kind: str
) -> DecodeResult:
    params.validate()
    head = require_head(ctx, kind)
    codec, cfg = ctx.codec, head.config
    timer = PhaseTimer(ctx.device)
    with timer.phase("system"):
        tokens, mask = ctx.prompts(histories)
        if cfg.needs_placeholders:
            sp = [codec.placeholder_token(l) for l in range(codec.levels)]
            tokens, mask = append_placeholders(tokens, mask, sp)
        prefixes = prefix_sets(ctx.index) if params.verify != "none" else None
    with timer.phase("prefill"):
        out = ctx.model.prefill(tokens, mask, return_all_hidden=cfg.needs_placeholders)
        states = head_states(out.all_hidden, cfg) if cfg.needs_placeholders else out.hidden[:, None]
    with torch.no_grad():
        res = head_beam_search(head, states, params.beam_width, codec, prefixes, params.verify)
    with timer.phase("system"):
        top_codes, top_scores = res.codes[:, : params.k], res.scores[:, : params.k]
        item_ids, valid = ctx.index.lookup(top_codes)
        valid &= torch.isfinite(top_scores)
        item_ids = torch.where(valid, item_ids, torch.full_like(item_ids, -1))
        returned_valid = int(valid.sum())
    timings = dict(timer.ms)
    timings["draft"] = res.draft_ms
    timings["verify"] = res.verify_ms
    timings["decode"] = res.draft_ms + res.verify_ms  # the paper's LT = prefill + decode
    b = len(histories)
    drafts_valid = res.drafts_valid if params.verify != "none" else returned_valid
    counters = {
        "model_calls": 1,
        "beams": params.beam_width,
        "candidates": b * params.k,
        "drafts_valid": drafts_valid,
        "returned_valid": returned_valid,
    }
    return DecodeResult(top_codes, top_scores, item_ids, valid, timings, counters)


@register_decoder
class NezhaDecoder:
    name: ClassVar[str] = "nezha"
    Params: ClassVar[type] = NezhaParams

    def decode(self, ctx: DecoderContext, histories: list[list[int]], params: NezhaParams) -> DecodeResult:
        return decode_with_head(ctx, histories, params, "nezha")
