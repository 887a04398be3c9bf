"""`hf_beam`: Hugging Face `generate(num_beams)` on the same weights, as a registered decoder.

The peer of `xgr` in the serving comparison (issue 17): the checkpoint is copied once per model into an
equivalent `LlamaForCausalLM` (models/hf_bridge.py) and searched with HF's beam search, whose KV cache
holds one copy of the prompt per beam (its cache is expanded to batch x beams rows before the first
step), as vLLM's beam search does; `xgr` keeps one prompt cache per user. Scores are summed
log-probabilities over the SID levels (length_penalty 0), the same scale as `beam`, so the top-K of
both agree up to ties (tests/test_hf_beam.py). Two documented differences:
- where a level has fewer codes than beams, HF keeps spare beams at scores near -1e9; they are
  reported as `beam` reports missing slots (code -1, score -inf, item -1, not valid);
- no `constraint`: HF's search knows nothing of STATIC's index, so this decoder has no constraint
  parameters (a served constraint set is simply not offered for it).

transformers is the optional `peers` extra, imported only when the decoder first runs. The HF copy is
made once per model object and kept while the model lives; it does not follow later in-place changes of
the weights (serving never changes them; re-create the context after training).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from genrec.workloads.decoding.base import DecoderContext, DecodeResult, PhaseTimer, RegisteredDecoder
from genrec.workloads.decoding.params import BeamWidthParams
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.hf_bridge import REAL_SCORE, hf_beam_search, to_hf_llama
from genrec.workloads.models.transformer import GRTransformer

if TYPE_CHECKING:  # pragma: no cover - typing only
    from transformers import LlamaForCausalLM

HF_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class HFBeamParams(BeamWidthParams):
    attn_implementation: str = "sdpa"  # HF's attention: sdpa (its default, faster on CPU) or eager

    def validate(self) -> None:
        super().validate()
        if self.attn_implementation not in HF_ATTENTION:
            raise UserInputError(
                f"`attn_implementation` must be one of {list(HF_ATTENTION)}, got {self.attn_implementation!r}"
            )


# model -> {attention: its HF copy}; weak keys, so a dropped model takes its copy with it
_HF_COPIES: weakref.WeakKeyDictionary[GRTransformer, dict[str, LlamaForCausalLM]] = (
    weakref.WeakKeyDictionary()
)


def hf_copy(model: GRTransformer, attn_implementation: str) -> LlamaForCausalLM:
    """The model's HF Llama copy for this attention, made on first use and kept."""
    copies = _HF_COPIES.setdefault(model, {})
    if attn_implementation not in copies:
        copies[attn_implementation] = to_hf_llama(model, attn_implementation=attn_implementation)
    return copies[attn_implementation]


@torch.no_grad()
def hf_generate_search(ctx: DecoderContext, histories: list[list[int]], params: HFBeamParams) -> DecodeResult:
    timer = PhaseTimer(ctx.device)
    with timer.phase("system"):
        tokens, mask = ctx.prompts(histories)
        hf = hf_copy(ctx.model, params.attn_implementation)
    with timer.phase("decode"):  # HF runs its prefill inside generate: one phase for both
        codes, scores = hf_beam_search(hf, ctx.codec, tokens, mask, params.beam_width, params.k)
    with timer.phase("system"):
        # HF's spare beams (fewer codes than beams) are no answer: missing, as `beam` reports them
        real = scores > REAL_SCORE
        codes = torch.where(real[..., None], codes, torch.full_like(codes, -1))
        scores = torch.where(real, scores, torch.full_like(scores, float("-inf")))
        item_ids, valid = ctx.index.lookup(codes.clamp(min=0))
        valid = valid & real
        item_ids = torch.where(real, item_ids, torch.full_like(item_ids, -1))
    counters = {"beams": params.beam_width, "missing": int((~real).sum())}
    return DecodeResult(codes, scores, item_ids, valid, dict(timer.ms), counters)


class HFBeamDecoder(RegisteredDecoder):
    name: ClassVar[str] = "hf_beam"
    Params: ClassVar[type] = HFBeamParams

    def run(self, ctx: DecoderContext, histories: list[list[int]], params: HFBeamParams) -> DecodeResult:
        return hf_generate_search(ctx, histories, params)
