"""Per-step cost of constrained decoding: STATIC (torch / Triton VNTK) vs the baselines, one process.

    python -m genrec.workloads.benchmarks.static_step --device cuda \\
        --vocab 2048 --levels 8 --sizes 100000 1000000 --batch 2 --beam 70 --dense-levels 2 \\
        --backends unconstrained static_torch static_triton ppv_exact ppv_approx hash_bitmap cpu_trie \\
        --repeats 50 --warmup 5 [--out docs/results/static_step.json]

For each constraint-set size |C| a uniform random set of SIDs (V^L space, the paper's scaling sets)
is built once; each backend then runs the same synthetic constrained beam search: fixed random
logits per level ([batch, V] for level 0, [batch * beam, V] after), log-softmax, the backend's mask,
top-k over beam x V, and the state advance by parent index. Wall time of the L steps is divided by L
(the paper's "per decoding step"), median and p99 over --repeats, after --warmup runs, with
torch.cuda.synchronize() around each run on CUDA. `unconstrained` (log-softmax + top-k only) is the
floor; `overhead_ms` = backend - unconstrained, the paper's "latency overhead per decoding step"
(Table 1, appendix C), and `overhead_vs_static_torch` the ratio of a backend's overhead to STATIC's
(the paper's 948x / 1033x); `speedup_of_static_torch` compares whole steps. Backends run interleaved
repeat by repeat so drift hits all alike. Also reported: build time, memory and the paper's U_max
bound (STATIC), and the compliance of each backend's final SIDs (fraction inside the set; the hash
bitmap can fall below 1), and with --live-updates N the latency of N removals + N additions on a
LiveStaticMask against a rebuild (merge) of the index.

Only torch/numpy (and triton for static_triton) are needed: runs from a plain checkout on the GPU
machine. static_triton on CPU needs TRITON_INTERPRET=1 and is very slow: tiny sizes only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from genrec.workloads.constraints.baselines import BASELINES
from genrec.workloads.constraints.live import LiveStaticMask
from genrec.workloads.constraints.sets import uniform_random
from genrec.workloads.constraints.transition import build_transition_matrix
from genrec.workloads.constraints.vntk import StaticMask
from genrec.workloads.io import atomic_write_text

ALL_BACKENDS = (
    "unconstrained",
    "static_torch",
    "static_triton",
    "ppv_exact",
    "ppv_approx",
    "hash_bitmap",
    "cpu_trie",
)


class Unconstrained:
    name = "unconstrained"

    def init_state(self, rows, device):
        return torch.zeros(rows, dtype=torch.int32, device=device)

    def apply(self, level, state, log_probs):
        return log_probs, None

    def advance(self, level, state, aux, parent, token):
        return state

    def memory_bytes(self) -> int:
        return 0


def synthetic_decode(
    backend, logits: list[torch.Tensor], batch: int, beam: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Constrained beam search over fixed logits; returns (codes [batch, beam, L], scores [batch, beam])."""
    dev = logits[0].device
    state = backend.init_state(batch, dev)
    lp, aux = backend.apply(0, state, torch.log_softmax(logits[0], dim=-1))
    v = lp.shape[-1]
    scores, code = lp.topk(min(beam, v), dim=-1)
    state = backend.advance(
        0, state, aux, torch.arange(batch, device=dev).repeat_interleave(beam), code.reshape(-1)
    )
    codes = code[..., None]
    rows = torch.arange(batch, device=dev)[:, None] * beam
    for level in range(1, len(logits)):
        lp, aux = backend.apply(level, state, torch.log_softmax(logits[level], dim=-1))
        t = lp.shape[-1]
        scores, flat = (scores[:, :, None] + lp.view(batch, beam, t)).view(batch, beam * t).topk(beam, dim=-1)
        parent, code = flat // t, flat % t
        codes = torch.cat([codes.gather(1, parent[..., None].expand(-1, -1, level)), code[..., None]], dim=2)
        if level < len(logits) - 1:
            state = backend.advance(level, state, aux, (rows + parent).reshape(-1), code.reshape(-1))
    return codes, scores


def make_logits(
    vocab: int, levels: int, batch: int, beam: int, temp: float, seed: int, dev: torch.device
) -> list[torch.Tensor]:
    """The fixed random logits of a synthetic decode: [batch, V] for level 0, [batch * beam, V] after."""
    rng = torch.Generator(device="cpu").manual_seed(seed)
    logits = [
        torch.randn(batch if lvl == 0 else batch * beam, vocab, generator=rng) * temp for lvl in range(levels)
    ]
    return [x.to(dev) for x in logits]


