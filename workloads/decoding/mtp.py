"""Multi-token prediction (MTP) baseline: L parallel heads on the last hidden state, one prefill.

The heads' level distributions are independent given the prompt, so the beam search over their
product (decoding/nezha.py's `head_beam_search`, K x K candidates per step, keep K) finds the top-K
SIDs of the product distribution. Verification is NEZHA's (final / every / none).
"""

from __future__ import annotations

from typing import ClassVar

from genrec.workloads.decoding.base import DecoderContext, DecodeResult, RegisteredDecoder
from genrec.workloads.decoding.needs import MTP_HEAD, Need
from genrec.workloads.decoding.nezha import NezhaParams, decode_with_head


class MTPDecoder(RegisteredDecoder):
    name: ClassVar[str] = "mtp"
    Params: ClassVar[type] = NezhaParams
    needs: ClassVar[tuple[Need, ...]] = (MTP_HEAD,)

    def run(self, ctx: DecoderContext, histories: list[list[int]], params: NezhaParams) -> DecodeResult:
        return decode_with_head(ctx, histories, params)
