"""Bring your own model, side by side: our `beam` on an imported checkpoint against `hf_beam` (HF generate
on the original folder), and `level_softmax` against the full softmax, in one process.

    python -m genrec.studies.beam.byom_vs_hf --model runs/models/NAME [--beam-width 20] [--k 10] \\
        [--users 64] [--batch-size 16] [--repeats 5] [--warmup 1] [--threads 2] [--device cpu] \\
        [--out runs/bench/byom_vs_hf.json]

`--model` is a folder written by `genrec model import hf`. Users are random histories over the stored
catalogue (seeded; no dataset needed). Three arms run on the SAME batches, alternating: on each repeat
the arms' order rotates (beam, hf_beam, beam+level_softmax; then hf_beam, level_softmax, beam; ...), so
machine drift and cache warmth hit every arm alike. Each arm is timed end to end per batch (prompts
included); the `beam` arms also report their decode time (the per-level steps) from DecodeResult.

Reported: per arm the median and spread (min, p10, p90, max) of per-batch latency, the speed ratio
hf_beam / beam (> 1: ours is faster), the decode-step ratio level_softmax / full softmax, the fraction of
users whose top-K equals hf_beam's (up to ties in score; below 1.0 fails the run unless
--allow-mismatch), and how much of the full softmax's top-K level_softmax keeps (its quality cost is
measured, not assumed). Needs the `peers` extra (transformers). Timings on a loaded machine drift: run it
on a quiet one and quote the ratios with the machine named.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from genrec.studies.common.options import add_shared_options, resolve_model_flags
from genrec.workloads.decoding.base import DecodeResult, get_decoder, make_params
from genrec.workloads.evaluation import load_imported_context

ARMS = ("beam", "hf_beam", "level_softmax")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m genrec.studies.beam.byom_vs_hf", description=__doc__.split("\n")[0]
    )
    p.add_argument("--model", required=True, help="folder from `genrec model import hf`, or hf:DIR")
    data_help = "with --model hf:DIR: the data set whose items' SIDs the import reads"
    add_shared_options(p, {"data": data_help}, data=None)
    p.add_argument("--beam-width", type=int, default=20)
    p.add_argument("--k", type=int, default=10, help="SIDs returned per user (<= beam width)")
    p.add_argument("--users", type=int, default=64)
    p.add_argument("--history", type=int, default=10, help="longest random history (items)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5, help="timed passes over all batches")
    p.add_argument("--warmup", type=int, default=1, help="untimed batches per arm")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (0 = leave as is)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=float, default=1e-4, help="score tolerance for agreement and ties")
    p.add_argument("--allow-mismatch", action="store_true", help="report disagreement instead of failing")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if min(args.users, args.batch_size, args.repeats, args.k, args.history) < 1 or args.k > args.beam_width:
        p.error("--users, --batch-size, --repeats, --k and --history must be >= 1, and --k <= --beam-width")
    return args


def random_histories(n_items: int, users: int, longest: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_items, size=int(rng.integers(1, longest + 1))).tolist() for _ in range(users)]


def same_top_k(
    codes: torch.Tensor, scores: torch.Tensor, ref_codes: torch.Tensor, ref_scores: torch.Tensor, tol: float
) -> bool:
    """One user's [K, L] codes / [K] scores equal the reference's up to ties (missing slots -inf in both)."""
    real = torch.isfinite(ref_scores)
    if not torch.equal(real, torch.isfinite(scores)):
        return False
    if not torch.allclose(scores[real], ref_scores[real], atol=tol, rtol=tol):
        return False
    for j in torch.nonzero(real)[:, 0].tolist():
        if torch.equal(codes[j], ref_codes[j]):
            continue
        tied = torch.nonzero(real & ((ref_scores - scores[j]).abs() <= tol))[:, 0].tolist()
        if not any(torch.equal(codes[j], ref_codes[i]) for i in tied):
            return False
    return True


def kept_fraction(res: DecodeResult, ref: DecodeResult) -> float:
    """Mean over users of |top-K(res) & top-K(ref)| / |top-K(ref)| over real SIDs (a quality proxy)."""
    shares = []
    for b in range(len(ref.codes)):
        want = {tuple(c) for c, s in zip(ref.codes[b].tolist(), ref.scores[b].tolist()) if s > float("-inf")}
        got = {tuple(c) for c, s in zip(res.codes[b].tolist(), res.scores[b].tolist()) if s > float("-inf")}
        shares.append(len(want & got) / max(1, len(want)))
    return float(np.mean(shares))


@dataclass
class Tally:
    ms: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ARMS})
    decode_ms: dict[str, list[float]] = field(default_factory=lambda: {"beam": [], "level_softmax": []})
    agree: int = 0
    users: int = 0
    kept: list[float] = field(default_factory=list)


def run_arm(ctx, arm: str, hist: list[list[int]], width: int, k: int) -> tuple[float, DecodeResult]:
    name, extra = ("hf_beam", {}) if arm == "hf_beam" else ("beam", {"level_softmax": arm == "level_softmax"})
    dec = get_decoder(name)
    params = make_params(dec, {"beam_width": width, "k": k, **extra})
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    res = dec.decode(ctx, hist, params)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter_ns() - t0) / 1e6, res


def rotation(rep: int) -> tuple[str, ...]:
    return ARMS[rep % 3 :] + ARMS[: rep % 3]


def timed_passes(ctx, batches: list[list[list[int]]], args: argparse.Namespace) -> Tally:
    tally = Tally()
    for rep, hist in itertools.product(range(args.repeats), batches):
        out = {arm: run_arm(ctx, arm, hist, args.beam_width, args.k) for arm in rotation(rep)}
        for arm, (ms, res) in out.items():
            tally.ms[arm].append(ms)
            if arm in tally.decode_ms:
                tally.decode_ms[arm].append(res.timings_ms.get("decode", 0.0))
        if rep == 0:  # every arm is deterministic: compare once per batch
            ours, ref = out["beam"][1], out["hf_beam"][1]
            for b in range(len(hist)):
                tally.users += 1
                tally.agree += same_top_k(
                    ours.codes[b], ours.scores[b], ref.codes[b], ref.scores[b], args.tol
                )
            tally.kept.append(kept_fraction(out["level_softmax"][1], ours))
    return tally


def spread(ms: list[float]) -> dict[str, float]:
    p = np.percentile(ms, [0, 10, 50, 90, 100])
    return dict(zip(("min", "p10", "median", "p90", "max"), map(float, p)))


def summary(tally: Tally, ckpt_meta: dict, args: argparse.Namespace, device: str) -> dict:
    med = {a: float(np.median(v)) for a, v in tally.ms.items()}
    dec = {a: float(np.median(v)) for a, v in tally.decode_ms.items()}
    return {
        "model": str(Path(args.model).resolve()),
        "backbone": {
            k: ckpt_meta["hf"][k] for k in ("architecture", "family", "n_params", "dtype", "vocab_size")
        },
        "device": device,
        "threads": torch.get_num_threads(),
        "beam_width": args.beam_width,
        "k": args.k,
        "users": tally.users,
        "batch_size": args.batch_size,
        "timed_batches_per_arm": len(tally.ms["beam"]),
        "latency_ms": {a: spread(v) for a, v in tally.ms.items()},
        "speed_ratio_hf_over_beam": med["hf_beam"] / med["beam"],
        "decode_ms": {a: spread(v) for a, v in tally.decode_ms.items()},
        "decode_ratio_level_softmax_over_full": dec["level_softmax"] / dec["beam"],
        "top_k_agreement_with_hf": tally.agree / tally.users,
        "level_softmax_keeps_of_full_top_k": float(np.mean(tally.kept)),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    resolve_model_flags(args)
    ctx, ckpt = load_imported_context(args.model, args.device)
    hist = random_histories(len(ctx.item_codes), args.users, args.history, args.seed)
    batches = [hist[i : i + args.batch_size] for i in range(0, len(hist), args.batch_size)]
    for arm in ARMS:  # warm-up: HF's copy is loaded here, not inside a timed batch
        for b in batches[: args.warmup]:
            run_arm(ctx, arm, b, args.beam_width, args.k)
    out = summary(timed_passes(ctx, batches, args), ckpt.meta, args, str(ctx.device))
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        from genrec.workloads.io import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    if out["top_k_agreement_with_hf"] < 1.0 and not args.allow_mismatch:
        print(
            f"top-K differs from hf_beam for {1 - out['top_k_agreement_with_hf']:.1%} of users",
            file=sys.stderr,
        )
        sys.exit(1)
    return out


if __name__ == "__main__":
    from genrec.workloads.errors import run_main

    run_main(main)
