"""MaRI vs vanilla fusion MatMul (paper Table 2 / Fig. 3) and fragmented vs neat layout (Table 3 / Fig. 4).

    python -m genrec.studies.mari.mari_matmul --table2 --table3 --threads 2 \\
        --out docs/results/mari_matmul_cpu.json
    python -m genrec.studies.mari.mari_matmul --grid --bs 100 1000 --d-users 1000 4000 ...

One point = one (B, D_user, D_item, D_cross, D_hidden). Inputs are built once per point: the user row
[1, Du], candidate item and cross features [B, Di], [B, Dc], weight W [D, d] and bias. The methods are
    vanilla   addmm(b, X, W) on X = [user tiled to B | item | cross], tiled at batching (VanI; the tiling
              is not timed, so vanilla is charged only for its MatMul)
    mari      eq. 7: addmm(b, x_user, W_user) -> [1, d], then addmm of the item block broadcasting it
              over B rows, then addmm of the cross block in place (out=)
    concat    (--with-concat) the UOI form: cat([expand(user), item, cross]) then addmm, timed together
and run interleaved rep by rep (vanilla, mari, vanilla, mari, ...) after warm-up, each call bracketed by
torch.cuda.synchronize() on CUDA. Reported: medians, time speedup = median(vanilla) / median(mari), the
std of the per-rep ratios (the paper's +-), and the theoretical FLOPs speedup (appendix B).

Fragmented (Table 3): the same request in a layout of round-robin user/cross/item chunks of `chunk`
columns; fragmented MaRI = one addmm per chunk (candidate chunks are column views of one packed
tensor), neat MaRI = after reorganisation (three blocks). Degradation = time / reference - 1.

The paper's figures (GPU) are stored beside each point (`paper_*`). The paper's B sweep has FLOPs
speedups 2.94-3.00, which eq. 8/9 give only with D_item = D_cross = 1000; its other sweeps match
D_cross = 0; --table2 uses those settings so the FLOPs columns agree.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from genrec.studies.common.options import add_shared_options
from genrec.workloads.errors import run_main
from genrec.workloads.io import atomic_write_text
from genrec.workloads.ranking.flops import flops_speedup, matmul_flops_mari, matmul_flops_vanilla
from genrec.workloads.ranking.layout import FeatureLayout, chunk_inputs, fragmented_layout, mari_chunked
from genrec.workloads.results import current_environment

# Table 2 of the paper: (setting, value) -> (FLOPs speedup, time speedup), and each sweep's fixed values
PAPER_TABLE2 = {
    "b": {
        100: (2.94, 0.97),
        500: (2.99, 1.12),
        1000: (2.99, 1.14),
        2000: (3.00, 1.10),
        5000: (3.00, 1.10),
        8000: (3.00, 1.11),
        10000: (3.00, 1.10),
    },
    "d_user": {
        500: (1.50, 1.02),
        1000: (2.00, 1.05),
        2000: (3.00, 1.10),
        5000: (5.99, 1.27),
        8000: (8.96, 1.43),
        10000: (10.95, 1.58),
    },
    "d_item": {
        500: (8.96, 1.61),
        1000: (4.99, 1.22),
        2000: (3.00, 1.11),
        5000: (1.80, 1.05),
        8000: (1.50, 1.04),
        10000: (1.40, 1.04),
    },
    "d_hidden": {128: (4.99, 1.10), 512: (4.99, 1.21), 1024: (4.99, 1.31), 2048: (4.99, 1.58)},
}
TABLE2_FIXED = {
    "b": {"d_user": 4000, "d_item": 1000, "d_cross": 1000, "d_hidden": 512},
    "d_user": {"b": 2000, "d_item": 1000, "d_cross": 0, "d_hidden": 512},
    "d_item": {"b": 2000, "d_user": 4000, "d_cross": 0, "d_hidden": 512},
    "d_hidden": {"b": 2000, "d_user": 4000, "d_item": 1000, "d_cross": 0},
}
# Table 3: chunk -> (degradation vs original MatMul %, vs neat MaRI %), at Du=4000, Di=1000, d=256
PAPER_TABLE3 = {50: (69.4, 96.3), 100: (27.2, 47.4), 200: (13.6, 31.7), 400: (3.1, 19.5), 800: (-0.7, 15.1)}


def interleaved_times(
    fns: dict[str, Callable[[], object]], reps: int, warmup: int, device: torch.device
) -> dict[str, list[float]]:
    """Milliseconds per call of each fn, called round-robin so drift hits all of them alike."""
    cuda = device.type == "cuda"
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter_ns()
            fn()
            if cuda:
                torch.cuda.synchronize(device)
            times[name].append((time.perf_counter_ns() - t0) / 1e6)
    return times


def _ratio_stats(num: list[float], den: list[float]) -> tuple[float, float]:
    """median(num) / median(den) and the std of the per-rep ratios."""
    ratios = [a / b for a, b in zip(num, den)]
    return statistics.median(num) / statistics.median(den), statistics.stdev(ratios) if len(
        ratios
    ) > 1 else 0.0


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def _setup(threads: int, device: str, seed: int) -> torch.device:
    if threads > 0:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but no CUDA device is available")
    return dev


def result_header(benchmark: str, dev: torch.device, **fields: object) -> dict:
    """The opening keys of a benchmark's JSON result; `fields` go before the start load average."""
    return {
        "benchmark": benchmark,
        "argv": sys.argv[1:],
        "env": asdict(current_environment(dev)),
        **fields,
        "loadavg_start": os.getloadavg(),  # other work on a shared machine makes CPU times noisy
    }


