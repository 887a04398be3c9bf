"""NEZHA vs beam search (and MTP) latency, side by side in one process on the same batches.

    python -m genrec.studies.nezha.nezha_latency --beam-model runs/models/tiny \\
        --nezha-model runs/models/tiny-nezha [--mtp-model runs/models/tiny-mtp] [--data DIR] \\
        --beam-width 10 --users 256 --batch-size 32 --repeats 5 --warmup 2 --threads 1 \\
        [--device cpu|cuda|auto] [--with-hf] [--out runs/bench/nezha_latency.json]

The models should share a backbone size (checked). Every decoder runs on the SAME batches of the
first `--users` test users, interleaved batch by batch with the order rotated per repeat, so drift
affects all alike. Per decoder: end-to-end per-batch latency (median, p99), the phase split from
DecodeResult (prefill, draft, verify, decode), and quality on the measured users. Decoders:
beam (next-item model), nezha (verify=final), nezha-4 (verify=none), nezha-every (verify=every),
mtp (if given). Also: the verification's share of NEZHA's latency, the share of users whose list
holds K valid items, the ceiling on the speed-up (beam search over NEZHA's prefill alone: what a
free draft would give), and a micro-benchmark of the device verification (sorted keys + searchsorted)
against the Python-set reference on the same K x K candidate codes. --with-hf adds `beam-hf`:
Hugging Face transformers' generate(num_beams) on the beam model's weights (the peers extra), the
kind of beam search the paper's latencies were measured against; the speed-up target stays
against our own beam search, and this row only gives context.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import numpy as np
import torch

from genrec.studies.common.options import add_shared_options
from genrec.workloads.decoding import mtp as _mtp  # noqa: F401  (registers nezha and mtp)
from genrec.workloads.decoding.base import DecoderContext, DecodeResult, get_decoder, make_params
from genrec.workloads.decoding.hf_beam import REAL_SCORE, generate_sid_beams
from genrec.workloads.decoding.nezha import PythonSetVerifier
from genrec.workloads.errors import UserInputError, run_main
from genrec.workloads.evaluation import load_context
from genrec.workloads.io import atomic_write_text
from genrec.workloads.metrics import ranking_metrics
from genrec.workloads.models.hf_bridge import to_hf_llama
from genrec.workloads.results import command_line, current_environment


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m genrec.studies.nezha.nezha_latency", description=__doc__.split("\n")[0]
    )
    p.add_argument("--beam-model", required=True, help="next-item checkpoint (beam search)")
    p.add_argument("--nezha-model", required=True, help="checkpoint trained with --objective nezha")
    p.add_argument("--mtp-model", default=None, help="checkpoint trained with --objective mtp")
    add_shared_options(
        p,
        helps={
            "data": "dataset folder (default: the one the beam model names)",
            "repeats": "timed passes over all batches",
            "warmup": "untimed batches per decoder",
            "device": "cpu (the issue's target machine), cuda or auto",
        },
        data=None,
        beam_width=10,
        batch_size=32,
        repeats=5,
        warmup=2,
        threads=1,
        device="cpu",
    )
    p.add_argument("--users", type=int, default=256, help="first N test users")
    p.add_argument("--with-hf", action="store_true", help="also time HF generate beam search (beam-hf)")
    p.add_argument("--out", default=None, help="write the summary as JSON here")
    return p.parse_args(argv)


class HFBeamSearch:
    """HF `generate(num_beams)` on a next-item checkpoint, with the decoders' decode() interface
    and beam search's parameters."""

    name = "beam-hf"
    Params = get_decoder("beam").Params

    def __init__(self, ctx: DecoderContext) -> None:
        self.hf = to_hf_llama(ctx.model)  # imports transformers (the peers extra) only here

    def decode(self, ctx: DecoderContext, histories: list[list[int]], params) -> DecodeResult:
        tokens, mask = ctx.prompts(histories)
        codes, scores = generate_sid_beams(self.hf, ctx.codec, tokens, mask, params.beam_width, params.k)
        item_ids, valid = ctx.index.lookup(codes)
        return DecodeResult(codes, scores, item_ids, valid & (scores > REAL_SCORE))


