"""Multi-token prediction (MTP) baseline: L parallel heads on the last hidden state, one prefill.

The heads' level distributions are independent given the prompt, so the beam search over their
product (decoding/nezha.py's `head_beam_search`, K x K candidates per step, keep K) finds the top-K
SIDs of the product distribution. Verification is NEZHA's (final / every / none).
"""

from __future__ import annotations

from typing import ClassVar

from genrec.workloads.decoding.base import DecoderContext, DecodeResult, register_decoder
from genrec.workloads.decoding.nezha import NezhaParams, decode_with_head


@register_decoder
class MTPDecoder:
    name: ClassVar[str] = "mtp"
    Params: ClassVar[type] = NezhaParams

    def decode(self, ctx: DecoderContext, histories: list[list[int]], params: NezhaParams) -> DecodeResult:
        return decode_with_head(ctx, histories, params, "mtp")
