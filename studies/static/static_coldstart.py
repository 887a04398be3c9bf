"""Cold-start recommendation by constrained decoding alone (the STATIC paper's Amazon experiment).

    python -m genrec.studies.static.static_coldstart --model runs/models/small-beauty-s0 \\
        [--data runs/data/beauty] --beam-width 20 --dense-levels 2 --max-users 0 --threads 2 \\
        [--out docs/results/static_coldstart.json]

Cold-start items = catalogue items with no interaction in the training split. Evaluated users = test
users whose target is a cold-start item. Compared, on the same users: unconstrained beam search,
STATIC constrained to the cold-start set, and constrained random guessing (k distinct cold-start
items drawn uniformly, averaged over --random-draws). Reports Recall@1 and Recall@10 (one target per
user in leave-one-out splits, so Recall = HR) and the number of users.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from genrec.studies.common.options import REQUIRED, add_shared_options, resolve_model_flags
from genrec.workloads.data.dataset import Dataset, EvalExample
from genrec.workloads.decoding.base import Decoder, DecoderContext, get_decoder, make_params
from genrec.workloads.decoding.params import DecoderParams
from genrec.workloads.decoding.static import StaticDecoder  # noqa: F401  (registers `static`)
from genrec.workloads.errors import run_main
from genrec.workloads.evaluation import load_context
from genrec.workloads.io import atomic_write_text
from genrec.workloads.metrics import ranking_metrics


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shared_options(
        p,
        model=REQUIRED,
        data=None,
        device="auto",
        beam_width=20,
        batch_size=32,
        threads=2,
        seed=0,
    )
    p.add_argument("--dense-levels", type=int, default=2)
    p.add_argument("--max-users", type=int, default=0, help="0 = every user with a cold-start target")
    p.add_argument("--random-draws", type=int, default=100)
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def cold_target_examples(ds: Dataset, cold: np.ndarray, max_users: int) -> list[EvalExample]:
    """Test users whose target is a cold-start item (the first `max_users`; 0 = all)."""
    cold_set = set(cold.tolist())
    examples = [e for e in ds.eval_examples("test") if any(t in cold_set for t in e.targets)]
    return examples[:max_users] if max_users else examples


def decoder_configs(beam_width: int, k: int, dense_levels: int) -> dict[str, tuple[Decoder, DecoderParams]]:
    """Unconstrained beam search and STATIC constrained to the cold-start set, by result name."""
    beam, static = get_decoder("beam"), get_decoder("static")
    return {
        "unconstrained": (beam, make_params(beam, {"beam_width": beam_width, "k": k})),
        "constrained": (
            static,
            make_params(
                static,
                {
                    "beam_width": beam_width,
                    "k": k,
                    "constraint": "cold_start",
                    "dense_levels": dense_levels,
                },
            ),
        ),
    }


def decode_ranked(
    ctx: DecoderContext, dec: Decoder, params: DecoderParams, examples: list[EvalExample], batch_size: int
) -> list[list[int]]:
    ranked = []
    for i in range(0, len(examples), batch_size):
        batch = examples[i : i + batch_size]
        res = dec.decode(ctx, [e.history for e in batch], params)
        ranked.extend(res.item_ids.cpu().tolist())
    return ranked


def random_guess_metrics(
    cold: np.ndarray, targets: list[list[int]], ks: tuple[int, ...], draws: int, seed: int
) -> dict[str, float]:
    """Constrained random guessing: max(ks) distinct cold-start items drawn uniformly per user,
    metrics averaged over `draws` draws."""
    k = max(ks)
    rng = np.random.default_rng(seed)
    metrics = [
        ranking_metrics(
            [rng.choice(cold, size=min(k, len(cold)), replace=False).tolist() for _ in targets], targets, ks
        )
        for _ in range(draws)
    ]
    return {m: float(np.mean([d[m] for d in metrics])) for m in metrics[0]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    resolve_model_flags(args)
    ctx, ds, _ = load_context(args.model, args.data, args.device)
    cold = np.flatnonzero(ctx.popularity == 0)
    examples = cold_target_examples(ds, cold, args.max_users)
    if not examples:
        print("no test user has a cold-start target", file=sys.stderr)
        return 2
    ks = (1, 10)
    targets = [e.targets for e in examples]
    results = {}
    with torch.no_grad():
        for name, (dec, params) in decoder_configs(args.beam_width, max(ks), args.dense_levels).items():
            ranked = decode_ranked(ctx, dec, params, examples, args.batch_size)
            results[name] = ranking_metrics(ranked, targets, ks)
    results["constrained_random"] = random_guess_metrics(cold, targets, ks, args.random_draws, args.seed)
    out = {
        "command": " ".join(sys.argv),
        "users": len(examples),
        "cold_start_items": len(cold),
        "catalogue_items": len(ctx.item_codes),
        "beam_width": args.beam_width,
        "results": {n: {m: r[m] for m in ("recall@1", "recall@10")} for n, r in results.items()},
    }
    print(json.dumps(out, indent=2))
    if args.out:
        atomic_write_text(args.out, json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    run_main(main)
