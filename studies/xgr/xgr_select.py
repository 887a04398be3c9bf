"""Beam selection: xGR's early-terminating top-BW (xbeam.EarlyTopK) vs one flat top-k, in one process.

    python -m genrec.studies.xgr.xgr_select --batch 1 4 --beam 512 --codebook 256 \\
        --dist random peaked --repeats 300 --threads 1 [--device cpu] [--out docs/results/xgr_select_cpu.json]

One level of beam search: w = BW beams per user, each with T candidate codes, scores[b, j] (the beams'
cumulative log-probs, sorted best first) + log_probs[b, j, c] (log-softmax of random logits; `peaked`
scales the logits by 4, like a trained model's). Every repeat draws NEW inputs (a CPU top-k on the same
data twice runs far faster: the branch predictor learns it), touches them so both methods find them in
cache, then times each method once, the order rotated per repeat. Methods:

    flat          beam_core.select_beams: torch.topk over the B x BW*T candidates (what `beam` runs)
    early         xbeam.EarlyTopK: group maxima, the BW+1 best groups, exact top-BW among them
    flat_numpy    an exact flat top-BW with numpy argpartition (the selection algorithm `early` uses on
                  CPU): separates the pruning's gain from the better CPU selection routine
    perbeam_sort  sorting each beam's candidates (topk(min(BW, T)) per row): the first step of the
                  paper's heap form, timed alone (its merge would come on top), in a separate loop
    group_max     the one full pass `early` cannot avoid (the group maxima): its ceiling

Every repeat checks `early` against the flat values and, for the first repeats, against a stable
descending sort (parents and codes too, ties by lower index). Reported per (batch, dist): median and
p99 per method in microseconds, and flat / early (median of per-repeat ratios and ratio of medians).
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
from genrec.workloads.decoding.beam_core import select_beams
from genrec.workloads.decoding.xbeam import STRIPES, EarlyTopK, pruned_topk
from genrec.workloads.errors import run_main
from genrec.workloads.io import atomic_write_text
from genrec.workloads.results import command_line, current_environment

METHODS = ("flat", "early", "flat_numpy", "group_max")  # interleaved repeat by repeat
SORT_REPEATS = 20  # perbeam_sort runs in its own loop: its ~30x longer sorts slow whatever runs next
TEMPS = {"random": 1.0, "peaked": 4.0}


def flat_numpy(scores: torch.Tensor, log_probs: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact flat top-k with numpy's argpartition: (values, flat index), best first, ties by index.
    On CUDA the inputs are copied to the host first (numpy has no device arrays): part of its cost."""
    b, w, t = log_probs.shape
    cand = (scores.cpu().numpy()[:, :, None] + log_probs.cpu().numpy()).reshape(b, w * t)
    n = w * t
    top = cand.argpartition(n - k, axis=1)[:, n - k :]
    values = np.take_along_axis(cand, top, 1)
    order = np.lexsort((top, -values), axis=-1)
    return np.take_along_axis(values, order, 1), np.take_along_axis(top, order, 1)


