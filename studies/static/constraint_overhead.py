"""What a constraint costs each beam-based decoder: constrained vs unconstrained, one process, same users.

    python -m genrec.studies.static.constraint_overhead --catalogue 1000000 \\
        --codebooks 256 256 256 4 --model-size small --decoders beam nezha \\
        --batch-sizes 1 16 --repeats 15 --threads 1 [--out docs/results/constraint_overhead_cpu.json]

Speed needs no trained weights, so the model (and NEZHA's draft head) are random, built from a
seed: the benchmark runs on any machine with no checkpoint or dataset. The catalogue is
`--catalogue` distinct SIDs drawn uniformly from the codebooks' SID space; the constraint is
`--constraint` (default `all`: every catalogue item, so |C| = --catalogue) through STATIC's index
(`BeamParams.constraint`, the level processor of the one beam core).

For every decoder and batch size both arms (constraint none / the constraint) decode the same
histories, alternating which goes first per repeat; after warm-up, per-repeat ratios
(constrained / unconstrained wall time) are summarised by their median and 10th/90th percentiles.
Also reported: beam search's search overhead share (decode - decode_forward) / decode, unconstrained.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import torch

from genrec.studies.common.options import add_shared_options
from genrec.workloads.decoding import mtp as _mtp  # noqa: F401  (registers nezha)
from genrec.workloads.decoding.base import DecoderContext, DecodeResult, get_decoder, make_params
from genrec.workloads.errors import UserInputError, run_main
from genrec.workloads.models.model_config import model_config_for
from genrec.workloads.models.nezha_head import HeadConfig, build_head
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.results import benchmark_summary
from genrec.workloads.sid_codec import SIDCodec

MODULE = "genrec.studies.static.constraint_overhead"
DECODERS = ("beam", "nezha")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    p.add_argument("--catalogue", type=int, default=1_000_000, help="items (distinct random SIDs)")
    p.add_argument("--codebooks", type=int, nargs="+", default=[256, 256, 256, 4])
    p.add_argument("--constraint", default="all", help="a constraint rule (all, random, cold_start, ...)")
    p.add_argument("--constraint-size", type=int, default=0, help="n for random / uniform")
    p.add_argument("--model-size", default="small")
    p.add_argument("--decoders", nargs="+", default=list(DECODERS), choices=DECODERS)
    add_shared_options(
        p,
        beam_width=10,
        repeats=15,
        warmup=3,
        threads=1,
        seed=0,
    )
    p.add_argument("--history", type=int, default=20, help="items per user history")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--out", default=None, help="write the summary as JSON here")
    args = p.parse_args(argv)
    for name in ("catalogue", "beam_width", "history", "repeats", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def random_catalogue(codec: SIDCodec, n: int, seed: int) -> np.ndarray:
    """n distinct SIDs drawn uniformly from the codec's SID space ([n, L] codes)."""
    if n > codec.num_sids:
        raise UserInputError(f"--catalogue {n} exceeds the SID space of {codec.num_sids} SIDs")
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, codec.num_sids, size=n, dtype=np.int64))
    while len(keys) < n:
        keys = np.unique(np.concatenate([keys, rng.integers(0, codec.num_sids, size=n - len(keys))]))
    return np.asarray(codec.keys_to_codes(rng.permutation(keys)))


def random_context(args: argparse.Namespace) -> DecoderContext:
    codec = SIDCodec(tuple(args.codebooks))
    items = random_catalogue(codec, args.catalogue, args.seed)
    torch.manual_seed(args.seed)
    prompt = (args.history + 1) * codec.levels + 2
    model = GRTransformer(model_config_for(args.model_size, codec.vocab_size, prompt)).eval()
    head = build_head(HeadConfig.for_variant("nezha", model.config.dim, codec.codebook_sizes, "full")).eval()
    popularity = np.random.default_rng(args.seed).integers(0, 3, len(items))
    return DecoderContext(model, codec, items, args.history, popularity, head)


@dataclass(frozen=True)
class ArmTimes:
    plain_ms: list[float]
    constrained_ms: list[float]
    search_overhead: list[float]


def time_arms(ctx: DecoderContext, decoder: str, histories, base: dict, constrained: dict, args) -> ArmTimes:
    dec = get_decoder(decoder)
    arms = [make_params(dec, base), make_params(dec, {**base, **constrained})]
    times: list[list[float]] = [[], []]
    overhead = []
    for r in range(args.warmup + args.repeats):
        for arm in (0, 1) if r % 2 == 0 else (1, 0):
            t0 = time.perf_counter_ns()
            res: DecodeResult = dec.decode(ctx, histories, arms[arm])
            ms = (time.perf_counter_ns() - t0) / 1e6
            if r >= args.warmup:
                times[arm].append(ms)
                if arm == 0 and "decode_forward" in res.timings_ms:
                    t = res.timings_ms
                    overhead.append((t["decode"] - t["decode_forward"]) / t["decode"])
    return ArmTimes(times[0], times[1], overhead)


def summarise(t: ArmTimes) -> dict:
    ratio = np.asarray(t.constrained_ms) / np.asarray(t.plain_ms)
    out = {
        "plain_ms_median": float(np.median(t.plain_ms)),
        "constrained_ms_median": float(np.median(t.constrained_ms)),
        "ratio_median": float(np.median(ratio)),
        "ratio_p10": float(np.percentile(ratio, 10)),
        "ratio_p90": float(np.percentile(ratio, 90)),
    }
    if t.search_overhead:
        out["search_overhead_share"] = float(np.median(t.search_overhead))
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"building a random catalogue of {args.catalogue} SIDs over codebooks {args.codebooks} ...",
        flush=True,
    )
    ctx = random_context(args)
    rng = np.random.default_rng(args.seed + 1)
    base = {"beam_width": args.beam_width, "k": args.beam_width}
    constrained = {"constraint": args.constraint, "constraint_size": args.constraint_size}
    cset = ctx.constraints.constraint_set(make_params(get_decoder("beam"), {**base, **constrained}))
    rows = {}
    for decoder in args.decoders:
        for batch in args.batch_sizes:
            histories = [list(rng.integers(0, args.catalogue, args.history)) for _ in range(batch)]
            s = summarise(time_arms(ctx, decoder, histories, base, constrained, args))
            rows[f"{decoder}_b{batch}"] = s
            print(
                f"{decoder:6s} batch {batch:3d}: none {s['plain_ms_median']:8.2f} ms  "
                f"{args.constraint} {s['constrained_ms_median']:8.2f} ms  ratio {s['ratio_median']:.3f} "
                f"[p10 {s['ratio_p10']:.3f}, p90 {s['ratio_p90']:.3f}]"
                + (
                    f"  search overhead {s['search_overhead_share']:.3f}"
                    if "search_overhead_share" in s
                    else ""
                ),
                flush=True,
            )
    size = len(cset.codes)
    return benchmark_summary(MODULE, argv, ctx.device, args, rows, args.out, constraint_size=size)


if __name__ == "__main__":
    run_main(main)