def write_result(out: Path | None, result: dict) -> None:
    """Write the JSON result to --out, when one was given."""
    if out:
        atomic_write_text(out, json.dumps(result, indent=2) + "\n")
        print(f"-> {out}")


def _check_matmul_sizes(b: int, d_user: int, d_item: int, d_cross: int, d_hidden: int, reps: int) -> None:
    for name, v in (("b", b), ("d_user", d_user), ("d_item", d_item), ("d_hidden", d_hidden), ("reps", reps)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if d_cross < 0:
        raise ValueError(f"d_cross must be >= 0, got {d_cross}")


def matmul_methods(
    b: int, d_user: int, d_item: int, d_cross: int, d_hidden: int, dev: torch.device
) -> dict[str, Callable[[], torch.Tensor]]:
    """vanilla, mari and concat (see the module doc) on one request's random inputs and weights."""
    d = d_user + d_item + d_cross
    x_user = torch.randn(1, d_user, device=dev)
    x_item = torch.randn(b, d_item, device=dev)
    x_cross = torch.randn(b, d_cross, device=dev)
    w = torch.randn(d, d_hidden, device=dev) / d**0.5
    bias = torch.randn(d_hidden, device=dev)
    w_user, w_item = w[:d_user].contiguous(), w[d_user : d_user + d_item].contiguous()
    w_cross = w[d_user + d_item :].contiguous()
    x_tiled = torch.cat([x_user.expand(b, -1), x_item, x_cross], 1)  # VanI: built at batching

    def vanilla() -> torch.Tensor:
        return torch.addmm(bias, x_tiled, w)

    def mari() -> torch.Tensor:
        out = torch.addmm(torch.addmm(bias, x_user, w_user), x_item, w_item)
        return torch.addmm(out, x_cross, w_cross, out=out) if d_cross else out

    def concat() -> torch.Tensor:
        return torch.addmm(bias, torch.cat([x_user.expand(b, -1), x_item, x_cross], 1), w)

    return {"vanilla": vanilla, "mari": mari, "concat": concat}


def _matmul_timings(times: dict[str, list[float]]) -> dict:
    speedup, speedup_std = _ratio_stats(times["vanilla"], times["mari"])
    return {
        "time_vanilla_ms": statistics.median(times["vanilla"]),
        "time_mari_ms": statistics.median(times["mari"]),
        "time_speedup": speedup,
        "time_speedup_std": speedup_std,
    }


def _concat_timings(times: dict[str, list[float]]) -> dict:
    return {
        "time_concat_ms": statistics.median(times["concat"]),
        "time_speedup_vs_concat": _ratio_stats(times["concat"], times["mari"])[0],
    }


def matmul_point(
    b: int = 1000,
    d_user: int = 4000,
    d_item: int = 1000,
    d_cross: int = 0,
    d_hidden: int = 512,
    reps: int = 20,
    warmup: int = 3,
    threads: int = 2,
    device: str = "cpu",
    seed: int = 0,
    with_concat: bool = False,
) -> dict:
    """One Table-2 point: vanilla vs MaRI fusion MatMul, interleaved, same inputs and weights."""
    _check_matmul_sizes(b, d_user, d_item, d_cross, d_hidden, reps)
    dev = _setup(threads, device, seed)
    sizes = (b, d_user, d_item, d_cross, d_hidden)
    fns = matmul_methods(*sizes, dev)
    if not with_concat:
        del fns["concat"]
    with torch.inference_mode():
        ref = fns["vanilla"]()
        max_abs_diff = _max_abs_diff(ref, fns["mari"]())
        scale = float(ref.abs().max())
        times = interleaved_times(fns, reps, warmup, dev)
    return {
        **dict(zip(("b", "d_user", "d_item", "d_cross", "d_hidden"), sizes)),
        "flops_vanilla": matmul_flops_vanilla(*sizes),
        "flops_mari": matmul_flops_mari(*sizes),
        "flops_speedup": flops_speedup(*sizes),
        **_matmul_timings(times),
        "max_abs_diff": max_abs_diff,
        "max_rel_diff": max_abs_diff / max(scale, 1e-30),
        "reps": reps,
        **(_concat_timings(times) if with_concat else {}),
    }


def fragmented_methods(
    layout: FeatureLayout, b: int, d_hidden: int, dev: torch.device
) -> dict[str, Callable[[], torch.Tensor]]:
    """vanilla, neat MaRI and fragmented MaRI on one random request in the fragmented `layout`."""
    d = layout.width
    w = torch.randn(d, d_hidden, device=dev) / d**0.5
    bias = torch.randn(d_hidden, device=dev)
    # one request in the fragmented layout: a user row and a packed candidate tensor
    user_full = torch.randn(1, d, device=dev)
    cand_full = torch.randn(b, d, device=dev)
    is_user = torch.cat([torch.full((c.width,), c.kind == "user") for c in layout.chunks]).to(dev)
    user_full = user_full * is_user
    cand_full = cand_full * ~is_user
    x_tiled = torch.where(is_user, user_full.expand(b, -1), cand_full).contiguous()  # VanI input
    frag = chunk_inputs(user_full, cand_full, w, layout)
    # neat: the reorganised layout, blocks contiguous (features arrive in [user | item | cross] order)
    perm = layout.neat_permutation().to(dev)
    neat_layout: FeatureLayout = layout.neat()
    neat = chunk_inputs(
        user_full[:, perm].contiguous(), cand_full[:, perm].contiguous(), w[perm], neat_layout
    )
    neat = (neat[0], [p.contiguous() for p in neat[1]], neat[2], neat[3])

    def vanilla() -> torch.Tensor:
        return torch.addmm(bias, x_tiled, w)

    def mari_neat() -> torch.Tensor:
        return mari_chunked(*neat, bias)

    def mari_fragmented() -> torch.Tensor:
        return mari_chunked(*frag, bias)

    return {"vanilla": vanilla, "mari_neat": mari_neat, "mari_fragmented": mari_fragmented}


def _fragmented_timings(times: dict[str, list[float]]) -> dict:
    vs_vanilla = _ratio_stats(times["mari_fragmented"], times["vanilla"])[0]
    vs_neat, vs_neat_std = _ratio_stats(times["mari_fragmented"], times["mari_neat"])
    return {
        "time_vanilla_ms": statistics.median(times["vanilla"]),
        "time_mari_neat_ms": statistics.median(times["mari_neat"]),
        "time_mari_fragmented_ms": statistics.median(times["mari_fragmented"]),
        "fragmented_over_neat": vs_neat,
        "fragmented_over_neat_std": vs_neat_std,
        "fragmented_over_vanilla": vs_vanilla,
        "degradation_vs_vanilla_pct": 100 * (vs_vanilla - 1),
        "degradation_vs_neat_pct": 100 * (vs_neat - 1),
        "neat_speedup_vs_vanilla": _ratio_stats(times["vanilla"], times["mari_neat"])[0],
    }


def fragmented_point(
    chunk: int = 50,
    b: int = 2000,
    d_user: int = 4000,
    d_item: int = 1000,
    d_cross: int = 0,
    d_hidden: int = 256,
    reps: int = 20,
    warmup: int = 3,
    threads: int = 2,
    device: str = "cpu",
    seed: int = 0,
) -> dict:
    """One Table-3 point: fragmented MaRI (a MatMul per chunk) vs neat MaRI vs the vanilla MatMul."""
    if chunk < 1 or b < 1 or reps < 1:
        raise ValueError(f"chunk, b and reps must be >= 1, got chunk={chunk}, b={b}, reps={reps}")
    dev = _setup(threads, device, seed)
    layout = fragmented_layout(d_user, d_item, d_cross, chunk)
    fns = fragmented_methods(layout, b, d_hidden, dev)
    with torch.inference_mode():
        ref = fns["vanilla"]()
        max_abs_diff = max(_max_abs_diff(ref, fns[m]()) for m in ("mari_neat", "mari_fragmented"))
        times = interleaved_times(fns, reps, warmup, dev)
    return {
        "chunk": chunk,
        "b": b,
        "d_user": d_user,
        "d_item": d_item,
        "d_cross": d_cross,
        "d_hidden": d_hidden,
        "chunks": len(layout.chunks),
        **_fragmented_timings(times),
        "max_abs_diff": max_abs_diff,
        "reps": reps,
    }


def table2_points() -> list[tuple[str, dict]]:
    pts = []
    for setting, values in PAPER_TABLE2.items():
        for value in values:
            pts.append((setting, {**TABLE2_FIXED[setting], setting: value}))
    return pts


def table2_rows(args: argparse.Namespace, common: dict) -> list[dict]:
    rows = []
    for setting, p in table2_points():
        r = matmul_point(**p, **common, with_concat=args.with_concat)
        paper = PAPER_TABLE2[setting][p[setting]]
        r |= {"setting": setting, "paper_flops_speedup": paper[0], "paper_time_speedup": paper[1]}
        rows.append(r)
        print(
            f"{setting:>8}={p[setting]:>5}: flops x{r['flops_speedup']:.2f} (paper {paper[0]:.2f})  "
            f"time x{r['time_speedup']:.2f}+-{r['time_speedup_std']:.2f} (paper {paper[1]:.2f})  "
            f"vanilla {r['time_vanilla_ms']:.2f} ms mari {r['time_mari_ms']:.2f} ms",
            flush=True,
        )
    return rows


def grid_rows(args: argparse.Namespace, common: dict) -> list[dict]:
    rows = []
    for b, du, di, dh in itertools.product(args.bs, args.d_users, args.d_items, args.d_hiddens):
        r = matmul_point(b, du, di, args.d_cross, dh, **common, with_concat=args.with_concat)
        rows.append(r)
        print(
            f"B={b} Du={du} Di={di} Dc={args.d_cross} d={dh}: flops x{r['flops_speedup']:.2f} "
            f"time x{r['time_speedup']:.2f}",
            flush=True,
        )
    return rows


def table3_rows(args: argparse.Namespace, common: dict) -> list[dict]:
    rows = []
    for c in args.chunks:
        r = fragmented_point(c, b=args.frag_b, d_user=4000, d_item=1000, d_cross=0, d_hidden=256, **common)
        paper = PAPER_TABLE3.get(c)
        if paper:
            r |= {"paper_degradation_vs_vanilla_pct": paper[0], "paper_degradation_vs_neat_pct": paper[1]}
        rows.append(r)
        print(
            f"chunk {c:>4} ({r['chunks']} chunks): fragmented/neat x{r['fragmented_over_neat']:.2f} "
            f"(+{r['degradation_vs_neat_pct']:.0f}%, paper +{paper[1] if paper else float('nan')}%), "
            f"vs vanilla {r['degradation_vs_vanilla_pct']:+.0f}% "
            f"(paper {paper[0] if paper else float('nan')}%)",
            flush=True,
        )
    return rows


def run(args: argparse.Namespace) -> dict:
    common = {
        "reps": args.reps,
        "warmup": args.warmup,
        "threads": args.threads,
        "device": args.device,
        "seed": args.seed,
    }
    result = result_header("mari_matmul", _setup(args.threads, args.device, args.seed))
    for wanted, key, rows in (
        (args.table2, "table2", table2_rows),
        (args.grid, "grid", grid_rows),
        (args.table3, "table3", table3_rows),
    ):
        if wanted:
            result[key] = rows(args, common)
    result["loadavg_end"] = os.getloadavg()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shared_options(
        p,
        device="cuda" if torch.cuda.is_available() else "cpu",
        threads=2,
        warmup=3,
        seed=0,
    )
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--table2", action="store_true", help="the paper's one-at-a-time sweeps (Table 2)")
    p.add_argument("--table3", action="store_true", help="fragmented vs neat layout over --chunks (Table 3)")
    p.add_argument(
        "--grid", action="store_true", help="the product --bs x --d-users x --d-items x --d-hiddens"
    )
    p.add_argument(
        "--with-concat", action="store_true", help="also time the UOI form (tile + concat + MatMul)"
    )
    p.add_argument("--bs", type=int, nargs="+", default=[100, 500, 1000, 2000, 5000, 10000])
    p.add_argument("--d-users", type=int, nargs="+", default=[100, 1000, 4000, 10000])
    p.add_argument("--d-items", type=int, nargs="+", default=[100, 1000, 10000])
    p.add_argument("--d-hiddens", type=int, nargs="+", default=[64, 128, 512, 1024])
    p.add_argument("--d-cross", type=int, default=0)
    p.add_argument("--chunks", type=int, nargs="+", default=[50, 100, 200, 400, 800])
    p.add_argument("--frag-b", type=int, default=2000, help="candidates per request in --table3")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not (args.table2 or args.table3 or args.grid):
        args.table2 = args.table3 = True
    write_result(args.out, run(args))
    return 0


if __name__ == "__main__":
    run_main(main)