def kernel_timing(tm, rows: int, args: argparse.Namespace, dev: torch.device) -> list[dict]:
    """The VNTK alone, torch vs Triton, per sparse level, on `rows` random states of that level: the
    bool-mask form (`mask`, Algorithm 2 as written) and the fused form used in decoding (`apply`)."""
    from genrec.kernels.constrained_mask import vntk_apply_torch, vntk_apply_triton, vntk_torch, vntk_triton

    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    out = []
    bases = [*tm.level_base, tm.num_states]
    for i, level in enumerate(range(tm.dense_levels, tm.levels)):
        states = torch.randint(bases[i], bases[i + 1], (rows,), generator=gen, dtype=torch.int32).to(dev)
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


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def run(args: argparse.Namespace) -> dict:
    dev = torch.device(args.device)
    torch.set_num_threads(args.threads)
    sizes_cb = (args.vocab,) * args.levels
    logits = make_logits(args.vocab, args.levels, args.batch, args.beam, args.temp, args.seed, dev)
    results = []
    for n in args.sizes:
        t0 = time.perf_counter()
        cset = uniform_random(sizes_cb, n, seed=args.seed)
        set_s = time.perf_counter() - t0
        backends, info = {}, {}
        for name in args.backends:
            t0 = time.perf_counter()
            if name == "unconstrained":
                be = Unconstrained()
            elif name.startswith("static_"):
                key = "tm"
                if key not in info:
                    tb = time.perf_counter()
                    tm = build_transition_matrix(cset, args.dense_levels)
                    info[key] = tm.to(dev)
                    info["tm_build_s"] = time.perf_counter() - tb
                be = StaticMask(info[key], name.split("_", 1)[1])
            else:
                be = BASELINES[name](cset, dev)
            _sync(dev)
            backends[name] = (be, time.perf_counter() - t0)
        times: dict[str, list[float]] = {k: [] for k in backends}
        with torch.no_grad():
            for rep in range(args.warmup + args.repeats):
                order = list(backends) if rep % 2 == 0 else list(reversed(backends))
                for name in order:
                    _sync(dev)
                    t0 = time.perf_counter_ns()
                    synthetic_decode(backends[name][0], logits, args.batch, args.beam)
                    _sync(dev)
                    if rep >= args.warmup:
                        times[name].append((time.perf_counter_ns() - t0) / 1e6 / args.levels)
            rows = []
            base = float(np.median(times["unconstrained"])) if "unconstrained" in times else None
            for name, (be, build_s) in backends.items():
                codes, scores = synthetic_decode(be, logits, args.batch, args.beam)
                found = torch.isfinite(scores).reshape(-1).cpu().numpy()
                flat = codes.reshape(-1, args.levels).cpu().numpy()[found]
                compliance = float(cset.contains(flat).mean()) if len(flat) else float("nan")
                med = float(np.median(times[name]))
                row = {
                    "backend": name,
                    "set_size": n,
                    "step_ms_median": med,
                    "step_ms_p99": float(np.percentile(times[name], 99)),
                    "overhead_ms": None if base is None else med - base,
                    "ratio_vs_unconstrained": None if base is None else med / base,
                    "build_s": build_s,
                    "memory_mb": be.memory_bytes() / 2**20,
                    "compliance": compliance if name != "unconstrained" else None,
                    "returned": int(found.sum()),
                }
                rows.append(row)
            add_static_ratios(rows)
            tm = info.get("tm")
            extra = {}
            if tm is not None:
                mem = tm.memory_bytes()["total"]
                extra = {
                    "static_memory_mb": mem / 2**20,
                    "u_max_mb": tm.u_max_bytes() / 2**20,
                    "within_u_max": mem <= tm.u_max_bytes(),
                    "mb_per_million_items": mem / 2**20 / (n / 1e6),
                    "max_branch": list(tm.max_branch),
                    "tm_build_s": info["tm_build_s"],
                }
            if tm is not None and {"static_torch", "static_triton"} <= set(backends):
                extra["vntk_kernel_us"] = kernel_timing(tm, args.batch * args.beam, args, dev)
            if args.live_updates:
                extra["live_updates"] = live_update_timing(
                    cset, args.dense_levels, args.live_updates, dev, args.seed
                )
            results.append({"set_size": n, "set_build_s": set_s, "rows": rows, **extra})
            print(json.dumps(results[-1]), flush=True)
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
    return {
        "command": " ".join(sys.argv),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "environment": env,
        "results": results,
    }


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


def summary_table(results: list[dict]) -> str:
    """Per |C| and backend: step ms, overhead ms over unconstrained, and overhead / STATIC's."""
    lines = [f"{'|C|':>10}  {'backend':<14} {'step ms':>9} {'overhead ms':>12} {'overhead / STATIC':>18}"]
    for res in results:
        for r in res["rows"]:
            ratio, over = r.get("overhead_vs_static_torch"), r["overhead_ms"]
            over_s = "-" if over is None else f"{over:.3f}"
            ratio_s = "-" if ratio is None else f"{ratio:.1f}x"
            step = f"{r['step_ms_median']:>9.3f}"
            lines.append(f"{res['set_size']:>10}  {r['backend']:<14} {step} {over_s:>12} {ratio_s:>18}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--levels", type=int, default=8)
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--beam", type=int, default=70)
    p.add_argument("--dense-levels", type=int, default=2)
    p.add_argument("--backends", nargs="+", default=None, choices=ALL_BACKENDS)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--temp", type=float, default=3.0, help="logit scale (peakier distributions)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--live-updates", type=int, default=0, help="also time N removals + N additions vs a rebuild"
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.backends is None:
        args.backends = [b for b in ALL_BACKENDS if b != "static_triton" or args.device.startswith("cuda")]
    if "unconstrained" not in args.backends:
        args.backends = ["unconstrained", *args.backends]
    result = run(args)
    print(summary_table(result["results"]))
    if args.out:
        atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
