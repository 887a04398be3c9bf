"""Per-step cost of constrained decoding: STATIC (sparse and dense paths) vs the baselines, one process.

    python -m genrec.studies.static.static_step --device cpu --threads 1 \\
        --vocab 2048 --levels 8 --sizes 100000 1000000 --batch 2 --beam 70 --dense-levels 2 \\
        --backends unconstrained static_torch static_dense ppv_exact ppv_approx hash_bitmap cpu_trie \\
        --repeats 50 --warmup 5 [--out docs/results/static_step.json]

For each constraint-set size |C| a uniform random set of SIDs (V^L space, the paper's scaling sets)
is built once; each backend then runs the same synthetic constrained beam search through the beam
core that decoding uses (beam_core.run_beam_search): fixed random logits per level ([batch, V] for
level 0, [batch * beam, V] after), log-softmax, the backend as a ConstraintProcessor, the top-W
selection and the state advance by parent index. Wall time of the L steps is divided by L (the
paper's "per decoding step"), median and p99 over --repeats, after --warmup runs, with
torch.cuda.synchronize() around each run on CUDA.

STATIC arms: `static_torch` / `static_triton` take each level's cheaper path (sparse candidates on
the CSR levels and on dense levels with a small branch factor, the dense bias row otherwise: see
constraints.transition); `static_dense` is the dense path on every level (the [R, T] masked
log-probs that the selection ranks in full), the form before sparse candidates (`--sparse-fraction`
sets when a dense level of `static_torch` goes sparse; 1: always). Every arm reports the per-level
split `level_ms` (the whole step of each level); STATIC arms also `mask_ms` (the constraint's
candidates or mask call), `processor_ms` (that plus the state advance), medians over the repeats, and
`paths` (which path each level took).

`unconstrained` (log-softmax + top-k only) is the floor; `overhead_ms` = backend - unconstrained, the
paper's "latency overhead per decoding step" (Table 1, appendix C), and `overhead_vs_static_torch`
the ratio of a backend's overhead to STATIC's (the paper's 948x / 1033x); `speedup_of_static_torch`
compares whole steps. Backends run interleaved repeat by repeat, in alternating order, so drift hits
all alike. Also reported: build time, memory and the paper's U_max bound (STATIC), and the compliance
of each backend's final SIDs (fraction inside the set; the hash bitmap can fall below 1), and with
--live-updates N the latency of N removals + N additions on a LiveStaticMask against a rebuild
(merge) of the index.

`--select early` runs every arm (unconstrained included) with xBeam's early-terminating exact top-W,
the selection of the `xgr` decoder, which ranks STATIC's sparse candidates too.

`--level-select` adds `level_select_us` per size: each CSR level's whole step (candidates, top-W,
next states) as one Triton launch against the torch sparse path, and both as captured CUDA graphs
(static_level_select; needs triton and CUDA, or TRITON_INTERPRET=1 on CPU at tiny sizes).

With --interleave-sizes every size's index is built first and all (size, arm) pairs alternate repeat
by repeat, so each arm's `step_vs_smallest_size` (flatness in |C|) is a same-process ratio too.

Only torch/numpy (and triton for static_triton) are needed: runs from a plain checkout on the GPU
machine. static_triton on CPU needs TRITON_INTERPRET=1 and is very slow: tiny sizes only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from genrec.studies.common.options import add_shared_options
from genrec.studies.static.static_decode import (
    DecodeTiming,
    _sync,
    level_paths,
    make_logits,
    per_level_median_ms,
    synthetic_decode,
)
from genrec.studies.static.static_level_select import (
    level_select_table,
    level_select_timing,
    level_select_unavailable,
    random_level_states,
)
from genrec.workloads.constraints.backend import MaskBackend
from genrec.workloads.constraints.baselines import BASELINES
from genrec.workloads.constraints.live import LiveStaticMask
from genrec.workloads.constraints.sets import uniform_random
from genrec.workloads.constraints.transition import SPARSE_FRACTION, build_transition_matrix
from genrec.workloads.constraints.vntk import StaticMask
from genrec.workloads.errors import run_main
from genrec.workloads.io import atomic_write_text

ALL_BACKENDS = (
    "unconstrained",
    "static_torch",
    "static_dense",
    "static_triton",
    "ppv_exact",
    "ppv_approx",
    "hash_bitmap",
    "cpu_trie",
)
STATIC_ARMS = ("static_torch", "static_dense", "static_triton")


def kernel_timing(tm, rows: int, args: argparse.Namespace, dev: torch.device) -> list[dict]:
    """The VNTK alone, torch vs Triton, per sparse level, on `rows` random states of that level: the
    bool-mask form (`mask`, Algorithm 2 as written) and the fused form used in decoding (`apply`)."""
    from genrec.kernels.constrained_mask import vntk_apply_triton, vntk_triton
    from genrec.kernels.constrained_mask_torch import vntk as vntk_torch
    from genrec.kernels.constrained_mask_torch import vntk_apply as vntk_apply_torch

    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    out = []
    for level in range(tm.dense_levels, tm.levels):
        states = random_level_states(tm, level, rows, gen).to(dev)
        vocab = tm.codebook_sizes[level]
        lp = torch.log_softmax(torch.randn(rows, vocab, generator=gen), -1).to(dev)
        branch = tm.max_branch[level]
        mask_args = (states, tm.row_ptr, tm.edges, branch, vocab)
        apply_args = (lp, states, tm.row_ptr, tm.edges, branch)
        calls = {
            "mask_torch": (vntk_torch, mask_args),
            "mask_triton": (vntk_triton, mask_args),
            "apply_torch": (vntk_apply_torch, apply_args),
            "apply_triton": (vntk_apply_triton, apply_args),
        }
        row = {"level": level, "branch": branch}
        for name, (fn, fn_args) in calls.items():
            times = []
            for rep in range(args.warmup + args.repeats):
                _sync(dev)
                t0 = time.perf_counter_ns()
                fn(*fn_args)
                _sync(dev)
                if rep >= args.warmup:
                    times.append((time.perf_counter_ns() - t0) / 1e3)
            row[f"{name}_us_median"] = float(np.median(times))
        for form in ("mask", "apply"):
            row[f"{form}_triton_speedup"] = row[f"{form}_torch_us_median"] / row[f"{form}_triton_us_median"]
        out.append(row)
    return out


def live_update_timing(cset, dense_levels: int, n_updates: int, dev: torch.device, seed: int) -> dict:
    """Seconds to remove n base SIDs and add n new ones live, against a full rebuild of the index."""
    live = LiveStaticMask(cset, dense_levels, dev)
    rng = np.random.default_rng(seed + 1)
    remove = cset.codes[rng.choice(len(cset), size=min(n_updates, len(cset)), replace=False)]
    add = uniform_random(cset.codebook_sizes, n_updates, seed=seed + 2).codes
    _sync(dev)
    t0 = time.perf_counter()
    live.remove(remove)
    live.add(add)
    live.init_state(1, dev)  # builds the delta index
    _sync(dev)
    update_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    live.merge()
    _sync(dev)
    rebuild_s = time.perf_counter() - t0
    return {
        "updates": 2 * n_updates,
        "update_s": update_s,
        "rebuild_s": rebuild_s,
        "speedup": rebuild_s / update_s,
    }


def build_arm(name: str, cset, args: argparse.Namespace, dev: torch.device, tms: dict) -> MaskBackend | None:
    """The backend of one arm (None: unconstrained); STATIC arms share one index per path choice."""
    if name == "unconstrained":
        return None
    if name not in STATIC_ARMS:
        return BASELINES[name](cset, dev)
    key = "dense" if name == "static_dense" else "auto"
    if key not in tms:
        tb = time.perf_counter()
        tm = build_transition_matrix(cset, args.dense_levels, 0.0 if key == "dense" else args.sparse_fraction)
        tms[key] = tm.to(dev)
        tms[f"{key}_build_s"] = time.perf_counter() - tb
    return StaticMask(tms[key], "triton" if name == "static_triton" else "torch")


@dataclass
class SizeArms:
    """One constraint-set size, its set and each arm's backend (None: unconstrained) with build time."""

    size: int
    cset: object
    set_s: float
    backends: dict[str, tuple[MaskBackend | None, float]]
    tms: dict


