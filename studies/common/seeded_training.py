"""What the per-seed quality benchmarks share: their training options and the TrainConfig they make.

Every arm of a comparison is trained with the same size, data, learning rate, batch, epoch budget and
early stopping, from the same seed; only the objective differs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from genrec.studies.common.options import REQUIRED, add_shared_options
from genrec.workloads.io import atomic_write_text
from genrec.workloads.results import command_line
from genrec.workloads.training.train_config import HEAD_BATCHING, TrainConfig


def add_training_arguments(p: argparse.ArgumentParser, seeds: list[int], beam_width: int) -> None:
    add_shared_options(
        p,
        helps={"data": "dataset folder (e.g. the Beauty import)"},
        data=REQUIRED,
        batch_size=128,
        beam_width=beam_width,
        device="auto",
        threads=0,
    )
    p.add_argument("--out", required=True, help="folder for checkpoints and summary.json")
    p.add_argument("--model-size", default="small")
    p.add_argument("--seeds", type=int, nargs="+", default=seeds)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--patience", type=int, default=3)
    p.add_argument(
        "--head-batching",
        default="packed",
        choices=list(HEAD_BATCHING),
        help="how nezha/mtp batch their targets (packed: the next_item windows and steps)",
    )
    p.add_argument("--quiet", action="store_true")


def training_kwargs(args: argparse.Namespace) -> dict:
    """The TrainConfig fields every arm shares, from the parsed options (seed and objective apart)."""
    return {
        "model_size": args.model_size,
        "epochs": args.epochs,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "patience": args.patience,
        "device": args.device,
        "threads": args.threads,
        "head_batching": args.head_batching,
    }


def train_config(args: argparse.Namespace, seed: int) -> TrainConfig:
    return TrainConfig(**training_kwargs(args), seed=seed)


def write_summary(module: str, argv: list[str] | None, args: argparse.Namespace, t0: float, **parts) -> dict:
    """summary.json under --out: the command that produced it, its options, `parts` and wall time."""
    summary = {
        "command": command_line(module, argv),
        "args": vars(args),
        **parts,
        "seconds": time.perf_counter() - t0,
    }
    atomic_write_text(Path(args.out) / "summary.json", json.dumps(summary, indent=2, default=str))
    return summary
