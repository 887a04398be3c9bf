"""NEZHA vs beam search vs MTP quality over seeds, without Ray (issue 6's comparison on a GPU machine).

    python -m genrec.studies.nezha.nezha_quality --data runs/data/beauty --model-size small \
        --seeds 42 43 44 --beam-width 10 --out runs/bench/nezha_beauty [--arms beam nezha nezha-4 mtp ...] \
        [--train-jobs 9] [--train-only]

Every arm runs through `nezha_arms.arm_point`, the same code as the `nezha_arm` sweep benchmark:
for each seed the arm's checkpoint is trained from that seed with the same data, size, learning rate
and epoch budget (checkpoints are kept under --out and reused by a later run with the same training
configuration; nezha and nezha-4 share one), then evaluated on the test split at the same beam width.
With --train-jobs N, every checkpoint the run needs is first trained in up to N processes at once
(a small backbone leaves a GPU mostly idle, so several trainings share it well); evaluation and
latency then run in this process alone, after all training has ended. --train-only stops there.

Reported: HR/NDCG/Recall@5/10 per arm (mean ± std over seeds), latency split into prefill and
decode, the share of returned slots that hold items, and one-sided paired t-tests over seeds of H1
"NEZHA < beam" (and "< beam-converged" when that arm ran) and "NEZHA < MTP" on each quality metric
(p >= 0.05: not significantly below). Writes summary.json under --out.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from genrec.studies.common.seeded_training import add_training_arguments, training_kwargs, write_summary
from genrec.studies.nezha.nezha_arms import (
    ARMS,
    arm_point,
    arm_train_config,
    checkpoint_dir,
    ensure_trained,
    finished,
)
from genrec.workloads.data.dataset import load_dataset
from genrec.workloads.errors import run_main
from genrec.workloads.metrics import paired_t_test_less
from genrec.workloads.results import current_environment
from genrec.workloads.training.train_config import TrainConfig
from genrec.workloads.training.trainer import resolve_device

QUALITY = ("hr@5", "ndcg@5", "recall@5", "hr@10", "ndcg@10", "recall@10")
DEFAULT_ARMS = ("beam", "nezha", "nezha-4", "mtp")
COMPARED = ("beam", "beam-converged", "mtp")  # NEZHA is tested against each of these that ran


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_arguments(p, seeds=[42, 43, 44], beam_width=10)
    p.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=list(ARMS))
    p.add_argument("--eval-batch-size", type=int, default=64)
    p.add_argument("--max-users", type=int, default=0, help="0 = every test user")
    p.add_argument(
        "--train-jobs",
        type=int,
        default=1,
        help="train up to N checkpoints at once, one process each, before evaluating (1 = in turn)",
    )
    p.add_argument("--train-only", action="store_true", help="train the checkpoints, evaluate nothing")
    args = p.parse_args(argv)
    if args.train_jobs < 1:
        p.error(f"--train-jobs must be at least 1, got {args.train_jobs}")
    return args


def needed_checkpoints(args: argparse.Namespace) -> dict[Path, TrainConfig]:
    """{checkpoint folder: TrainConfig} for every (seed, arm) of the run; arms that share a
    checkpoint (nezha, nezha-4, nezha-every) appear once."""
    out = {}
    for seed in args.seeds:
        for arm in args.arms:
            cfg = arm_train_config(arm, **training_kwargs(args), seed=seed)
            out.setdefault(checkpoint_dir(args.out, args.data, cfg), cfg)
    return out


def train_checkpoints(args: argparse.Namespace) -> list[str]:
    """Train the run's unfinished checkpoints in up to --train-jobs processes; their names, in the
    order they finished. Spawned (not forked) processes, so each gets its own CUDA context."""
    todo = [(d, c) for d, c in needed_checkpoints(args).items() if not finished(d)]
    if args.train_jobs == 1 or len(todo) <= 1:
        for d, c in todo:
            ensure_trained(args.data, d, c, progress=not args.quiet)
        return [d.name for d, _ in todo]
    t0, done = time.perf_counter(), []
    workers = min(args.train_jobs, len(todo))
    print(f"training {len(todo)} checkpoints, {workers} at a time", flush=True)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(ensure_trained, args.data, d, c, False): d for d, c in todo}
        for future in as_completed(futures):
            if future.exception() is not None:  # stop at the first failure: start no more trainings
                pool.shutdown(wait=True, cancel_futures=True)
                raise future.exception()
            done.append(futures[future].name)
            elapsed = time.perf_counter() - t0
            print(f"trained {done[-1]} ({len(done)}/{len(todo)}, {elapsed:.0f} s)", flush=True)
    return done


def run_seed(args: argparse.Namespace, seed: int) -> dict:
    """{"seed", "train": {arm: training figures}, "arms": {arm: quality, latency, timings}, "env"}."""
    out: dict = {"seed": seed, "train": {}, "arms": {}}
    for arm in args.arms:
        r = arm_point(
            arm,
            data=args.data,
            models_dir=args.out,
            **training_kwargs(args),
            beam_width=args.beam_width,
            eval_batch_size=args.eval_batch_size,
            max_users=args.max_users,
            seed=seed,
            progress=not args.quiet,
        )
        train_keys = ("train_seconds", "train_steps", "best_epoch", "best_val_loss", "history_blind_val_loss")
        out["train"][arm] = {k: r[k] for k in (*train_keys, "model_dir")}
        out["arms"][arm] = {
            "quality": {k: r[k] for k in (*QUALITY, "invalid_rate", "missing_rate", "users_with_k_valid")},
            "latency_p50_ms": r["latency_p50_ms"],
            "timings_ms": {"prefill": r["prefill_ms"], "decode": r["decode_ms"], "verify": r["verify_ms"]},
            "drafts_valid_share": r["drafts_valid_share"],
            "users": r["users"],
        }
    out["env"] = vars(current_environment(resolve_device(args.device)))
    return out


def summarise(runs: list[dict]) -> tuple[str, dict]:
    arms = [a for a in ARMS if a in runs[0]["arms"]]
    extra = ("valid share", "users with K valid", "prefill ms", "decode ms", "train steps", "train s")
    lines = ["| decoder | " + " | ".join((*QUALITY, *extra)) + " |"]
    lines.append("|---" * (len(QUALITY) + len(extra) + 1) + "|")
    for arm in arms:
        cells = []
        for m in QUALITY:
            v = np.array([r["arms"][arm]["quality"][m] for r in runs])
            cells.append(f"{v.mean():.4f} ± {v.std(ddof=1) if len(v) > 1 else 0:.4f}")
        q = [r["arms"][arm]["quality"] for r in runs]
        valid = np.mean([1 - x["invalid_rate"] - x.get("missing_rate", 0.0) for x in q])
        full = np.mean([x.get("users_with_k_valid", np.nan) for x in q])
        t = [r["arms"][arm]["timings_ms"] for r in runs]
        prefill = np.mean([x.get("prefill", 0.0) for x in t])
        decode = np.mean([x.get("decode", 0.0) for x in t])  # beam steps, or NEZHA's draft + verify
        # the optimiser steps and seconds that trained the arm's checkpoints (the budget check)
        trained = [r.get("train", {}).get(arm, {}) for r in runs]
        steps = np.mean([x.get("train_steps", np.nan) for x in trained])
        seconds = np.mean([x.get("train_seconds", np.nan) for x in trained])
        lines.append(
            f"| {arm} | " + " | ".join(cells)
            + f" | {valid:.4f} | {full:.4f} | {prefill:.2f} | {decode:.2f} | {steps:.0f} | {seconds:.0f} |"
        )  # fmt: skip
    tests = {}
    if len(runs) >= 2:
        for other in (o for o in COMPARED if "nezha" in arms and o in arms):
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
    load_dataset(args.data)  # a wrong folder fails here, before any process starts or --out exists
    trained = train_checkpoints(args)
    module = "genrec.studies.nezha.nezha_quality"
    if args.train_only:
        return write_summary(module, argv, args, t0, trained=trained)
    runs = [run_seed(args, s) for s in args.seeds]
    table, tests = summarise(runs)
    print(table)
    return write_summary(module, argv, args, t0, trained=trained, runs=runs, tests=tests, table=table)


if __name__ == "__main__":
    run_main(main)
