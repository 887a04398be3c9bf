"""A Qwen3-0.6B-shaped checkpoint with SID tokens, imported, decoded by beam / xgr / hf_beam per beam width:
users/s, P99 batch latency and CUDA peak memory (the GPU check's `imported_qwen3` step).

    python -m genrec.studies.beam.qwen3_shaped --device cuda --beams 16 64 128 256 512 --out q3.json
    python -m genrec.studies.beam.qwen3_shaped --device cpu --tiny --beams 8 16 --out q3.json   # dry run

The checkpoint has random weights (speed and memory do not depend on them): Qwen3-0.6B's shape (28
layers, 1024 wide, 16 query / 8 key-value heads of 128, tied embeddings, 151,936 rows) in bf16, with 3 x
256 LC-Rec SID tokens and a random catalogue, built by transformers and imported as `genrec model import
hf` does. Per width and decoder: one warm-up batch, then `--repeats` timed batches of `--users`
histories; peak = CUDA max_memory_allocated above what was allocated before the timed batches (null on
a CPU). The arms alternate per repeat so drift hits them alike.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from genrec.studies.common.measured_decode import measured_decode
from genrec.studies.common.random_hf import QWEN3_0_6B, TINY, build_random_hf, random_items, write_index
from genrec.workloads.errors import UserInputError, run_main
from genrec.workloads.evaluation import load_imported_context
from genrec.workloads.io import atomic_write_text
from genrec.workloads.models.hf_checkpoint import import_hf_checkpoint
from genrec.workloads.results import command_line, current_environment

DECODERS = ("beam", "xgr", "hf_beam")


def decode_state_table(beams: list[int], prompt_len: int = 256, levels: int = 3) -> list[dict]:
    """Decode-state bytes of the Qwen3-0.6B shape per width, ours (shared prompt + per-beam steps) against
    HF's per-beam cache (workloads/models/decode_state.py: arithmetic from the config, bf16)."""
    from genrec.workloads.models.decode_state import decode_state_bytes
    from genrec.workloads.models.hf_config import hf_model_config

    raw = {
        **QWEN3_0_6B,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 151_936,
        "torch_dtype": "bfloat16",
    }
    cfg, _ = hf_model_config(raw)
    rows = []
    for w in beams:
        b = decode_state_bytes(cfg, users=1, beams=w, prompt_len=prompt_len, steps=levels - 1, elem_bytes=2)
        rows.append(
            {"beam_width": w, "ours_mb": b.ours / 2**20, "hf_mb": b.hf_per_beam / 2**20, "ratio": b.ratio}
        )
    return rows


def imported_context(work: Path, tiny: bool, device: str, seed: int):
    """Build, import and load the checkpoint; returns (DecoderContext, number of items)."""
    sizes, items, dtype = ((16, 16, 16), 300, "float32") if tiny else ((256, 256, 256), 20000, "bfloat16")
    src = build_random_hf(
        work / "hf",
        "Qwen3Config",
        "Qwen3ForCausalLM",
        TINY if tiny else QWEN3_0_6B,
        sizes,
        dtype,
        seed,
        vocab=None if tiny else 151_936,
    )
    index = write_index(random_items(sizes, items, seed), work / "items.index.json")
    import_hf_checkpoint(src, index, work / "imported", "lcrec", None, dtype)
    ctx, _ = load_imported_context(work / "imported", device)
    return ctx, items


def width_point(ctx, beams: int, batches: list[list[list[int]]], k: int) -> list[dict]:
    """Every decoder at one width: warm-up, then the timed batches with the decoders alternating."""
    ms: dict[str, list[float]] = {d: [] for d in DECODERS}
    peak: dict[str, int | None] = {}
    for d in DECODERS:  # lazy buffers and HF's copy of the weights exist before timing
        measured_decode(ctx, d, beams, batches[0], k)
    for rep, batch in enumerate(batches):
        order = DECODERS[rep % 3 :] + DECODERS[: rep % 3]
        for d in order:
            m = measured_decode(ctx, d, beams, batch, k)
            ms[d].append(m.ms)
            peak.setdefault(d, m.peak_bytes)  # the first timed batch's
    users = len(batches[0])
    return [
        {
            "decoder": d,
            "beam_width": beams,
            "users_per_s": users / (np.median(ms[d]) / 1e3),
            "median_ms": float(np.median(ms[d])),
            "p99_ms": float(np.percentile(ms[d], 99)),
            "peak_bytes": peak[d],
        }
        for d in DECODERS
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="a tiny Qwen3 shape and catalogue (the CPU dry run)")
    p.add_argument("--beams", type=int, nargs="+", default=[16, 64, 128, 256, 512])
    p.add_argument("--users", type=int, default=8, help="histories per batch")
    p.add_argument("--repeats", type=int, default=3, help="timed batches per decoder and width")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default=None, help="where the checkpoint is built (default: a temporary folder)")
    p.add_argument("--out", default=None)
    p.add_argument(
        "--decode-state",
        action="store_true",
        help="print the decode-state bytes table of the full shape (arithmetic, no model) and stop",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    if a.decode_state:
        rows = decode_state_table(a.beams)
        for r in rows:
            print(
                f"BW {r['beam_width']:4d}: ours {r['ours_mb']:8.1f} MB  HF per-beam {r['hf_mb']:9.1f} MB  "
                f"ratio {r['ratio']:.1f}x"
            )
        return {"decode_state": rows}
    if a.device == "cuda" and not torch.cuda.is_available():
        raise UserInputError("--device cuda: no CUDA device here; pass --device cpu --tiny for a dry run")
    work = Path(a.work or tempfile.mkdtemp(prefix="genrec_qwen3_"))
    ctx, items = imported_context(work, a.tiny, a.device, a.seed)
    rng = np.random.default_rng(a.seed)
    batches = [[rng.integers(0, items, size=10).tolist() for _ in range(a.users)] for _ in range(a.repeats)]
    points = []
    for beams in a.beams:
        points += width_point(ctx, beams, batches, a.k)
        print("\n".join(json.dumps(p) for p in points[-3:]), flush=True)
    best = {
        d: max(p["users_per_s"] for p in points if p["decoder"] == d and p["beam_width"] == max(a.beams))
        for d in DECODERS
    }
    out = {
        "command": command_line("genrec.studies.beam.qwen3_shaped", argv),
        "environment": asdict(current_environment(ctx.device)),
        "points": points,
        "xgr_over_hf_at_widest": best["xgr"] / best["hf_beam"],
    }
    if a.out:
        atomic_write_text(a.out, json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    run_main(main)
