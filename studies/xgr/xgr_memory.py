"""xGR's KV layout on CPU: decode-state memory vs a per-beam-copied cache, and the per-step reorder cost.

    python -m genrec.studies.xgr.xgr_memory --size small --prompt 100 --levels 4 --codebook 256 \\
        --beams 32 64 128 256 512 --batch 1 --repeats 20 --threads 1 [--out docs/results/xgr_memory_cpu.json]

Memory (tensor bytes of the tensors a decode holds, allocated for real): a prefill of `--batch` prompts
of `--prompt` tokens through a `--size` model, then
    xgr        the prompt cache once per user + the lent per-beam storage of L - 1 decoded steps, its
               row table and the selection buffers (xgr.DecodeBuffers), as `xgr` decodes;
    beam       the same layout without the table (the copying reorder); its reorder also allocates a
               transient copy of one layer's decoded steps;
    hf         a per-beam-copied cache (Hugging Face / vLLM beam search): every beam row holds the
               prompt and its steps, [B*W, H, S + L - 1, hd] per layer for K and V; its reorder
               (index_select per layer) allocates one more layer transiently.
The decode state counts K/V storage and decoder buffers; weights, activations and logits (the same
for all three) are left out. Ratios are hf / xgr.

Reorder (time per decode step, the `torch` attention backend): the same L - 1 steps with random
parents through KVCache.expand(indexed=False) (copy: every layer's decoded steps are permuted, four
passes of [B*W, H, t, hd] per K and V: index_select read + write, assignment read + write) and
expand(indexed=True) (index: one [B*W, t] int table permuted for all layers; the torch backend then
gathers each layer's steps inside attention, two passes; the Triton kernel reads through the table
and moves nothing). Times: the reorder call alone, and reorder + model.step, median over repeats, the
two layouts alternated. `bytes_*` are those pass counts times the tensor sizes, per step summed over
the L - 1 steps.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from genrec.studies.common.options import add_shared_options
from genrec.workloads.decoding.xgr import DecodeBuffers
from genrec.workloads.errors import run_main
from genrec.workloads.io import atomic_write_text
from genrec.workloads.models.kv_cache import KVCache
from genrec.workloads.models.model_config import model_config_for
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.results import command_line, current_environment
from genrec.workloads.sid_codec import SIDCodec


def nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def prompt_bytes(cache: KVCache) -> int:
    return nbytes([*cache.prefix_k, *cache.prefix_v, cache.prefix_mask, cache.prefix_len])


def memory_point(model: GRTransformer, prompt: KVCache, batch: int, beams: int, levels: int) -> dict:
    cfg = model.config
    steps = levels - 1
    bufs = DecodeBuffers.build(model, batch, beams, levels)
    xgr_cache = prompt.expand(beams, steps, True, (bufs.beam_k, bufs.beam_v, bufs.beam_rows))
    xgr_bytes = prompt_bytes(xgr_cache) + bufs.nbytes()
    copy_cache = prompt.expand(beams, steps)
    layer_steps = nbytes([copy_cache.beam_k[0]])  # one layer's K (or V) steps: the reorder's transient
    beam_bytes = prompt_bytes(copy_cache) + nbytes([*copy_cache.beam_k, *copy_cache.beam_v])
    # the per-beam-copied cache, built for real: each beam row holds its user's prompt and its steps
    hf = [
        torch.cat([p.repeat_interleave(beams, 0), torch.zeros_like(b)], dim=2)
        for p, b in zip([*prompt.prefix_k, *prompt.prefix_v], [*copy_cache.beam_k, *copy_cache.beam_v])
    ]
    hf_bytes = nbytes(hf) + nbytes([prompt.prefix_mask.repeat_interleave(beams, 0)])
    hf_layer = nbytes([hf[0]])
    del hf
    return {
        "beams": beams,
        "batch": batch,
        "prompt_tokens": int(prompt.prefix_mask.shape[1]),
        "layers": cfg.n_layers,
        "xgr_bytes": xgr_bytes,
        "beam_bytes": beam_bytes,
        "beam_peak_bytes": beam_bytes + 2 * layer_steps,
        "hf_bytes": hf_bytes,
        "hf_peak_bytes": hf_bytes + 2 * hf_layer,
        "hf_over_xgr": hf_bytes / xgr_bytes,
        "hf_peak_over_xgr": (hf_bytes + 2 * hf_layer) / xgr_bytes,
    }


def reorder_bytes(rows: int, heads: int, head_dim: int, layers: int, steps: int, elem: int) -> dict:
    """Bytes moved per decode, summed over the steps (see the module doc for the pass counts)."""
    copy = index_table = index_gather = 0
    for t in range(1, steps):  # reorders happen before steps 1..L-2 (step 0 follows the expand)
        slab = rows * heads * t * head_dim * elem
        copy += 4 * slab * 2 * layers
        index_table += 4 * rows * t * 8
        index_gather += 2 * rows * heads * (t + 1) * head_dim * elem * 2 * layers
    return {"bytes_copy": copy, "bytes_index_table": index_table, "bytes_index_torch_gather": index_gather}


def decode_steps(
    model: GRTransformer, prompt: KVCache, beams: int, steps: int, indexed: bool, gen: torch.Generator
) -> tuple[float, float]:
    """(reorder ns, reorder + step ns) summed over one decode's steps, with random parents."""
    b = prompt.batch
    rows = b * beams
    cache = prompt.expand(beams, steps, indexed)
    users = torch.arange(b)[:, None] * beams
    reorder_ns = total_ns = 0
    for t in range(steps):
        parent = (torch.randint(0, beams, (b, beams), generator=gen) + users).reshape(-1)
        tokens = torch.randint(3, model.config.vocab_size, (rows,), generator=gen)
        t0 = time.perf_counter_ns()
        if t:
            cache.reorder(parent)
        t1 = time.perf_counter_ns()
        model.step(tokens, cache)
        t2 = time.perf_counter_ns()
        reorder_ns += t1 - t0
        total_ns += t2 - t0
    return reorder_ns, total_ns


