"""CUDA peak memory of one real decode per decoder (xgr, beam, hf_beam) at each beam width.

    python -m genrec.studies.xgr.xgr_peak_memory --device cuda --size small --beams 16 128 512 \\
        --users 1 --out peak.json

xGR's claim is about the decode state: one prompt cache per user plus a per-beam cache of the decoded
steps, against a per-beam-copied cache (Hugging Face's beam search). `xgr_memory` counts tensor bytes on
the CPU; this driver measures what the allocator saw: for each decoder and width, one warm-up decode
(so HF's copy of the weights and every lazily built buffer exist before the clock starts), then
`torch.cuda.reset_peak_memory_stats`, one decode, and peak = max_memory_allocated - memory_allocated
before it. The model has random weights (memory does not depend on them) and a random SID catalogue.
On a CPU the decodes still run, so the driver is dry-run in CI, and the peaks are null.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

import numpy as np
import torch

from genrec.studies.common.measured_decode import measured_decode
from genrec.workloads.decoding.base import DecoderContext
from genrec.workloads.errors import UserInputError, run_main
from genrec.workloads.io import atomic_write_text
from genrec.workloads.models.model_config import model_config_for
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.results import command_line, current_environment
from genrec.workloads.sid_codec import SIDCodec

DECODERS = ("xgr", "beam", "hf_beam")


def random_context(
    size: str, levels: int, codebook: int, items: int, device: str, seed: int
) -> DecoderContext:
    """A random-weight model of `size` over a random catalogue of `items` SIDs."""
    codec = SIDCodec((codebook,) * levels)
    if items > codec.num_sids:
        raise UserInputError(f"--items {items} exceeds the {codec.num_sids} SIDs of {levels} x {codebook}")
    rng = np.random.default_rng(seed)
    codes = codec.keys_to_codes(rng.choice(codec.num_sids, size=items, replace=False))
    torch.manual_seed(seed)
    model = GRTransformer(model_config_for(size, codec.vocab_size, max_seq_len=512))
    return DecoderContext(model.to(device).eval(), codec, codes, max_items=20)


def peak_point(ctx: DecoderContext, decoder: str, beams: int, histories: list[list[int]], k: int) -> dict:
    """One warm-up decode, then the measured one: peak bytes above what was allocated before it."""
    measured_decode(ctx, decoder, beams, histories, k)
    m = measured_decode(ctx, decoder, beams, histories, k)
    return {
        "decoder": decoder,
        "beam_width": beams,
        "peak_bytes": m.peak_bytes,
        "ms": m.ms,
        "top1_item": int(m.result.item_ids[0, 0]),
    }


def ratios(points: list[dict]) -> dict[str, float | None]:
    """hf_beam's peak over xgr's (and beam's over xgr's) per width: `hf_over_xgr_bw512` and so on."""
    by = {(p["decoder"], p["beam_width"]): p["peak_bytes"] for p in points}
    out: dict[str, float | None] = {}
    for (decoder, beams), peak in sorted(by.items()):
        if decoder == "xgr":
            continue
        base = by.get(("xgr", beams))
        out[f"{decoder.replace('_beam', '')}_over_xgr_bw{beams}"] = peak / base if peak and base else None
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", default="small", help="model size (tiny, small, base)")
    p.add_argument("--levels", type=int, default=3)
    p.add_argument("--codebook", type=int, default=256)
    p.add_argument("--items", type=int, default=20000)
    p.add_argument("--beams", type=int, nargs="+", default=[16, 128, 512])
    p.add_argument("--users", type=int, default=1, help="histories per decode")
    p.add_argument("--history", type=int, default=20, help="items per history")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--decoders", nargs="+", default=list(DECODERS), choices=DECODERS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        raise UserInputError("--device cuda: no CUDA device here; pass --device cpu for a dry run")
    ctx = random_context(a.size, a.levels, a.codebook, a.items, a.device, a.seed)
    rng = np.random.default_rng(a.seed)
    histories = [rng.integers(0, a.items, size=a.history).tolist() for _ in range(a.users)]
    points = []
    for beams in a.beams:
        for decoder in a.decoders:
            points.append(peak_point(ctx, decoder, beams, histories, a.k))
            print(json.dumps(points[-1]), flush=True)
    out = {
        "command": command_line("genrec.studies.xgr.xgr_peak_memory", argv),
        "environment": asdict(current_environment(ctx.device)),
        "points": points,
        "ratios": ratios(points),
    }
    if a.out:
        atomic_write_text(a.out, json.dumps(out, indent=1, default=str))
    return out


if __name__ == "__main__":
    run_main(main)
