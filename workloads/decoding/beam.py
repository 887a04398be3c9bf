"""Plain beam search over semantic IDs, batched over users and beams.

Step l only considers the T_l tokens of SID level l (a slice of the vocabulary, see sid_codec),
scored by the model's full-vocabulary log-softmax, as Hugging Face beam search with a per-level
logits processor does. One prefill per user, then L - 1 cached steps of batch x beam rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from genrec.workloads.decoding.base import DecoderContext, DecodeResult, PhaseTimer, register_decoder
from genrec.workloads.errors import UserInputError


@dataclass
class BeamParams:
    beam_width: int = 10
    k: int = 10  # items returned per user (<= beam_width)

    def validate(self) -> None:
        if self.beam_width < 1:
            raise UserInputError(f"beam_width must be >= 1, got {self.beam_width}")
        if not 1 <= self.k <= self.beam_width:
            raise UserInputError(f"k must be between 1 and beam_width ({self.beam_width}), got {self.k}")


def level_log_probs(logits: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Full-vocabulary log-softmax, restricted to one level's token range."""
    return torch.log_softmax(logits.float(), dim=-1)[..., start:end]


@register_decoder
class BeamSearch:
    name: ClassVar[str] = "beam"
    Params: ClassVar[type] = BeamParams

    def decode(self, ctx: DecoderContext, histories: list[list[int]], params: BeamParams) -> DecodeResult:
        params.validate()
        timer = PhaseTimer(ctx.device)
        codec, model, w = ctx.codec, ctx.model, params.beam_width
        with timer.phase("system"):
            tokens, mask = ctx.prompts(histories)
        b = tokens.shape[0]
        with timer.phase("prefill"):
            out = model.prefill(tokens, mask)
        forward_ms = 0.0
        with timer.phase("decode"):
            cache = out.cache.expand(w, codec.levels - 1)
            lp = level_log_probs(out.logits, *codec.level_range(0))  # [B, T_1]
            first = min(w, lp.shape[-1])
            scores, code = lp.topk(first, dim=-1)
            if first < w:  # fewer first-level codes than beams: fill with impossible beams
                scores = torch.cat([scores, scores.new_full((b, w - first), float("-inf"))], dim=1)
                code = torch.cat([code, code.new_zeros(b, w - first)], dim=1)
            codes = code[..., None]  # [B, W, 1]
            rows = torch.arange(b, device=tokens.device)[:, None] * w
            for level in range(1, codec.levels):
                step_tokens = (codes[:, :, -1] + codec.level_offset(level - 1)).reshape(-1)
                inner = PhaseTimer(ctx.device)
                with inner.phase("forward"):
                    logits = model.step(step_tokens, cache).logits
                forward_ms += inner.ms["forward"]
                t = codec.codebook_sizes[level]
                cand = scores[:, :, None] + level_log_probs(logits, *codec.level_range(level)).view(b, w, t)
                scores, flat = cand.view(b, w * t).topk(w, dim=-1)
                parent, code = flat // t, flat % t
                codes = torch.cat(
                    [codes.gather(1, parent[..., None].expand(-1, -1, level)), code[..., None]], dim=2
                )
                if level < codec.levels - 1:
                    cache.reorder((rows + parent).reshape(-1))
        with timer.phase("system"):
            top_codes, top_scores = codes[:, : params.k], scores[:, : params.k]
            item_ids, valid = ctx.index.lookup(top_codes)
            valid &= torch.isfinite(top_scores)
        timings = dict(timer.ms)
        timings["decode_forward"] = forward_ms  # model time inside decode; the rest is search overhead
        return DecodeResult(
            top_codes, top_scores, item_ids, valid, timings, {"model_calls": codec.levels, "beams": w}
        )
