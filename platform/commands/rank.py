"""`genrec rank train`: train the MaRI ranking model on seeded synthetic clicks and save a checkpoint
(model.safetensors + config.json) that `genrec serve --ranking DIR` serves on POST /rank."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from genrec.workloads.errors import UserInputError

app = typer.Typer(help="Ranking models (MaRI): train one for POST /rank.", no_args_is_help=True)

SIZES = ("small", "bench")


def train_command(
    out: Annotated[Path, typer.Option(help="Checkpoint folder to write (model.safetensors + config.json).")],
    size: Annotated[
        str,
        typer.Option(help="small (RankingConfig defaults, D_user 256) or bench (BENCH_CONFIG, D_user 1024)."),
    ] = "small",
    steps: Annotated[int, typer.Option(help="Training steps (batches of 256 clicks).")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic click world and of the model.")] = 0,
) -> None:
    """Train on seeded synthetic clicks (workloads/ranking/train.py), print the held-out AUC, save."""
    from genrec.workloads.ranking.checkpoint import save_ranking
    from genrec.workloads.ranking.model import BENCH_CONFIG, RankingConfig
    from genrec.workloads.ranking.train import train_ranking

    if size not in SIZES:
        raise UserInputError(f"--size {size!r}: choose one of {list(SIZES)}")
    if steps < 0:
        raise UserInputError(f"--steps must be >= 0, got {steps}")
    cfg = RankingConfig() if size == "small" else BENCH_CONFIG
    typer.echo(f"training the {size} ranking model: {steps} steps on synthetic clicks (seed {seed}) ...")
    t0 = time.perf_counter()
    result = train_ranking(cfg, steps=steps, seed=seed)
    train_s = time.perf_counter() - t0
    path = save_ranking(
        out,
        result.model,
        meta={
            "size": size,
            "steps": steps,
            "seed": seed,
            "data": "synth_clicks",
            "first_loss": result.first_loss,
            "last_loss": result.last_loss,
            "valid_auc": result.valid_auc,
            "train_s": train_s,
        },
    )
    aucs = " ".join(f"{a:.3f}" for a in result.valid_auc)
    typer.echo(f"loss {result.first_loss:.4f} -> {result.last_loss:.4f} in {train_s:.1f} s")
    typer.echo(f"held-out AUC per task: {aucs}")
    typer.echo(f"saved {path}")
    typer.echo(f"serve it: genrec serve --model MODEL_DIR --ranking {path}")


app.command("train")(train_command)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="rank")
