"""Most-popular baseline: the same top-K for every user, the train split's most frequent items.

It runs through the same evaluation as the model decoders, as a sanity floor for quality.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from genrec.workloads.decoding.base import DecoderContext, DecodeResult, PhaseTimer, RegisteredDecoder
from genrec.workloads.decoding.needs import POPULARITY, Need
from genrec.workloads.decoding.params import DecoderParams


@dataclass(frozen=True)
class PopularParams(DecoderParams):
    """Only k: the most popular items are the same for every user."""


class MostPopular(RegisteredDecoder):
    name: ClassVar[str] = "popular"
    Params: ClassVar[type] = PopularParams
    needs: ClassVar[tuple[Need, ...]] = (POPULARITY,)

    def run(self, ctx: DecoderContext, histories: list[list[int]], params: PopularParams) -> DecodeResult:
        timer = PhaseTimer(ctx.device)
        with timer.phase("decode"):
            k = min(params.k, len(ctx.popularity))
            top = np.argsort(-ctx.popularity, kind="stable")[:k]
            b = len(histories)
            ids = torch.from_numpy(top).to(ctx.device).expand(b, k)
            codes = torch.from_numpy(ctx.item_codes[top]).to(ctx.device).expand(b, k, -1)
            scores = (
                torch.from_numpy(np.log1p(ctx.popularity[top]).astype(np.float32)).to(ctx.device).expand(b, k)
            )
        return DecodeResult(
            codes, scores, ids, torch.ones(b, k, dtype=torch.bool), dict(timer.ms), {"model_calls": 0}
        )