def make_inputs(
    batch: int, beam: int, codebook: int, temp: float, gen: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = (torch.randn(batch, beam, generator=gen) * 2 - 8).sort(dim=1, descending=True).values
    lp = torch.log_softmax(torch.randn(batch, beam, codebook, generator=gen) * temp, dim=-1)
    return scores.to(device), lp.to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_method(name: str, scores: torch.Tensor, lp: torch.Tensor, k: int) -> object:
    if name == "flat":
        return select_beams(scores, lp, k)
    if name == "early":
        return EarlyTopK()(scores, lp, k)
    if name == "flat_numpy":
        return flat_numpy(scores, lp, k)
    if name == "perbeam_sort":
        return lp.topk(min(k, lp.shape[-1]), dim=-1)
    b, w, t = lp.shape
    return torch.amax(lp.view(b, w, t // STRIPES, STRIPES), dim=2)


def check(scores: torch.Tensor, lp: torch.Tensor, k: int, got: tuple, flat: tuple, full: bool) -> None:
    if not torch.equal(got[0], flat[0]):
        raise AssertionError("early top-BW values differ from the flat top-k")
    if full:
        b, w, t = lp.shape
        ref_v, ref_i = (scores[:, :, None] + lp).view(b, -1).sort(dim=1, descending=True, stable=True)
        ref = (ref_v[:, :k], ref_i[:, :k] // t, ref_i[:, :k] % t)
        if not all(torch.equal(x, y) for x, y in zip(got, ref)):
            raise AssertionError("early top-BW differs from a stable descending sort")


def bench_point(args: argparse.Namespace, batch: int, dist: str, device: torch.device) -> dict:
    gen = torch.Generator().manual_seed(args.seed)
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    fallbacks = 0
    for rep in range(args.warmup + args.repeats):
        scores, lp = make_inputs(batch, args.beam, args.codebook, TEMPS[dist], gen, device)
        out = {}
        order = METHODS[rep % len(METHODS) :] + METHODS[: rep % len(METHODS)]
        for name in order:
            float(lp.sum())  # bring the inputs into cache for every method alike
            _sync(device)
            t0 = time.perf_counter_ns()
            out[name] = run_method(name, scores, lp, args.beam)
            _sync(device)
            if rep >= args.warmup:
                times[name].append((time.perf_counter_ns() - t0) / 1e3)
        check(scores, lp, args.beam, out["early"], out["flat"], full=rep < args.warmup + 5)
        fallbacks += early_path_fell_back(scores, lp, args.beam)
    times["perbeam_sort"] = []
    for _ in range(SORT_REPEATS):
        scores, lp = make_inputs(batch, args.beam, args.codebook, TEMPS[dist], gen, device)
        float(lp.sum())
        _sync(device)
        t0 = time.perf_counter_ns()
        run_method("perbeam_sort", scores, lp, args.beam)
        _sync(device)
        times["perbeam_sort"].append((time.perf_counter_ns() - t0) / 1e3)
    row: dict = {"batch": batch, "beam": args.beam, "codebook": args.codebook, "dist": dist}
    for name, ts in times.items():
        row[f"{name}_us_median"] = float(np.median(ts))
        row[f"{name}_us_p99"] = float(np.percentile(ts, 99))
    ratios = np.array(times["flat"]) / np.array(times["early"])
    row["flat_over_early_median_ratio"] = float(np.median(ratios))
    row["flat_over_early_of_medians"] = row["flat_us_median"] / row["early_us_median"]
    row["flat_numpy_over_early_of_medians"] = row["flat_numpy_us_median"] / row["early_us_median"]
    row["flat_over_group_max_ceiling"] = row["flat_us_median"] / row["group_max_us_median"]
    row["early_fallbacks"] = fallbacks
    row["repeats"] = args.repeats
    return row


def early_path_fell_back(scores: torch.Tensor, lp: torch.Tensor, k: int) -> int:
    """1 when the pruned path could not prove its result (the exact flat fallback ran), else 0."""
    return int(pruned_topk(scores, lp, min(k, lp.shape[1] * lp.shape[2])) is None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m genrec.studies.xgr.xgr_select", description=__doc__.split("\n")[0]
    )
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4], help="users per call")
    p.add_argument("--beam", type=int, default=512, help="BW (beams per user, and the top-k)")
    p.add_argument("--codebook", type=int, default=256, help="T (codes per beam)")
    p.add_argument("--dist", nargs="+", default=["random", "peaked"], choices=sorted(TEMPS))
    add_shared_options(
        p,
        repeats=300,
        warmup=10,
        threads=1,
        device="cpu",
        seed=0,
    )
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = []
    for batch in args.batch:
        for dist in args.dist:
            rows.append(bench_point(args, batch, dist, device))
            r = rows[-1]
            print(
                f"B={batch} {dist}: flat {r['flat_us_median']:.0f} us, early {r['early_us_median']:.0f} us "
                f"(x{r['flat_over_early_of_medians']:.2f}), flat_numpy {r['flat_numpy_us_median']:.0f} us, "
                f"perbeam_sort {r['perbeam_sort_us_median']:.0f} us, "
                f"group_max {r['group_max_us_median']:.0f} us, fallbacks {r['early_fallbacks']}",
                flush=True,
            )
    result = {
        "benchmark": "xgr_select",
        "command": command_line("genrec.studies.xgr.xgr_select", argv),
        "env": asdict(current_environment(device)),
        "rows": rows,
    }
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    run_main(main)
