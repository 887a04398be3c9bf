"""One draft training step of the AtSpeed sequence objectives, with and without all-step teacher data.

    python -m genrec.studies.atspeed.align_step --data /tmp/bt/beauty --target /tmp/bt/small \\
        --teacher TEACHER.parquet --objectives atspeed_s seqkd --batch-size 128 --repeats 5 --threads 1

The teacher file must hold every level's beams (`genrec atspeed teacher --all-steps`). Per objective,
two arms on the same batches: the final top-K only, and `--all-steps` (align_sequences.py). One step
is the alignment loss's forward and backward for a fresh `--draft-size` draft (alpha 1: the alignment
term alone; the recommendation term is the same for both arms). Arms alternate within each repeat;
the summary gives every arm's median step time with its min and max, the loss (equal for every repeat:
the draft does not move) and the all-steps / final-only time ratio.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from genrec.studies.common.options import REQUIRED, add_shared_options
from genrec.workloads.data.dataset import load_dataset
from genrec.workloads.errors import UserInputError, run_main
from genrec.workloads.models.inputs import item_token_table
from genrec.workloads.models.model_config import model_config_for
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.results import benchmark_summary
from genrec.workloads.training.align import AlignFlags, AlignObjective, load_target
from genrec.workloads.training.teacher import load_teacher
from genrec.workloads.training.train_config import SEQUENCE_OBJECTIVES

MODULE = "genrec.studies.atspeed.align_step"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    add_shared_options(
        p,
        helps={"data": "dataset folder"},
        data=REQUIRED,
        batch_size=128,
        repeats=5,
        threads=1,
        seed=0,
    )
    p.add_argument("--target", required=True, help="target checkpoint folder")
    p.add_argument("--teacher", required=True, help="teacher file built with --all-steps")
    p.add_argument("--objectives", nargs="+", default=["atspeed_s"], choices=list(SEQUENCE_OBJECTIVES))
    p.add_argument("--draft-size", default="tiny")
    p.add_argument("--batches", type=int, default=2, help="distinct batches per repeat")
    p.add_argument("--out", default=None, help="JSON file for the summary")
    args = p.parse_args(argv)
    if min(args.batch_size, args.batches, args.repeats, args.threads) < 1:
        p.error("--batch-size, --batches, --repeats and --threads must be >= 1")
    return args


def build_objectives(args: argparse.Namespace) -> dict[str, AlignObjective]:
    """One AlignObjective per arm (`<objective>` and `<objective>+all_steps`), sharing one draft."""
    ds = load_dataset(args.data)
    teacher = load_teacher(args.teacher)
    if teacher.step_codes is None:
        raise UserInputError(f"--teacher {args.teacher}: no step beams; build it with --all-steps")
    codec, item_codes = ds.codec, ds.item_codes()
    max_items = int(teacher.manifest["max_items"])
    device = torch.device("cpu")
    target = load_target(args.target, codec, max_items, device)
    torch.manual_seed(args.seed)
    draft = GRTransformer(model_config_for(args.draft_size, codec.vocab_size, target.config.max_seq_len))
    windows = [([*p, int(t)], len(p)) for p, t in zip(teacher.prompts, teacher.target_item)]
    tokens = item_token_table(codec, item_codes)
    arms = {}
    for objective in args.objectives:
        for all_steps in (False, True):
            name = f"{objective}+all_steps" if all_steps else objective
            arms[name] = AlignObjective(
                objective, 1.0, AlignFlags(all_steps=all_steps), draft, target, teacher, codec, tokens,
                item_codes, windows, max_items, device, False,
            )  # fmt: skip
    return arms


def time_arms(arms: dict[str, AlignObjective], batches: list[np.ndarray], repeats: int) -> dict[str, dict]:
    """Step seconds per arm over repeats x batches, arms alternating (order reversed every repeat)."""
    names = list(arms)
    for name in names:  # warm-up
        arms[name].loss(batches[0]).backward()
    seconds: dict[str, list[float]] = {n: [] for n in names}
    losses: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for batch in batches:
            for name in names if r % 2 == 0 else names[::-1]:
                t0 = time.perf_counter()
                loss = arms[name].loss(batch)
                loss.backward()
                seconds[name].append(time.perf_counter() - t0)
                losses[name].append(loss.item())
    return {
        n: {
            "median_s": float(np.median(seconds[n])),
            "min_s": float(np.min(seconds[n])),
            "max_s": float(np.max(seconds[n])),
            "loss_first_batch": losses[n][0],
            "steps": len(seconds[n]),
        }
        for n in names
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    arms = build_objectives(args)
    n = len(next(iter(arms.values())).windows)
    rng = np.random.default_rng(args.seed)
    batches = [rng.choice(n, size=min(args.batch_size, n), replace=False) for _ in range(args.batches)]
    result = time_arms(arms, batches, args.repeats)
    for objective in args.objectives:
        result[f"{objective}+all_steps"]["ratio_to_final_only"] = (
            result[f"{objective}+all_steps"]["median_s"] / result[objective]["median_s"]
        )
    for name, r in result.items():
        ratio = f"  ({r['ratio_to_final_only']:.2f}x final-only)" if "ratio_to_final_only" in r else ""
        print(f"{name:<22} {r['median_s']:.3f} s/step [{r['min_s']:.3f}, {r['max_s']:.3f}]{ratio}")
    return benchmark_summary(MODULE, argv, torch.device("cpu"), args, result, args.out)


if __name__ == "__main__":
    run_main(main)