def prepare_size(n: int, args: argparse.Namespace, dev: torch.device) -> SizeArms:
    t0 = time.perf_counter()
    cset = uniform_random((args.vocab,) * args.levels, n, seed=args.seed)
    set_s = time.perf_counter() - t0
    backends, tms = {}, {}
    for name in args.backends:
        t0 = time.perf_counter()
        be = build_arm(name, cset, args, dev, tms)
        _sync(dev)
        backends[name] = (be, time.perf_counter() - t0)
    return SizeArms(n, cset, set_s, backends, tms)


def time_arms(
    sizes: list[SizeArms], logits: list[torch.Tensor], args: argparse.Namespace
) -> dict[tuple[int, str], list[DecodeTiming]]:
    """Every (size, arm) decoded once per repeat, in alternating order, so drift hits all alike."""
    arms = [(sa.size, name, be) for sa in sizes for name, (be, _) in sa.backends.items()]
    runs: dict[tuple[int, str], list[DecodeTiming]] = {(n, name): [] for n, name, _ in arms}
    with torch.no_grad():
        for rep in range(args.warmup + args.repeats):
            for n, name, be in arms if rep % 2 == 0 else reversed(arms):
                dense = name == "static_dense"
                timing = synthetic_decode(be, logits, args.batch, args.beam, dense, args.select)
                if rep >= args.warmup:
                    runs[(n, name)].append(timing)
    return runs


