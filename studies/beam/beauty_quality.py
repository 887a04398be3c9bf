"""Quality benchmark: train a model per seed on a dataset and compare beam search with most-popular.

    python -m genrec.studies.beam.beauty_quality --data runs/data/beauty \
        --model-size small --seeds 0 1 2 --beam-width 20 --out runs/bench/beauty_small

For every seed: `train` (the same code as `genrec train`), then `evaluate` on the test split with
the beam decoder and with the most-popular baseline, and a paired one-sided sign-flip test of
beam > popular on per-user HR@10 and Recall@10. Prints a markdown table (mean ± std over seeds)
and writes summary.json. Runs without Ray or typer, so it also runs on a plain GPU machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from genrec.studies.common.seeded_training import add_training_arguments, train_config, write_summary
from genrec.workloads.errors import run_main
from genrec.workloads.evaluation import EvalConfig, evaluate, load_context
from genrec.workloads.metrics import paired_permutation_test, user_metric_vector
from genrec.workloads.training.trainer import train

# AtSpeed (ICLR 2025), Table 2: LC-Rec with LLaMA-7B on Beauty, test Recall@10 at temperature 0.
PAPER_RECALL10 = 0.0098
METRICS = ("hr@5", "ndcg@5", "recall@5", "hr@10", "ndcg@10", "recall@10", "invalid_rate")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_arguments(p, seeds=[0, 1, 2], beam_width=20)
    return p.parse_args(argv)


def run_seed(args: argparse.Namespace, seed: int) -> dict:
    model_dir = Path(args.out) / f"{args.model_size}-seed{seed}"
    cfg = train_config(args, seed)
    trained = train(args.data, model_dir, cfg, progress=not args.quiet)
    ctx, ds, _ = load_context(model_dir, None, args.device)
    outs = {}
    for name, params in (("beam", {"beam_width": args.beam_width}), ("popular", {})):
        ec = EvalConfig(
            decoder=name, params=params, ks=(5, 10), seed=seed, device=args.device, threads=args.threads
        )
        outs[name] = evaluate(ctx, ds, ec, model_dir.name, progress=not args.quiet)
    tests = {
        m: paired_permutation_test(
            user_metric_vector(outs["beam"].ranked, outs["beam"].targets, m),
            user_metric_vector(outs["popular"].ranked, outs["popular"].targets, m),
            seed=seed,
        )
        for m in ("hr@10", "recall@10")
    }
    return {
        "seed": seed,
        "train_seconds": trained.seconds,
        "best_epoch": trained.best_epoch,
        "best_val_loss": trained.best_val_loss,
        "beam": outs["beam"].row.quality,
        "popular": outs["popular"].row.quality,
        "beam_vs_popular": tests,
        "env": vars(outs["beam"].row.env),
        "users": outs["beam"].row.users,
    }


def summarise(runs: list[dict]) -> str:
    lines = ["| decoder | " + " | ".join(METRICS) + " |", "|---" * (len(METRICS) + 1) + "|"]
    for name in ("beam", "popular"):
        cells = []
        for m in METRICS:
            v = np.array([r[name][m] for r in runs])
            cells.append(f"{v.mean():.4f} ± {v.std():.4f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    recall = np.array([r["beam"]["recall@10"] for r in runs])
    lines.append("")
    lines.append(
        f"beam Recall@10 {recall.mean():.4f} vs AtSpeed Table 2 LC-Rec/LLaMA-7B {PAPER_RECALL10} "
        f"(ratio {recall.mean() / PAPER_RECALL10:.2f}); seeds {[r['seed'] for r in runs]}"
    )
    for r in runs:
        hr, rec = r["beam_vs_popular"]["hr@10"], r["beam_vs_popular"]["recall@10"]
        lines.append(
            f"seed {r['seed']}: train {r['train_seconds']:.0f} s (best epoch {r['best_epoch']}); "
            f"beam - popular HR@10 {hr['mean_diff']:+.4f} (p={hr['p_value']:.4f}), "
            f"Recall@10 {rec['mean_diff']:+.4f} (p={rec['p_value']:.4f}), {r['users']} users"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    t0 = time.perf_counter()
    runs = [run_seed(args, s) for s in args.seeds]
    table = summarise(runs)
    print(table)
    write_summary("genrec.studies.beam.beauty_quality", argv, args, t0, runs=runs, table=table)


if __name__ == "__main__":
    run_main(main)
