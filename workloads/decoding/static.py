"""`static`: constrained beam search (STATIC) with the real KV-cached model.

The loop of `beam` (one prefill, L - 1 cached steps of batch x beam rows) with, at every level, the
constraint mask applied to the level's log-probabilities (invalid tokens -> -inf, Algorithm 1) and
each beam's trie state carried through beam reordering by the parent index. Scores are the model's
unrenormalised log-probabilities, as in beam search, so a constrained SID scores what it scores
unconstrained.

When fewer valid completions than the beam width exist, the surplus beams keep score -inf: the
result then holds fewer items: those slots are flagged missing (score -inf, valid False, item id -1,
codes -1), never filled with SIDs outside the set; `counters["missing"]` counts them.

The constraint set is chosen by `constraint`: a rule (all, random, cold_start, file, uniform; see
genrec.workloads.constraints.sets) or the name of a set registered on the context with
`register_constraint_set`. Sets and their indexes are built once per context and cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from genrec.workloads.constraints.baselines import BASELINES
from genrec.workloads.constraints.sets import (
    ConstraintSet,
    all_items,
    cold_start,
    from_file,
    random_subset,
    uniform_random,
)
from genrec.workloads.constraints.transition import build_transition_matrix
from genrec.workloads.constraints.vntk import StaticMask, apply_constraint
from genrec.workloads.decoding.base import DecoderContext, DecodeResult, PhaseTimer, register_decoder
from genrec.workloads.decoding.beam import level_log_probs
from genrec.workloads.errors import UserInputError

BUILTIN_RULES = ("all", "random", "cold_start", "file", "uniform")
KERNELS = ("torch", "triton")
BACKENDS = ("static", *BASELINES)


@dataclass
class StaticParams:
    beam_width: int = 10
    k: int = 10
    constraint: str = "all"  # a rule in BUILTIN_RULES or a set registered on the context
    constraint_size: int = 0  # n for "random" / "uniform"
    constraint_seed: int = 0
    constraint_path: str = ""  # for "file"
    dense_levels: int = 2  # d: levels served by dense tables (clipped to L - 1)
    kernel: str = "torch"  # VNTK implementation: torch or triton
    backend: str = "static"  # static, or a baseline: cpu_trie, ppv_exact, ppv_approx, hash_bitmap

    def validate(self) -> None:
        if self.beam_width < 1:
            raise UserInputError(f"beam_width must be >= 1, got {self.beam_width}")
        if not 1 <= self.k <= self.beam_width:
            raise UserInputError(f"k must be between 1 and beam_width ({self.beam_width}), got {self.k}")
        if self.dense_levels < 0:
            raise UserInputError(f"dense_levels must be >= 0, got {self.dense_levels}")
        if self.backend not in BACKENDS:
            raise UserInputError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.kernel not in KERNELS:
            raise UserInputError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if self.constraint in ("random", "uniform") and self.constraint_size < 1:
            raise UserInputError(f"constraint {self.constraint!r} needs constraint_size >= 1")
        if self.constraint == "file" and not self.constraint_path:
            raise UserInputError("constraint 'file' needs constraint_path (a .npy or text list of SIDs)")


def _cache(ctx: DecoderContext) -> dict:
    return ctx.__dict__.setdefault("_constraint_cache", {})


def register_constraint_set(ctx: DecoderContext, cset: ConstraintSet) -> None:
    """Make `cset` selectable as `constraint=cset.name` for decoders using this context."""
    if cset.name in BUILTIN_RULES:
        raise UserInputError(f"constraint set name {cset.name!r} clashes with a rule; rename it")
    if tuple(cset.codebook_sizes) != tuple(ctx.codec.codebook_sizes):
        raise UserInputError(
            f"constraint set {cset.name!r} has codebooks {cset.codebook_sizes}, the model's are "
            f"{ctx.codec.codebook_sizes}"
        )
    cache = _cache(ctx)
    cache[("set", cset.name)] = cset
    for key in [k for k in cache if k[0] == "mask" and k[1] == cset.name]:
        del cache[key]


def constraint_set_for(ctx: DecoderContext, p: StaticParams) -> ConstraintSet:
    cache = _cache(ctx)
    if p.constraint not in BUILTIN_RULES:
        if ("set", p.constraint) not in cache:
            registered = sorted(k[1] for k in cache if k[0] == "set")
            raise UserInputError(
                f"unknown constraint {p.constraint!r}: use a rule {BUILTIN_RULES} "
                f"or a registered set {registered}"
            )
        return cache[("set", p.constraint)]
    key = ("rule", p.constraint, p.constraint_size, p.constraint_seed, p.constraint_path)
    if key not in cache:
        codec, items = ctx.codec, ctx.item_codes
        if p.constraint == "all":
            cset = all_items(codec, items)
        elif p.constraint == "random":
            cset = random_subset(codec, items, p.constraint_size, p.constraint_seed)
        elif p.constraint == "cold_start":
            if ctx.popularity is None:
                raise UserInputError("constraint 'cold_start' needs train counts (the context's popularity)")
            cset = cold_start(codec, items, ctx.popularity)
        elif p.constraint == "file":
            cset = from_file(codec, p.constraint_path)
        else:
            cset = uniform_random(codec, p.constraint_size, p.constraint_seed)
        cache[key] = cset
    return cache[key]


def static_mask_for(ctx: DecoderContext, p: StaticParams) -> tuple[ConstraintSet, object, int]:
    """The constraint set and its mask backend (built once per context, set, d, backend, kernel)."""
    cset = constraint_set_for(ctx, p)
    d = min(p.dense_levels, ctx.codec.levels - 1)
    key = ("mask", cset.name, id(cset), d, p.backend, p.kernel, str(ctx.device))
    cache = _cache(ctx)
    if key not in cache:
        if p.backend == "static":
            cache[key] = StaticMask(build_transition_matrix(cset, d).to(ctx.device), p.kernel)
        else:
            cache[key] = BASELINES[p.backend](cset, ctx.device)
    return cset, cache[key], d


@torch.no_grad()
def constrained_beam_search(
    ctx: DecoderContext, histories: list[list[int]], beam_width: int, k: int, backend: object
) -> DecodeResult:
    """Beam search with the backend's constraint applied to every level's log-probs (apply_constraint).

    `backend` is any mask backend: StaticMask or one of genrec.workloads.constraints.baselines."""
    timer = PhaseTimer(ctx.device)
    codec, model, w = ctx.codec, ctx.model, beam_width
    with timer.phase("system"):
        tokens, attn = ctx.prompts(histories)
    b = tokens.shape[0]
    dev = tokens.device
    with timer.phase("prefill"):
        out = model.prefill(tokens, attn)
    forward_ms = mask_ms = 0.0
    neg_inf = float("-inf")
    with timer.phase("decode"):
        cache = out.cache.expand(w, codec.levels - 1)
        inner = PhaseTimer(ctx.device)
        lp = level_log_probs(out.logits, *codec.level_range(0))
        with inner.phase("mask"):
            state = backend.init_state(b, dev)  # one row per user before the first step
            lp, aux = apply_constraint(backend, 0, state, lp)
        first = min(w, lp.shape[-1])
        scores, code = lp.topk(first, dim=-1)
        if first < w:
            scores = torch.cat([scores, scores.new_full((b, w - first), neg_inf)], dim=1)
            code = torch.cat([code, code.new_zeros(b, w - first)], dim=1)
        with inner.phase("mask"):
            parent0 = torch.arange(b, device=dev).repeat_interleave(w)
            state = backend.advance(0, state, aux, parent0, code.reshape(-1))
        codes = code[..., None]
        rows = torch.arange(b, device=dev)[:, None] * w
        for level in range(1, codec.levels):
            step_tokens = (codes[:, :, -1] + codec.level_offset(level - 1)).reshape(-1)
            with inner.phase("forward"):
                logits = model.step(step_tokens, cache).logits
            t = codec.codebook_sizes[level]
            lp = level_log_probs(logits, *codec.level_range(level))
            with inner.phase("mask"):
                lp, aux = apply_constraint(backend, level, state, lp)
            cand = scores[:, :, None] + lp.view(b, w, t)
            scores, flat = cand.view(b, w * t).topk(w, dim=-1)
            parent, code = flat // t, flat % t
            codes = torch.cat(
                [codes.gather(1, parent[..., None].expand(-1, -1, level)), code[..., None]], dim=2
            )
            src = (rows + parent).reshape(-1)
            if level < codec.levels - 1:
                with inner.phase("mask"):
                    state = backend.advance(level, state, aux, src, code.reshape(-1))
                cache.reorder(src)
        forward_ms = inner.ms.get("forward", 0.0)
        mask_ms = inner.ms.get("mask", 0.0)
    with timer.phase("system"):
        top_codes, top_scores = codes[:, :k], scores[:, :k]
        found = torch.isfinite(top_scores)
        item_ids, in_catalogue = ctx.index.lookup(top_codes.clamp(min=0))
        top_codes = torch.where(found[..., None], top_codes, -1)
        item_ids = torch.where(found, item_ids, -1)
        valid = found & in_catalogue
    timings = dict(timer.ms)
    timings["decode_forward"] = forward_ms
    timings["decode_mask"] = mask_ms  # constraint masking + trie-state advance, inside decode
    counters = {"model_calls": codec.levels, "beams": w, "missing": int((~found).sum())}
    return DecodeResult(top_codes, top_scores, item_ids, valid, timings, counters)


@register_decoder
class StaticDecoder:
    name: ClassVar[str] = "static"
    Params: ClassVar[type] = StaticParams

    def decode(self, ctx: DecoderContext, histories: list[list[int]], params: StaticParams) -> DecodeResult:
        params.validate()
        _, backend, _ = static_mask_for(ctx, params)
        return constrained_beam_search(ctx, histories, params.beam_width, params.k, backend)
