"""One decode step's attention at beam width W: xGR's staged Triton kernel against SDPA over a
per-beam-copied cache (the layout HF and vLLM beam search hold), side by side in one process.

    python -m genrec.studies.xgr.xgr_attention --device cuda --users 1 8 \\
        --beams 16 32 64 128 256 512 --heads 8 --head-dim 64 --prompt 100 --steps 3 \\
        --dtypes float32 bfloat16 --repeats 50 --warmup 5 --inner 20 --out xgr_attention.json

Inputs per point: B users x W beams, one new token per beam, a prompt of --prompt tokens stored once
per user and --steps decoded steps per beam (random tensors: attention cost does not depend on the
values). Arms, alternating order repeat by repeat:
- `triton`: kernels/shared_prefix_attention_triton.py (prompt read once per user, three launches);
- `torch_staged`: the torch stage-merge reference beside it;
- `sdpa_copied`: F.scaled_dot_product_attention over [B*W, H, prompt + steps + 1, hd], each beam row
  holding its own prompt copy (built before timing: the copy is a cost of the layout, not of the call).
On CUDA every arm is also replayed from a captured CUDA graph (`*_graph`, no launch cost). Per arm:
median and p90 microseconds per call (--inner back-to-back calls per timed repeat). `sdpa_over_triton`
is issue 17's kernel figure (target: >= 3 at W = 512 and not below 1 at W = 16, on the lent GPU);
`triton_max_abs_err` checks the kernel against SDPA on the same inputs first. A point whose Triton arm
fails to build (a dtype the kernel does not compile for) records the error and the run goes on.
On CPU run it under TRITON_INTERPRET=1 with tiny sizes: a check that it works, not a timing.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from genrec.kernels.shared_prefix_attention import shared_prefix_attention_torch
from genrec.studies.common.options import add_shared_options
from genrec.workloads.errors import run_main
from genrec.workloads.results import benchmark_summary

MODULE = "genrec.studies.xgr.xgr_attention"
DTYPES = ("float32", "bfloat16", "float16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    add_shared_options(
        p,
        device="cuda",
        repeats=50,
        warmup=5,
        seed=0,
    )
    p.add_argument("--users", type=int, nargs="+", default=[1, 8])
    p.add_argument("--beams", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--prompt", type=int, default=100, help="prompt tokens, stored once per user")
    p.add_argument("--steps", type=int, default=3, help="decoded steps already in each beam's cache")
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["float32", "bfloat16"])
    p.add_argument("--inner", type=int, default=20, help="back-to-back calls per timed repeat")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    sizes = [*args.users, *args.beams, args.heads, args.head_dim, args.prompt, args.repeats, args.inner]
    if min(sizes) < 1 or args.steps < 0 or args.warmup < 0:
        p.error("--users, --beams, --heads, --head-dim, --prompt, --repeats and --inner must be >= 1; "
                "--steps and --warmup >= 0")  # fmt: skip
    return args


def attention_inputs(args, users: int, beams: int, dtype: torch.dtype, dev: torch.device) -> dict:
    """Random q, the prompt cache once per user, each beam's decoded steps plus the new token, and the
    per-beam-copied cache that SDPA reads."""
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + users * 1_009 + beams)
    h, hd, s, t = args.heads, args.head_dim, args.prompt, args.steps

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dev, dtype)

    q, prefix_k, prefix_v = rand(users * beams, h, 1, hd), rand(users, h, s, hd), rand(users, h, s, hd)
    beam_k, beam_v = rand(users * beams, h, t + 1, hd), rand(users * beams, h, t + 1, hd)
    return {
        # beam_len = t earlier steps; the new token sits at slot t of beam_k / beam_v
        "staged": (
            q,
            prefix_k,
            prefix_v,
            torch.ones(users, s, dtype=torch.bool, device=dev),
            beam_k,
            beam_v,
            t,
        ),
        "copied": (
            q,
            torch.cat([prefix_k.repeat_interleave(beams, 0), beam_k], 2),
            torch.cat([prefix_v.repeat_interleave(beams, 0), beam_v], 2),
        ),
    }


def arm_calls(inputs: dict, dev: torch.device) -> dict[str, Callable[[], torch.Tensor]]:
    from genrec.kernels.shared_prefix_attention_triton import shared_prefix_attention

    staged, copied = inputs["staged"], inputs["copied"]
    calls = {
        "triton": lambda: shared_prefix_attention(*staged),
        "torch_staged": lambda: shared_prefix_attention_torch(*staged),
        "sdpa_copied": lambda: F.scaled_dot_product_attention(*copied),
    }
    return calls


def graph_calls(calls: dict[str, Callable], dev: torch.device) -> tuple[dict[str, Callable], dict[str, str]]:
    """Each arm captured as a CUDA graph (`NAME_graph`), and the arms whose capture failed, with why:
    a capture failure costs that graph arm only, not the eager timings."""
    from genrec.studies.common.cuda_graph import capture_cuda_graph

    graphs, errors = {}, {}
    for name, fn in calls.items():
        try:
            graphs[f"{name}_graph"] = capture_cuda_graph(fn, dev)[0]
        except Exception as e:  # noqa: BLE001 -- recorded in the row
            errors[f"{name}_graph"] = f"{type(e).__name__}: {e}"[:300]
    return graphs, errors


def time_calls(calls: dict[str, Callable], args, dev: torch.device) -> dict[str, float]:
    """Median and p90 microseconds per call of each arm, arms alternating order repeat by repeat."""
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(args.warmup + args.repeats):
        for name in names if rep % 2 == 0 else names[::-1]:
            sync()
            t0 = time.perf_counter_ns()
            for _ in range(args.inner):
                calls[name]()
            sync()
            if rep >= args.warmup:
                samples[name].append((time.perf_counter_ns() - t0) / 1e3 / args.inner)
    out = {}
    for name, us in samples.items():
        out[f"{name}_us"] = float(np.median(us))
        out[f"{name}_us_p90"] = float(np.percentile(us, 90))
    return out


def attention_point(args, users: int, beams: int, dtype: str, dev: torch.device) -> dict:
    row = {"dtype": dtype, "users": users, "beams": beams, "prompt": args.prompt, "steps": args.steps}
    inputs = attention_inputs(args, users, beams, getattr(torch, dtype), dev)
    try:
        calls = arm_calls(inputs, dev)
        err = (calls["triton"]().float() - calls["sdpa_copied"]().float()).abs().max()
    except Exception as e:  # noqa: BLE001 -- a dtype the kernel does not build for: record it, go on
        return {**row, "error": f"{type(e).__name__}: {e}"[:500]}
    row["triton_max_abs_err"] = float(err)
    if dev.type == "cuda":
        graphs, graph_errors = graph_calls(calls, dev)
        calls |= graphs
        if graph_errors:
            row["graph_errors"] = graph_errors
    row |= time_calls(calls, args, dev)
    row["sdpa_over_triton"] = row["sdpa_copied_us"] / row["triton_us"]
    row["torch_staged_over_triton"] = row["torch_staged_us"] / row["triton_us"]
    if "triton_graph_us" in row and "sdpa_copied_graph_us" in row:
        row["sdpa_over_triton_graph"] = row["sdpa_copied_graph_us"] / row["triton_graph_us"]
    return row


def format_row(row: dict) -> str:
    head = f"{row['dtype']:9s} B={row['users']:<3d} W={row['beams']:<4d}"
    if "error" in row:
        return f"{head} error: {row['error']}"
    graph = (
        f"  graphs: sdpa/triton {row['sdpa_over_triton_graph']:.2f}x"
        if "sdpa_over_triton_graph" in row
        else ""
    )
    return (
        f"{head} triton {row['triton_us']:8.1f} us  torch staged {row['torch_staged_us']:8.1f} us  "
        f"sdpa copied {row['sdpa_copied_us']:8.1f} us  sdpa/triton {row['sdpa_over_triton']:.2f}x  "
        f"max err {row['triton_max_abs_err']:.1e}{graph}"
    )


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    dev = torch.device(args.device)
    rows = []
    for dtype in args.dtypes:
        for users in args.users:
            for beams in args.beams:
                rows.append(attention_point(args, users, beams, dtype, dev))
                print(format_row(rows[-1]), flush=True)
    return benchmark_summary(MODULE, argv, dev, args, rows, args.out)


if __name__ == "__main__":
    run_main(main)
