"""Our beam search side by side with Hugging Face transformers beam search, same weights, one process.

    python -m genrec.studies.beam.beam_vs_hf --model DIR [--data DIR] \\
        --beam-widths 5 20 50 --users 64 --batch-size 16 --repeats 5 --warmup 2 --threads 2 \\
        [--out docs/results/beam_vs_hf.json]

The checkpoint is loaded once and copied into an equivalent `LlamaForCausalLM` (hf_bridge). For
each beam width both decoders run on the SAME batches of the first `--users` test users,
interleaved batch by batch (ours then HF on even repeats, HF then ours on odd ones) so machine
drift and cache warmth affect both alike. Both are timed end to end per batch, from histories to
top-K SIDs (prompt building included for both; ours also maps SIDs to item ids).

Reported per width: per-batch latency median/p99 of each, the speed ratio (HF median / ours
median; > 1 means we are faster), our search overhead share (decode - decode_forward) / decode
from our DecodeResult timings (everything in the decode loop except `model.step`), and the
fraction of users whose top-K SIDs agree (up to ties in score). Agreement below 1.0 fails the run
unless --allow-mismatch. Needs the `peers` extra (transformers); runs on CPU or CUDA.

Run it on a quiet machine: with more torch threads than free cores, CPU timings of both decoders
degrade by up to ~50x (seen with --threads 2 on a 2-core machine with one core busy).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from genrec.studies.common.options import REQUIRED, add_shared_options, resolve_model_flags
from genrec.workloads.data.dataset import Dataset
from genrec.workloads.decoding.base import DecoderContext, DecodeResult, get_decoder, make_params
from genrec.workloads.decoding.hf_beam import REAL_SCORE, generate_sid_beams
from genrec.workloads.errors import UserInputError, run_main
from genrec.workloads.evaluation import load_context
from genrec.workloads.models.checkpoint import Checkpoint
from genrec.workloads.models.hf_bridge import DEFAULT_ATTN, to_hf_llama
from genrec.workloads.results import current_environment


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m genrec.studies.beam.beam_vs_hf", description=__doc__.split("\n")[0]
    )
    add_shared_options(
        p,
        helps={
            "model": "checkpoint folder (genrec train --out)",
            "data": "dataset folder (default: the one the checkpoint names)",
            "k": "SIDs returned per user (capped at the beam width)",
            "repeats": "timed passes over all batches",
            "warmup": "untimed batches per decoder and width",
            "device": "cpu, cuda or auto",
        },
        model=REQUIRED,
        data=None,
        k=10,
        batch_size=16,
        repeats=5,
        warmup=2,
        threads=2,
        device="cpu",
    )
    p.add_argument("--beam-widths", type=int, nargs="+", default=[5, 20, 50])
    p.add_argument("--users", type=int, default=64, help="first N test users")
    p.add_argument(
        "--attn", default=DEFAULT_ATTN, choices=["sdpa", "eager"], help="HF attention implementation"
    )
    p.add_argument("--tol", type=float, default=1e-4, help="score tolerance for agreement and ties")
    p.add_argument("--allow-mismatch", action="store_true", help="report disagreement instead of failing")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    for name in ("users", "batch_size", "repeats", "k"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0 or args.threads < 0 or min(args.beam_widths) < 1:
        p.error("--warmup and --threads must be >= 0 and beam widths >= 1")
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def user_agrees(
    codes: torch.Tensor, scores: torch.Tensor, ref_codes: torch.Tensor, ref_scores: torch.Tensor, tol: float
) -> bool:
    """Same top-K SIDs for one user ([K, L] codes, [K] scores), up to ties in score.

    Only real beams count (scores above REAL_SCORE); both sides must have the same number of them,
    with the same scores position by position, and an SID that differs must be tied with one the
    other side returned.
    """
    real, ref_real = scores > REAL_SCORE, ref_scores > REAL_SCORE
    if not torch.equal(real, ref_real):
        return False
    if not torch.allclose(scores[real], ref_scores[real], atol=tol, rtol=tol):
        return False
    for j in torch.nonzero(real)[:, 0].tolist():
        if torch.equal(codes[j], ref_codes[j]):
            continue
        tied = torch.nonzero(ref_real & ((ref_scores - scores[j]).abs() <= tol))[:, 0]
        if not any(torch.equal(codes[j], ref_codes[i]) for i in tied.tolist()):
            return False
    return True


def hf_top_k(hf, ctx: DecoderContext, hist: list[list[int]], width: int, k: int):
    """HF beam search from histories to top-K SIDs and scores (prompt building included)."""
    tokens, mask = ctx.prompts(hist)
    return generate_sid_beams(hf, ctx.codec, tokens, mask, width, k)


def timed_ms(device: torch.device, fn, *args):
    """(milliseconds, result) of fn(*args), synchronising the device before and after."""
    _sync(device)
    t0 = time.perf_counter_ns()
    out = fn(*args)
    _sync(device)
    return (time.perf_counter_ns() - t0) / 1e6, out


@dataclass
class WidthTally:
    """What the timed passes at one beam width accumulate: per-batch latencies, our decode timings
    and the agreement counts."""

    ours_ms: list[float] = field(default_factory=list)
    hf_ms: list[float] = field(default_factory=list)
    decode_ms: float = 0.0
    forward_ms: float = 0.0
    agree: int = 0
    users: int = 0
    max_score_diff: float = 0.0

    def add_times(self, t_ours: float, t_hf: float, res: DecodeResult) -> None:
        self.ours_ms.append(t_ours)
        self.hf_ms.append(t_hf)
        self.decode_ms += res.timings_ms.get("decode", 0.0)
        self.forward_ms += res.timings_ms.get("decode_forward", 0.0)

    def add_agreement(self, res: DecodeResult, codes: torch.Tensor, scores: torch.Tensor, tol: float) -> None:
        ours_codes, ours_scores = res.codes.cpu(), res.scores.cpu()
        codes, scores = codes.cpu(), scores.cpu()
        for b in range(len(ours_codes)):
            self.users += 1
            self.agree += user_agrees(codes[b], scores[b], ours_codes[b], ours_scores[b], tol)
            both = (ours_scores[b] > REAL_SCORE) & (scores[b] > REAL_SCORE)
            if both.any():
                diff = (ours_scores[b][both] - scores[b][both]).abs().max()
                self.max_score_diff = max(self.max_score_diff, float(diff))


def timed_passes(run_ours, run_hf, batches: list[list[list[int]]], repeats: int, tol: float) -> WidthTally:
    """`repeats` passes over all batches, ours then HF on even passes and HF then ours on odd ones."""
    tally = WidthTally()
    for rep in range(repeats):
        for hist in batches:
            if rep % 2 == 0:
                t_ours, res = run_ours(hist)
                t_hf, (codes, scores) = run_hf(hist)
            else:
                t_hf, (codes, scores) = run_hf(hist)
                t_ours, res = run_ours(hist)
            tally.add_times(t_ours, t_hf, res)
            if rep == 0:  # both searches are deterministic: check agreement once per batch
                tally.add_agreement(res, codes, scores, tol)
    return tally


def width_row(width: int, k: int, n_batches: int, tally: WidthTally) -> dict:
    ours_ms, hf_ms, decode_ms, forward_ms = tally.ours_ms, tally.hf_ms, tally.decode_ms, tally.forward_ms
    ours_p50, ours_p99 = np.percentile(ours_ms, [50, 99])
    hf_p50, hf_p99 = np.percentile(hf_ms, [50, 99])
    return {
        "beam_width": width,
        "k": k,
        "batches": n_batches,
        "timed_batches_per_decoder": len(ours_ms),
        "ours_ms": {"p50": float(ours_p50), "p99": float(ours_p99), "mean": float(np.mean(ours_ms))},
        "hf_ms": {"p50": float(hf_p50), "p99": float(hf_p99), "mean": float(np.mean(hf_ms))},
        "speed_ratio": float(hf_p50 / ours_p50),
        "ours_decode_ms_per_batch": decode_ms / len(ours_ms),
        "ours_decode_forward_ms_per_batch": forward_ms / len(ours_ms),
        "overhead_share": (decode_ms - forward_ms) / decode_ms if decode_ms > 0 else float("nan"),
        "agreement": tally.agree / tally.users,
        "max_score_diff": tally.max_score_diff,
        "samples_ms": {"ours": ours_ms, "hf": hf_ms},
    }


def bench_width(
    ctx: DecoderContext, hf, batches: list[list[list[int]]], width: int, args: argparse.Namespace
) -> dict:
    beam = get_decoder("beam")
    k = min(args.k, width)
    params = make_params(beam, {"beam_width": width, "k": k})

    def run_ours(hist):
        return timed_ms(ctx.device, beam.decode, ctx, hist, params)

    def run_hf(hist):
        return timed_ms(ctx.device, hf_top_k, hf, ctx, hist, width, k)

    for hist in batches[: args.warmup]:
        run_ours(hist)
        run_hf(hist)
    tally = timed_passes(run_ours, run_hf, batches, args.repeats, args.tol)
    return width_row(width, k, len(batches), tally)


def format_table(rows: list[dict]) -> str:
    header = ["width", "ours p50", "ours p99", "hf p50", "hf p99", "hf/ours", "overhead", "agreement"]
    lines = [
        [
            str(r["beam_width"]),
            f"{r['ours_ms']['p50']:.2f}",
            f"{r['ours_ms']['p99']:.2f}",
            f"{r['hf_ms']['p50']:.2f}",
            f"{r['hf_ms']['p99']:.2f}",
            f"{r['speed_ratio']:.2f}x",
            f"{100 * r['overhead_share']:.1f}%",
            f"{r['agreement']:.3f}",
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join(
        [fmt.format(*header), fmt.format(*("-" * w for w in widths)), *(fmt.format(*line) for line in lines)]
    )


def argv_and_command(argv: list[str] | None) -> tuple[list[str], str]:
    """The arguments to parse and the command line to record."""
    if argv is None:
        return sys.argv[1:], shlex.join(sys.orig_argv)
    return argv, shlex.join([sys.executable, "-m", "genrec.studies.beam.beam_vs_hf", *argv])


def user_histories(ds: Dataset, users: int) -> list[list[int]]:
    examples = ds.eval_examples("test")[:users]
    if not examples:
        raise UserInputError(f"{ds.root}: no user has both history and a test target")
    return [ex.history for ex in examples]


def bench_widths(
    ctx: DecoderContext, hf, batches: list[list[list[int]]], args: argparse.Namespace
) -> list[dict]:
    rows = []
    for width in args.beam_widths:
        r = bench_width(ctx, hf, batches, width, args)
        rows.append(r)
        print(
            f"width {width}: ours {r['ours_ms']['p50']:.2f} ms, hf {r['hf_ms']['p50']:.2f} ms per batch, "
            f"agreement {r['agreement']:.3f}",
            file=sys.stderr,
            flush=True,
        )
    return rows


def result_record(
    args: argparse.Namespace,
    command: str,
    ctx: DecoderContext,
    ds: Dataset,
    ckpt: Checkpoint,
    transformers_version: str,
    users: int,
    rows: list[dict],
) -> dict:
    return {
        "benchmark": "beam_vs_hf",
        "command": command,
        "env": asdict(current_environment(ctx.device)),
        "transformers_version": transformers_version,
        "hf_attn_implementation": args.attn,
        "model": str(Path(args.model).resolve()),
        "model_config": ckpt.model.config.to_dict(),
        "codebook_sizes": list(ctx.codec.codebook_sizes),
        "dataset": str(ds.root),
        "users": users,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "rows": rows,
    }


def mismatch_exit_code(rows: list[dict], allow_mismatch: bool) -> int:
    """1 (with an error line) when a width's top-K SIDs differ from HF's, unless allowed."""
    bad = [r["beam_width"] for r in rows if r["agreement"] < 1.0]
    if bad and not allow_mismatch:
        print(
            f"error: top-K SIDs differ from HF at beam widths {bad} (see agreement); "
            "pass --allow-mismatch to report without failing",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv, command = argv_and_command(argv)
    args = parse_args(argv)
    try:
        if args.threads:
            torch.set_num_threads(args.threads)
        resolve_model_flags(args)
        ctx, ds, ckpt = load_context(args.model, args.data, args.device)
        torch.manual_seed(0)
        histories = user_histories(ds, args.users)
        batches = [histories[i : i + args.batch_size] for i in range(0, len(histories), args.batch_size)]
        hf = to_hf_llama(ctx.model, attn_implementation=args.attn)
        import transformers

        rows = bench_widths(ctx, hf, batches, args)
    except UserInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    print(
        f"beam search vs HF transformers {transformers.__version__} generate ({args.attn}), {ctx.device}, "
        f"threads={torch.get_num_threads()}, {len(histories)} users in batches of {args.batch_size}, "
        f"{args.repeats} repeats; per-batch ms"
    )
    print(format_table(rows))
    result = result_record(args, command, ctx, ds, ckpt, transformers.__version__, len(histories), rows)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")
    return mismatch_exit_code(rows, args.allow_mismatch)


if __name__ == "__main__":
    run_main(main)