def arm_row(name: str, sa: SizeArms, runs: list[DecodeTiming], base: float | None, args) -> dict:
    """One arm's figures at one size (`base`: unconstrained's median step ms)."""
    be, build_s = sa.backends[name]
    steps = [r.total_ns / 1e6 / args.levels for r in runs]
    last = runs[-1]
    found = torch.isfinite(last.scores).reshape(-1).cpu().numpy()
    flat = last.codes.reshape(-1, args.levels).cpu().numpy()[found]
    compliance = float(sa.cset.contains(flat).mean()) if len(flat) else float("nan")
    med = float(np.median(steps))
    row = {
        "backend": name,
        "set_size": sa.size,
        "step_ms_median": med,
        "step_ms_p99": float(np.percentile(steps, 99)),
        "overhead_ms": None if base is None else med - base,
        "ratio_vs_unconstrained": None if base is None else med / base,
        "level_ms": per_level_median_ms(runs, "level_ns"),
        "step_ms_from_levels": sum(per_level_median_ms(runs, "level_ns")) / args.levels,
        "build_s": build_s,
        "memory_mb": 0.0 if be is None else be.memory_bytes() / 2**20,
        "compliance": compliance if be is not None else None,
        "returned": int(found.sum()),
    }
    if isinstance(be, StaticMask):
        row["mask_ms"] = per_level_median_ms(runs, "mask_ns")
        row["processor_ms"] = per_level_median_ms(runs, "processor_ns")
        dense = name == "static_dense"
        row["paths"] = ["dense"] * args.levels if dense else level_paths(be.tm)
    return row


