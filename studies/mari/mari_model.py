"""The whole ranking model in VanI, UOI and MaRI at several B, same trained weights, one process.

    python -m genrec.studies.mari.mari_model --bs 100 500 1000 2000 --threads 2 \\
        --train-steps 100 --out docs/results/mari_model_cpu.json

The model (BENCH_CONFIG unless overridden: user profile 1024, sequence 50 x 64, item 256, cross 64,
4 experts of 256, 3 tasks) is trained for --train-steps on synthetic clicks first, so the weights are
trained ones. For each B one request (one user, B candidates from the synthetic data) is scored by the
three modes interleaved rep by rep; the scores of UOI and MaRI are compared with VanI's.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from dataclasses import asdict, replace
from functools import lru_cache
from pathlib import Path

import torch

from genrec.studies.common.cuda_graph import capture_cuda_graph
from genrec.studies.common.options import add_shared_options
from genrec.studies.mari.mari_matmul import (
    _max_abs_diff,
    _ratio_stats,
    _setup,
    interleaved_times,
    result_header,
    write_result,
)
from genrec.workloads.errors import run_main
from genrec.workloads.ranking.flops import counted_flops
from genrec.workloads.ranking.model import BENCH_CONFIG, RankingConfig
from genrec.workloads.ranking.modes import MODES, RankingScorer
from genrec.workloads.ranking.synth import synth_clicks
from genrec.workloads.ranking.train import train_ranking


@lru_cache(maxsize=2)
def trained_scorer(cfg: RankingConfig, train_steps: int, seed: int) -> tuple[RankingScorer, list[float]]:
    """Train once per (config, steps, seed) in this process; sweeps reuse it across trials."""
    res = train_ranking(cfg, steps=train_steps, batch=256, seed=seed)
    return RankingScorer(res.model), res.valid_auc


def _mode_calls(
    scorer: RankingScorer, cfg: RankingConfig, b: int, seed: int, dev: torch.device
) -> dict[str, Callable[[], torch.Tensor]]:
    """Each mode scoring one request: one user against B candidates from the synthetic data."""
    scorer.model.to(dev)
    scorer._mari = None  # rebuild the MaRI graph on this device
    data = synth_clicks(cfg, rows=b, seed=seed, split=2)
    profile, seq = data.profile[:1].to(dev), data.seq[:1].to(dev)  # one user ...
    items, cross = data.item.to(dev), data.cross.to(dev)  # ... against B candidates
    return {m: (lambda m=m: scorer.run(profile, seq, items, cross, m)) for m in MODES}


def _swap_in_cuda_graphs(
    fns: dict[str, Callable[[], torch.Tensor]], scores: dict[str, torch.Tensor], dev: torch.device
) -> float:
    """Replace each mode's call by a replay of its captured CUDA graph; the largest |graph - eager|."""
    graph_diff = 0.0
    for m in MODES:
        fns[m], out = capture_cuda_graph(fns[m], dev)
        fns[m]()
        graph_diff = max(graph_diff, _max_abs_diff(out, scores[m]))
    return graph_diff


def _mode_metrics(
    times: dict[str, list[float]], flops: dict[str, int], scores: dict[str, torch.Tensor]
) -> dict:
    return {
        **{f"time_{m}_ms": statistics.median(times[m]) for m in MODES},
        **{f"flops_{m}": flops[m] for m in MODES},
        "speedup_uoi_vs_vani": _ratio_stats(times["vani"], times["uoi"])[0],
        "speedup_mari_vs_uoi": _ratio_stats(times["uoi"], times["mari"])[0],
        "speedup_mari_vs_vani": _ratio_stats(times["vani"], times["mari"])[0],
        "max_abs_diff_uoi": _max_abs_diff(scores["uoi"], scores["vani"]),
        "max_abs_diff_mari": _max_abs_diff(scores["mari"], scores["vani"]),
    }


def model_point(
    b: int = 1000,
    d_user: int = BENCH_CONFIG.d_user,
    d_item: int = BENCH_CONFIG.d_item,
    d_cross: int = BENCH_CONFIG.d_cross,
    d_hidden: int = BENCH_CONFIG.d_hidden,
    experts: int = BENCH_CONFIG.experts,
    tasks: int = BENCH_CONFIG.tasks,
    seq_len: int = BENCH_CONFIG.seq_len,
    train_steps: int = 100,
    reps: int = 20,
    warmup: int = 3,
    threads: int = 2,
    device: str = "cpu",
    seed: int = 0,
    cuda_graph: bool = False,
) -> dict:
    """VanI / UOI / MaRI latency of the whole model on one request of B candidates.

    cuda_graph (CUDA only): time each mode as one captured CUDA graph replay, so kernel-launch and
    Python overhead (which grow with the number of MatMuls MaRI splits into) are taken out.
    """
    if b < 1 or reps < 1 or train_steps < 0:
        raise ValueError(f"b and reps must be >= 1, train_steps >= 0; got b={b}, reps={reps}, {train_steps=}")
    dev = _setup(threads, device, seed)
    sizes = {"d_user": d_user, "d_item": d_item, "d_cross": d_cross, "d_hidden": d_hidden}
    sizes |= {"experts": experts, "tasks": tasks, "seq_len": seq_len}
    cfg = replace(BENCH_CONFIG, **sizes).validate()
    scorer, valid_auc = trained_scorer(cfg, train_steps, seed)
    fns = _mode_calls(scorer, cfg, b, seed, dev)
    graphs = cuda_graph and dev.type == "cuda"
    with torch.inference_mode():
        scores = {m: fn() for m, fn in fns.items()}
        flops = {m: counted_flops(fn) for m, fn in fns.items()}
        graph_diff = _swap_in_cuda_graphs(fns, scores, dev) if graphs else 0.0
        times = interleaved_times(fns, reps, warmup, dev)
    return {
        "b": b,
        **sizes,
        "train_steps": train_steps,
        **_mode_metrics(times, flops, scores),
        "eligible_nodes": len(scorer.eligible),
        "valid_auc_mean": sum(valid_auc) / len(valid_auc),
        "reps": reps,
        "cuda_graph": bool(graphs),
        "max_abs_diff_graph_vs_eager": graph_diff,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shared_options(
        p,
        device="cuda" if torch.cuda.is_available() else "cpu",
        threads=2,
        warmup=3,
        seed=0,
    )
    p.add_argument("--bs", type=int, nargs="+", default=[100, 500, 1000, 2000])
    p.add_argument("--train-steps", type=int, default=100)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--cuda-graph", action="store_true", help="time CUDA graph replays (CUDA only)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    dev = _setup(args.threads, args.device, args.seed)
    result = result_header("mari_model", dev, config=asdict(BENCH_CONFIG), points=[])
    for b in args.bs:
        r = model_point(
            b,
            train_steps=args.train_steps,
            reps=args.reps,
            warmup=args.warmup,
            threads=args.threads,
            device=args.device,
            seed=args.seed,
            cuda_graph=args.cuda_graph,
        )
        result["points"].append(r)
        print(
            f"B={b:>5}: VanI {r['time_vani_ms']:.2f} ms  UOI {r['time_uoi_ms']:.2f} ms  "
            f"MaRI {r['time_mari_ms']:.2f} ms  (UOI/VanI x{r['speedup_uoi_vs_vani']:.2f}, "
            f"MaRI vs UOI x{r['speedup_mari_vs_uoi']:.2f}, max |diff| {r['max_abs_diff_mari']:.1e})",
            flush=True,
        )
    result["loadavg_end"] = os.getloadavg()
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    run_main(main)
