"""What the per-seed quality benchmarks share: their training options and the TrainConfig they make.

Every arm of a comparison is trained with the same size, data, learning rate, batch, epoch budget and
early stopping, from the same seed; only the objective differs.
"""

from __future__ import annotations

import argparse

from genrec.workloads.training.trainer import TrainConfig


def add_training_arguments(p: argparse.ArgumentParser, seeds: list[int], beam_width: int) -> None:
    p.add_argument("--data", required=True, help="dataset folder (e.g. the Beauty import)")
    p.add_argument("--out", required=True, help="folder for checkpoints and summary.json")
    p.add_argument("--model-size", default="small")
    p.add_argument("--seeds", type=int, nargs="+", default=seeds)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--patience", type=int, default=3)
    p.add_argument("--beam-width", type=int, default=beam_width)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--quiet", action="store_true")


def train_config(args: argparse.Namespace, seed: int, objective: str = "next_item") -> TrainConfig:
    return TrainConfig(
        model_size=args.model_size,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        patience=args.patience,
        seed=seed,
        device=args.device,
        threads=args.threads,
        objective=objective,
    )
