"""One decode of a registered decoder, timed and (on CUDA) with its peak memory: what the per-width GPU
drivers (xgr_peak_memory, qwen3_shaped) each measure per point."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from genrec.workloads.decoding.base import DecodeResult, get_decoder, make_params


@dataclass(frozen=True)
class MeasuredDecode:
    ms: float
    peak_bytes: int | None  # CUDA max_memory_allocated above what was allocated before; None on a CPU
    result: DecodeResult


def measured_decode(ctx, decoder: str, beams: int, histories: list[list[int]], k: int) -> MeasuredDecode:
    """Decode `histories` at width `beams` (k = min(k, beams)), synchronising the device around the clock."""
    dec = get_decoder(decoder)
    params = make_params(dec, {"beam_width": beams, "k": min(k, beams)})
    cuda = ctx.device.type == "cuda"
    with torch.inference_mode():
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        result = dec.decode(ctx, histories, params)
        if cuda:
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
    peak = torch.cuda.max_memory_allocated() - before if cuda else None
    return MeasuredDecode(ms, peak, result)
