"""STATIC's CSR levels as one launch: the Triton level select against the torch sparse path, per level.

`static_step --level-select` calls `level_select_timing` for each constraint-set size: for every CSR
level (>= d) of the size's transition matrix, on batch * w random states of that level (w = 1 at level
0, else the beam), random log-probs and beam scores, it times one whole level step (candidates, exact
top-W, next states) with
- `torch`: genrec.kernels.constrained_mask_torch.csr_level_select (the sparse path decoding runs:
  about ten small kernels), and `torch_lse` the same from raw logits (log-softmax included);
- `triton` / `triton_lse`: genrec.kernels.csr_level_select.csr_level_select_triton, one launch (the
  `_lse` form fuses the log-softmax into it);
- on CUDA also each of them replayed from a captured CUDA graph (`*_graph`: no per-op launch cost; a
  graph replay is what a decoder capturing one graph per level shape would pay).
Each figure is the median over the repeats of `INNER` back-to-back calls divided by INNER (steady-state
cost per call with launches overlapping the device work, as in a decode loop without host syncs); the
arms alternate order repeat by repeat. `exact` checks the Triton scores against torch's on the device
(sorted, bit for bit). Needs triton, and CUDA (or TRITON_INTERPRET=1 on CPU: tiny sizes only).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np
import torch

from genrec.studies.common.cuda_graph import capture_cuda_graph
from genrec.studies.static.static_decode import _sync

INNER = 10  # calls per timed repeat


def level_select_unavailable(device: str) -> str | None:
    """Why the level-select arm cannot run on `device` (with the fix), or None when it can."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "--level-select needs triton (pip install triton)"
    if not device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        return (
            "--level-select runs the Triton kernel: use --device cuda, or set TRITON_INTERPRET=1 to run "
            "it on CPU under the interpreter (slow: tiny sizes only)"
        )
    return None


def time_calls(calls: dict[str, Callable[[], object]], repeats: int, warmup: int, dev: torch.device) -> dict:
    """Median microseconds per call of each arm, arms alternating order repeat by repeat."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for rep in range(warmup + repeats):
        for name in names if rep % 2 == 0 else reversed(names):
            _sync(dev)
            t0 = time.perf_counter_ns()
            for _ in range(INNER):
                calls[name]()
            _sync(dev)
            if rep >= warmup:
                times[name].append((time.perf_counter_ns() - t0) / 1e3 / INNER)
    return {f"{name}_us_median": float(np.median(t)) for name, t in times.items()}


def random_level_states(tm, level: int, rows: int, gen: torch.Generator) -> torch.Tensor:
    """`rows` random CSR states of one sparse level (int32, on the CPU)."""
    bases = [*tm.level_base, tm.num_states]
    i = level - tm.dense_levels
    return torch.randint(bases[i], bases[i + 1], (rows,), generator=gen, dtype=torch.int32)


def level_inputs(tm, level: int, batch: int, w: int, gen: torch.Generator, dev: torch.device):
    """(logits, log-probs, beam scores, states) of one level: random states of the level."""
    states = random_level_states(tm, level, batch * w, gen)
    logits = torch.randn(batch * w, tm.codebook_sizes[level], generator=gen) * 3
    scores = torch.randn(batch, w, generator=gen).sort(dim=1, descending=True).values
    return logits.to(dev), torch.log_softmax(logits, -1).to(dev), scores.to(dev), states.to(dev)


def level_select_timing(tm, args: argparse.Namespace, dev: torch.device) -> list[dict]:
    """Per CSR level: each arm's µs per level step, the speedups over torch, and the exactness check."""
    from genrec.kernels.constrained_mask_torch import csr_level_select as csr_level_select_torch
    from genrec.kernels.csr_level_select import csr_level_select_triton

    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    out = []
    for level in range(tm.dense_levels, tm.levels):
        w = 1 if level == 0 else args.beam
        logits, lp, scores, states = level_inputs(tm, level, args.batch, w, gen, dev)
        branch = tm.max_branch[level]
        fixed = (scores, states, tm.row_ptr, tm.edges, branch, args.beam)
        calls = {
            "torch": lambda fixed=fixed, lp=lp: csr_level_select_torch(lp, *fixed),
            "torch_lse": lambda fixed=fixed, x=logits: csr_level_select_torch(x, *fixed, logits=True),
            "triton": lambda fixed=fixed, lp=lp: csr_level_select_triton(lp, *fixed),
            "triton_lse": lambda fixed=fixed, x=logits: csr_level_select_triton(x, *fixed, logits=True),
        }
        if dev.type == "cuda":
            calls.update(
                {f"{name}_graph": capture_cuda_graph(fn, dev)[0] for name, fn in list(calls.items())}
            )
        ref, got = calls["torch"](), calls["triton"]()
        row = {"level": level, "branch": branch, "rows": args.batch * w, "candidates_per_user": w * branch}
        row["exact"] = bool(torch.equal(ref[0].sort(dim=1).values, got[0].sort(dim=1).values))
        row.update(time_calls(calls, args.repeats, args.warmup, dev))
        for name in calls:
            if name != "torch":
                row[f"{name}_speedup"] = row["torch_us_median"] / row[f"{name}_us_median"]
        out.append(row)
    return out


def level_select_table(results: list[dict]) -> str:
    """Per |C| and CSR level: µs per level step of each arm (torch first) and B_l."""
    lines = []
    for res in results:
        for r in res.get("level_select_us", []):
            arms = " ".join(f"{k[:-10]} {v:8.1f}" for k, v in r.items() if k.endswith("_us_median"))
            exact = "" if r["exact"] else "  NOT EXACT"
            lines.append(f"{res['set_size']:>10}  level {r['level']} B={r['branch']:<5} us: {arms}{exact}")
    return "\n".join(lines)
