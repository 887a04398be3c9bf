"""NEZHA vs beam search vs MTP quality over seeds, each trained the same way (issue 6's experiment).

    python -m genrec.workloads.benchmarks.nezha_quality --data runs/data/beauty --model-size small \
        --seeds 42 43 44 --beam-width 10 --out runs/bench/nezha_beauty

For every seed, three checkpoints are trained from the same initialisation seed, data, size and
budget (`genrec train` code): `next_item` (decoded by beam search), `nezha` (the draft head, decoded
by NEZHA with verification) and `mtp` (parallel heads). Each is evaluated on the test split at the
same beam width. NEZHA is also evaluated without verification (NEZHA-4) on the same checkpoint.

Reported: HR/NDCG/Recall@5/10 per decoder (mean ± std over seeds), latency split into prefill and
decode, the share of returned candidates that are valid (with and without verification), and a
one-sided paired t-test over seeds of H1 "NEZHA < beam" on each quality metric (p >= 0.05: not
significantly below) and of "NEZHA < MTP". Runs without Ray, so it also runs on a plain GPU machine.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from genrec.workloads.benchmarks.seeded_training import add_training_arguments, train_config
from genrec.workloads.evaluation import EvalConfig, evaluate, load_context
from genrec.workloads.io import atomic_write_text
from genrec.workloads.metrics import paired_t_test_less
from genrec.workloads.training.trainer import train

QUALITY = ("hr@5", "ndcg@5", "recall@5", "hr@10", "ndcg@10", "recall@10")
# (arm, training objective, decoder, extra decoder params)
ARMS = (
    ("beam", "next_item", "beam", {}),
    ("nezha", "nezha", "nezha", {"verify": "final"}),
    ("nezha-4", "nezha", "nezha", {"verify": "none"}),
    ("mtp", "mtp", "mtp", {}),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_arguments(p, seeds=[42, 43, 44], beam_width=10)
    p.add_argument("--eval-batch-size", type=int, default=64)
    p.add_argument("--max-users", type=int, default=0, help="0 = every test user")
    return p.parse_args(argv)


def run_seed(args: argparse.Namespace, seed: int) -> dict:
    out: dict = {"seed": seed, "train": {}, "arms": {}}
    checkpoints: dict[str, Path] = {}
    for objective in ("next_item", "nezha", "mtp"):
        model_dir = Path(args.out) / f"{args.model_size}-{objective}-seed{seed}"
        cfg = train_config(args, seed, objective)
        trained = train(args.data, model_dir, cfg, progress=not args.quiet)
        best = next((h for h in trained.history if h["epoch"] == trained.best_epoch), {})
        out["train"][objective] = {
            "seconds": trained.seconds,
            "steps": trained.steps,
            "best_epoch": trained.best_epoch,
            "best_val_loss": trained.best_val_loss,
            # head objectives: per-level parts and the loss of a head that ignores the history
            "best_val_level_loss": best.get("val_level_loss"),
            "history_blind_val_loss": json.loads((model_dir / "config.json").read_text()).get(
                "history_blind_val_loss"
            ),
        }
        checkpoints[objective] = model_dir
    contexts = {}
    for arm, objective, decoder, extra in ARMS:
        if objective not in contexts:
            contexts[objective] = load_context(checkpoints[objective], None, args.device)
        ctx, ds, _ = contexts[objective]
        ec = EvalConfig(
            decoder=decoder,
            params={"beam_width": args.beam_width, "k": 10, **extra},
            ks=(5, 10),
            batch_size=args.eval_batch_size,
            max_users=args.max_users,
            seed=seed,
            device=args.device,
            threads=args.threads,
        )
        row = evaluate(ctx, ds, ec, checkpoints[objective].name, progress=not args.quiet).row
        out["arms"][arm] = {
            "quality": row.quality,
            "latency_p50_ms": row.latency_ms.get("p50"),
            "timings_ms": row.timings_ms,
            "counters": row.counters,
            "users": row.users,
        }
        out["env"] = vars(row.env)
    return out


def summarise(runs: list[dict]) -> tuple[str, dict]:
    arms = [a for a, *_ in ARMS]
    lines = ["| decoder | " + " | ".join((*QUALITY, "valid share", "prefill ms", "decode ms")) + " |"]
    lines.append("|---" * (len(QUALITY) + 4) + "|")
    for arm in arms:
        cells = []
        for m in QUALITY:
            v = np.array([r["arms"][arm]["quality"][m] for r in runs])
            cells.append(f"{v.mean():.4f} ± {v.std(ddof=1) if len(v) > 1 else 0:.4f}")
        q = [r["arms"][arm]["quality"] for r in runs]
        valid = np.mean([1 - x["invalid_rate"] - x.get("missing_rate", 0.0) for x in q])
        t = [r["arms"][arm]["timings_ms"] for r in runs]
        prefill = np.mean([x.get("prefill", 0.0) for x in t])
        decode = np.mean([sum(v for k, v in x.items() if k not in ("prefill", "system")) for x in t])
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {valid:.4f} | {prefill:.2f} | {decode:.2f} |")
    tests = {}
    if len(runs) >= 2:
        for other in ("beam", "mtp"):
            tests[f"nezha_below_{other}"] = {
                m: paired_t_test_less(
                    [r["arms"]["nezha"]["quality"][m] for r in runs],
                    [r["arms"][other]["quality"][m] for r in runs],
                )
                for m in QUALITY
            }
        lines.append("")
        for name, per_metric in tests.items():
            shown = ", ".join(
                f"{m} {v['mean_diff']:+.4f} (p={v['p_value']:.3f})" for m, v in per_metric.items()
            )
            lines.append(f"one-sided paired t-test over seeds, H1 {name.replace('_', ' ')}: {shown}")
    return "\n".join(lines), tests


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    t0 = time.perf_counter()
    runs = [run_seed(args, s) for s in args.seeds]
    table, tests = summarise(runs)
    print(table)
    summary = {
        "command": "python -m genrec.workloads.benchmarks.nezha_quality "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "args": vars(args),
        "runs": runs,
        "tests": tests,
        "table": table,
        "seconds": time.perf_counter() - t0,
    }
    atomic_write_text(Path(args.out) / "summary.json", json.dumps(summary, indent=2, default=str))
    return summary


if __name__ == "__main__":
    main()