def verification_microbench(ctx, k: int, users: int, repeats: int = 20) -> dict:
    """Median ms to verify users x K x K random candidate SIDs: device keys vs a Python set."""
    codec, rng = ctx.codec, np.random.default_rng(0)
    n = users * k * k
    codes = np.stack([rng.integers(0, t, size=n) for t in codec.codebook_sizes], axis=1)
    codes[: n // 2] = ctx.item_codes[rng.integers(0, len(ctx.item_codes), size=n // 2)]
    codes_t = torch.as_tensor(codes, device=ctx.device)
    sets, pyset = ctx.index.prefix_sets(), PythonSetVerifier(codec, ctx.item_codes)
    last = codec.levels - 1

    def device_check():
        return sets.contains(last, codec.codes_to_keys(codes_t))

    def python_check():
        return [pyset.contains(tuple(c)) for c in codes_t.tolist()]

    assert device_check().tolist() == python_check()
    out = {}
    for name, fn in (("device_ms", device_check), ("python_set_ms", python_check)):
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            fn()
            samples.append((time.perf_counter_ns() - t0) / 1e6)
        out[name] = float(np.median(samples))
    out["candidates"] = n
    return out


@dataclass
class LatencySetup:
    """What the timed rotation needs: each arm as label -> (context, decoder, params), warmed up;
    the batches of test examples; the backbone size per model (all equal, checked); the NEZHA
    context (for the verification micro-benchmark) and the dataset."""

    arms: dict
    batches: list
    sizes: dict
    nezha_ctx: DecoderContext
    dataset: object


def prepare_arms(args: argparse.Namespace, k: int) -> LatencySetup:
    """Load the models, build the arms and warm each up on the first `--warmup` batches."""
    beam_ctx, ds, beam_ckpt = load_context(args.beam_model, args.data, args.device)
    nezha_ctx, _, nezha_ckpt = load_context(args.nezha_model, str(ds.root), args.device)
    runs = [
        ("beam", beam_ctx, "beam", {}),
        ("nezha", nezha_ctx, "nezha", {"verify": "final"}),
        ("nezha-4", nezha_ctx, "nezha", {"verify": "none"}),
        ("nezha-every", nezha_ctx, "nezha", {"verify": "every"}),
    ]
    sizes = {"beam": beam_ckpt.meta.get("model_size"), "nezha": nezha_ckpt.meta.get("model_size")}
    if args.mtp_model:
        mtp_ctx, _, mtp_ckpt = load_context(args.mtp_model, str(ds.root), args.device)
        runs.append(("mtp", mtp_ctx, "mtp", {}))
        sizes["mtp"] = mtp_ckpt.meta.get("model_size")
    if len(set(sizes.values())) != 1:
        raise UserInputError(f"models differ in backbone size {sizes}; compare the same size")
    if args.with_hf:
        runs.append(("beam-hf", beam_ctx, "beam-hf", {}))
    examples = ds.eval_examples("test")[: args.users]
    batches = [examples[i : i + args.batch_size] for i in range(0, len(examples), args.batch_size)]
    arms = {}
    for label, ctx, name, extra in runs:
        dec = HFBeamSearch(ctx) if name == "beam-hf" else get_decoder(name)
        params = make_params(dec, {"beam_width": args.beam_width, "k": k, **extra})
        for batch in batches[: args.warmup]:
            dec.decode(ctx, [ex.history for ex in batch], params)
        arms[label] = (ctx, dec, params)
    return LatencySetup(arms, batches, sizes, nezha_ctx, ds)


def time_arms(arms: dict, batches: list, repeats: int) -> dict[str, dict]:
    """Every arm on every batch, interleaved batch by batch with the arm order rotated per repeat.
    Per arm: per-call latencies (ms), summed phase timings, and from the first repeat the ranked
    item lists, the count of users with K valid items and the summed counters."""
    out = {
        label: {"lat": [], "phases": {}, "ranked": [None] * len(batches), "full": 0, "counters": {}}
        for label in arms
    }
    order = list(arms)
    for rep in range(repeats):
        rot = order[rep % len(order) :] + order[: rep % len(order)]
        for bi, batch in enumerate(batches):
            hist = [ex.history for ex in batch]
            for label in rot:
                ctx, dec, params = arms[label]
                t0 = time.perf_counter_ns()
                res = dec.decode(ctx, hist, params)
                if ctx.device.type == "cuda":  # the decoder's last GPU work belongs to this batch
                    torch.cuda.synchronize()
                o = out[label]
                o["lat"].append((time.perf_counter_ns() - t0) / 1e6)
                for ph, v in res.timings_ms.items():
                    o["phases"][ph] = o["phases"].get(ph, 0.0) + v
                if rep == 0:
                    o["ranked"][bi] = res.item_ids.tolist()
                    o["full"] += int(res.valid.all(dim=1).sum())
                    for c, v in res.counters.items():
                        o["counters"][c] = o["counters"].get(c, 0) + v
    return out


def arm_summary(timed: dict, examples: list, n_calls: int) -> dict:
    """One arm's row: latency median and p99, mean phase ms per call, quality on the measured users,
    and the share of users (and of candidates) with valid items."""
    a, c = np.asarray(timed["lat"]), timed["counters"]
    flat = [r for part in timed["ranked"] for r in part]
    return {
        "median_ms": float(np.median(a)),
        "p99_ms": float(np.percentile(a, 99)),
        "phases_ms": {ph: v / n_calls for ph, v in timed["phases"].items()},
        "quality": ranking_metrics(flat, [ex.targets for ex in examples], (5, 10)),
        "users_with_k_valid": timed["full"] / len(examples),
        "drafts_valid_share": c["drafts_valid"] / c["candidates"] if "candidates" in c else None,
        "returned_valid_share": c["returned_valid"] / c["candidates"] if "candidates" in c else None,
    }


def speedups(d: dict) -> dict:
    """Beam search over NEZHA, the free-draft ceiling and the verification's shares."""
    out = {
        "speedup_beam_over_nezha": d["beam"]["median_ms"] / d["nezha"]["median_ms"],
        # NEZHA cannot beat its own prefill: beam search's latency over it is the speed-up a free draft
        # and free verification would give, so a target above it is out of reach for this backbone
        "speedup_ceiling_free_draft": d["beam"]["median_ms"] / d["nezha"]["phases_ms"]["prefill"],
        "verify_share_of_nezha": d["nezha"]["phases_ms"].get("verify", 0.0) / d["nezha"]["median_ms"],
        "verify_share_of_nezha_every": (
            d["nezha-every"]["phases_ms"].get("verify", 0.0) / d["nezha-every"]["median_ms"]
        ),
    }
    if "beam-hf" in d:  # context only: the paper's kind of baseline, not the target's
        out["speedup_beam_hf_over_nezha"] = d["beam-hf"]["median_ms"] / d["nezha"]["median_ms"]
    return out


def print_summary(summary: dict) -> None:
    d = summary["decoders"]
    print(f"{'decoder':12s} {'median ms':>10s} {'p99 ms':>8s} {'prefill':>8s} {'draft':>7s} {'verify':>7s}"
          f" {'decode':>7s} {'hr@10':>6s} {'ndcg@10':>7s} {'K valid':>7s}")  # fmt: skip
    for label, r in d.items():
        ph = r["phases_ms"]
        print(
            f"{label:12s} {r['median_ms']:10.2f} {r['p99_ms']:8.2f} {ph.get('prefill', 0):8.2f} "
            f"{ph.get('draft', 0):7.2f} {ph.get('verify', 0):7.2f} {ph.get('decode', 0):7.2f} "
            f"{r['quality']['hr@10']:6.3f} {r['quality']['ndcg@10']:7.3f} {r['users_with_k_valid']:7.3f}"
        )
    print(
        f"beam / nezha median latency: {summary['speedup_beam_over_nezha']:.2f}x "
        f"(ceiling with a free draft: {summary['speedup_ceiling_free_draft']:.2f}x); "
        f"verification {100 * summary['verify_share_of_nezha']:.1f}% of nezha's latency "
        f"({100 * summary['verify_share_of_nezha_every']:.1f}% of nezha-every's); "
        f"verify micro-bench {summary['verification_microbench']}"
    )
    if "speedup_beam_hf_over_nezha" in summary:
        print(f"HF generate beam search / nezha median latency: {summary['speedup_beam_hf_over_nezha']:.2f}x")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    k = min(10, args.beam_width)
    setup = prepare_arms(args, k)
    examples = [ex for batch in setup.batches for ex in batch]
    timed = time_arms(setup.arms, setup.batches, args.repeats)
    n_calls = args.repeats * len(setup.batches)
    d = {label: arm_summary(timed[label], examples, n_calls) for label in setup.arms}
    summary: dict = {"decoders": d, **speedups(d)}
    summary["verification_microbench"] = verification_microbench(setup.nezha_ctx, k, args.batch_size)
    summary["setup"] = {
        "command": command_line("genrec.studies.nezha.nezha_latency", argv),
        "dataset": setup.dataset.manifest.name,
        "model_size": setup.sizes["beam"],
        "users": len(examples),
        "batch_size": args.batch_size,
        "beam_width": args.beam_width,
        "k": k,
        "repeats": args.repeats,
        "env": vars(current_environment(setup.arms["beam"][0].device)),
    }
    print_summary(summary)
    if args.out:
        atomic_write_text(args.out, json.dumps(summary, indent=2, default=str) + "\n")
    return summary


if __name__ == "__main__":
    run_main(main)