def size_result(sa: SizeArms, runs: dict, args: argparse.Namespace, dev: torch.device) -> dict:
    """Every arm's row at one size, the ratios between them, and STATIC's index figures."""
    unc = runs.get((sa.size, "unconstrained"))
    base = float(np.median([r.total_ns / 1e6 / args.levels for r in unc])) if unc else None
    rows = [arm_row(name, sa, runs[(sa.size, name)], base, args) for name in sa.backends]
    add_static_ratios(rows)
    add_level_ratios(rows)
    tm = sa.tms.get("auto", sa.tms.get("dense"))
    extra = {}
    if tm is not None:
        mem = tm.memory_bytes()["total"]
        extra = {
            "static_memory_mb": mem / 2**20,
            "u_max_mb": tm.u_max_bytes() / 2**20,
            "within_u_max": mem <= tm.u_max_bytes(),
            "mb_per_million_items": mem / 2**20 / (sa.size / 1e6),
            "max_branch": list(tm.max_branch),
            "tm_build_s": sa.tms.get("auto_build_s", sa.tms.get("dense_build_s")),
        }
    if tm is not None and {"static_torch", "static_triton"} <= set(sa.backends):
        extra["vntk_kernel_us"] = kernel_timing(tm, args.batch * args.beam, args, dev)
    if args.level_select:
        if tm is None:  # no STATIC arm: the index of the auto paths, for its CSR levels only
            tm = build_transition_matrix(sa.cset, args.dense_levels, args.sparse_fraction).to(dev)
        extra["level_select_us"] = level_select_timing(tm, args, dev)
    if args.live_updates:
        extra["live_updates"] = live_update_timing(
            sa.cset, args.dense_levels, args.live_updates, dev, args.seed
        )
    return {"set_size": sa.size, "set_build_s": sa.set_s, "rows": rows, **extra}


def environment(dev: torch.device) -> dict:
    env = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = "none"
    return env


def run(args: argparse.Namespace) -> dict:
    """Time every arm at every size: one size at a time, or with --interleave-sizes all sizes' arms in
    one alternating loop (then ratios across sizes, e.g. flatness in |C|, are same-process figures)."""
    dev = torch.device(args.device)
    torch.set_num_threads(args.threads)
    logits = make_logits(args.vocab, args.levels, args.batch, args.beam, args.temp, args.seed, dev)
    groups = [args.sizes] if args.interleave_sizes else [[n] for n in args.sizes]
    results = []
    for group in groups:
        sizes = [prepare_size(n, args, dev) for n in group]
        runs = time_arms(sizes, logits, args)
        for sa in sizes:
            results.append(size_result(sa, runs, args, dev))
            print(json.dumps(results[-1]), flush=True)
        del sizes, runs
    if args.interleave_sizes:
        add_flatness(results)
    return {
        "command": " ".join(sys.argv),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "environment": environment(dev),
        "results": results,
    }


def add_flatness(results: list[dict]) -> None:
    """Each arm's step (from per-level medians) at every size over its step at the smallest size."""
    smallest = min(results, key=lambda res: res["set_size"])
    first = {r["backend"]: r["step_ms_from_levels"] for r in smallest["rows"]}
    for res in results:
        for r in res["rows"]:
            r["step_vs_smallest_size"] = r["step_ms_from_levels"] / first[r["backend"]]


def add_static_ratios(rows: list[dict]) -> None:
    """Each backend's whole-step time and its overhead over unconstrained, relative to STATIC's."""
    static = next((r for r in rows if r["backend"] == "static_torch"), None)
    if static is None:
        return
    for r in rows:
        if r["backend"] == "unconstrained":
            continue
        r["speedup_of_static_torch"] = r["step_ms_median"] / static["step_ms_median"]
        # the paper's Table 1 ratio; undefined when STATIC's overhead is within noise of zero
        if r["overhead_ms"] is not None and static["overhead_ms"] > 0:
            r["overhead_vs_static_torch"] = r["overhead_ms"] / static["overhead_ms"]