def reorder_point(model: GRTransformer, prompt: KVCache, beams: int, levels: int, repeats: int) -> dict:
    cfg = model.config
    steps = levels - 1
    gen = torch.Generator().manual_seed(beams)
    times: dict[str, list[tuple[float, float]]] = {"copy": [], "index": []}
    for rep in range(repeats + 1):
        for layout in ("copy", "index") if rep % 2 else ("index", "copy"):
            r, t = decode_steps(model, prompt, beams, steps, layout == "index", gen)
            if rep:  # the first round warms up
                times[layout].append((r / 1e3 / steps, t / 1e3 / steps))
    row: dict = {"beams": beams}
    for layout, ts in times.items():
        arr = np.array(ts)
        row[f"{layout}_reorder_us_per_step"] = float(np.median(arr[:, 0]))
        row[f"{layout}_step_us"] = float(np.median(arr[:, 1]))
    row["reorder_speedup"] = row["copy_reorder_us_per_step"] / row["index_reorder_us_per_step"]
    row["step_speedup"] = row["copy_step_us"] / row["index_step_us"]
    rows = prompt.batch * beams
    elem = prompt.prefix_k[0].element_size()
    row.update(reorder_bytes(rows, cfg.n_kv_heads, cfg.head_dim, cfg.n_layers, steps, elem))
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m genrec.studies.xgr.xgr_memory", description=__doc__.split("\n")[0]
    )
    p.add_argument("--size", default="small", help="model size (tiny, small, base)")
    p.add_argument("--prompt", type=int, default=100, help="prompt tokens per user")
    p.add_argument("--levels", type=int, default=4, help="SID levels L (L - 1 decoded steps)")
    p.add_argument("--codebook", type=int, default=256, help="codes per level T")
    p.add_argument("--beams", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    p.add_argument("--batch", type=int, default=1, help="users")
    add_shared_options(
        p,
        helps={"repeats": "timed decodes per layout (0: memory only)"},
        repeats=20,
        threads=1,
        seed=0,
    )
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    codec = SIDCodec((args.codebook,) * args.levels)
    model = GRTransformer(model_config_for(args.size, codec.vocab_size, args.prompt + args.levels)).eval()
    tokens = torch.randint(codec.num_special, codec.vocab_size, (args.batch, args.prompt))
    prompt = model.prefill(tokens, torch.ones_like(tokens, dtype=torch.bool)).cache
    rows = []
    for beams in args.beams:
        row = memory_point(model, prompt, args.batch, beams, args.levels)
        if args.repeats:
            row.update(reorder_point(model, prompt, beams, args.levels, args.repeats))
        rows.append(row)
        msg = f"BW={beams}: xgr {row['xgr_bytes'] / 2**20:.1f} MiB, hf {row['hf_bytes'] / 2**20:.1f} MiB "
        msg += f"(x{row['hf_over_xgr']:.1f})"
        if args.repeats:
            msg += (
                f"; reorder copy {row['copy_reorder_us_per_step']:.0f} us vs index "
                f"{row['index_reorder_us_per_step']:.0f} us per step; step copy {row['copy_step_us']:.0f} us "
                f"vs index {row['index_step_us']:.0f} us"
            )
        print(msg, flush=True)
    result = {
        "benchmark": "xgr_memory",
        "command": command_line("genrec.studies.xgr.xgr_memory", argv),
        "model": {"size": args.size, **model.config.to_dict()},
        "env": asdict(current_environment(torch.device("cpu"))),
        "rows": rows,
    }
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    run_main(main)