def add_level_ratios(rows: list[dict]) -> None:
    """Each arm's step from per-level medians over unconstrained's. On a shared machine a decode now
    and then loses the CPU for a scheduler slice (~4 ms, one level of one repeat): a per-level median
    drops it, a whole-decode median does not when most decodes catch one."""
    base = next((r for r in rows if r["backend"] == "unconstrained"), None)
    for r in rows:
        if base is not None:
            r["ratio_from_levels"] = r["step_ms_from_levels"] / base["step_ms_from_levels"]


def summary_table(results: list[dict]) -> str:
    """Per |C| and backend: step ms, overhead ms over unconstrained, and overhead / STATIC's."""
    lines = [
        f"{'|C|':>10}  {'backend':<14} {'step ms':>9} {'overhead ms':>12} {'overhead / STATIC':>18}"
        f" {'level-median step ms':>21} {'x unconstrained':>16}"
    ]
    for res in results:
        for r in res["rows"]:
            ratio, over = r.get("overhead_vs_static_torch"), r["overhead_ms"]
            over_s = "-" if over is None else f"{over:.3f}"
            ratio_s = "-" if ratio is None else f"{ratio:.1f}x"
            step = f"{r['step_ms_median']:>9.3f}"
            nan = float("nan")
            levels = f"{r.get('step_ms_from_levels', nan):>21.3f} {r.get('ratio_from_levels', nan):>15.2f}x"
            lines.append(
                f"{res['set_size']:>10}  {r['backend']:<14} {step} {over_s:>12} {ratio_s:>18} {levels}"
            )
    return "\n".join(lines)


def level_table(results: list[dict]) -> str:
    """Per |C| and arm: each level's whole step in ms; STATIC arms also the mask call and the path."""
    lines = []
    for res in results:
        for r in res["rows"]:
            if "level_ms" not in r:
                continue
            steps = " ".join(f"{x:6.3f}" for x in r["level_ms"])
            lines.append(f"{res['set_size']:>10}  {r['backend']:<14} step  {steps}")
            if "mask_ms" in r:
                masks = " ".join(f"{x:6.3f}" for x in r["mask_ms"])
                lines.append(f"{'':>10}  {'':<14} mask  {masks}   {' '.join(p[0] for p in r['paths'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shared_options(
        p,
        device="cuda" if torch.cuda.is_available() else "cpu",
        repeats=20,
        warmup=3,
        threads=2,
        seed=0,
    )
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--levels", type=int, default=8)
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--beam", type=int, default=70)
    p.add_argument("--dense-levels", type=int, default=2)
    p.add_argument(
        "--sparse-fraction",
        type=float,
        default=SPARSE_FRACTION,
        help="a dense level takes the sparse path when B_l <= this * T_l (0: never, 1: always)",
    )
    p.add_argument("--backends", nargs="+", default=None, choices=ALL_BACKENDS)
    p.add_argument("--temp", type=float, default=3.0, help="logit scale (peakier distributions)")
    p.add_argument(
        "--live-updates", type=int, default=0, help="also time N removals + N additions vs a rebuild"
    )
    p.add_argument(
        "--select",
        choices=("flat", "early"),
        default="flat",
        help="every arm's top-W: flat torch.topk (beam, static) or xBeam's early-terminating one (xgr)",
    )
    p.add_argument(
        "--interleave-sizes",
        action="store_true",
        help="build every size first and alternate all (size, arm) pairs per repeat (flatness in |C|)",
    )
    p.add_argument(
        "--level-select",
        action="store_true",
        help="also time each CSR level's one-launch Triton step against the torch sparse path",
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.level_select and (why := level_select_unavailable(args.device)):
        p.error(why)
    if args.backends is None:
        args.backends = [b for b in ALL_BACKENDS if b != "static_triton" or args.device.startswith("cuda")]
    if "unconstrained" not in args.backends:
        args.backends = ["unconstrained", *args.backends]
    result = run(args)
    print(summary_table(result["results"]))
    print(level_table(result["results"]))
    if args.level_select:
        print(level_select_table(result["results"]))
    if args.out:
        atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    run_main(main)
