"""`genrec atspeed ...`: AtSpeed draft training support (teacher data for the draft objectives).

Heavy imports (torch, the workloads) happen inside the commands so `genrec --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="AtSpeed speculative decoding: build the target's teacher data for draft training.",
    no_args_is_help=True,
)


@app.command("teacher")
def teacher_command(
    target: Annotated[Path, typer.Option(help="Target checkpoint folder (from `genrec train`).")],
    k: Annotated[int, typer.Option("--k", help="Top-K SIDs per training example (beam width K).")],
    out: Annotated[Path, typer.Option(help="Teacher file to write (.parquet; written atomically).")],
    data: Annotated[
        Path | None, typer.Option(help="Dataset folder (default: the one the target was trained on).")
    ] = None,
    sampling: Annotated[
        bool,
        typer.Option(
            "--sampling", help="Store sampling beam search (temperature 1) SIDs instead of the beam top-K."
        ),
    ] = False,
    seed: Annotated[int, typer.Option(help="Sampling seed (batch b uses seed + b).")] = 0,
    max_items: Annotated[
        int | None,
        typer.Option(help="History items per prompt: the draft's --max-items (default: the target's)."),
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Examples per decode call.")] = 64,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Run the target over every draft training example once; store its top-K SIDs and log-probs."""
    from genrec.workloads.evaluation import load_context
    from genrec.workloads.training.teacher import build_teacher_data, load_teacher

    ctx, ds, _ = load_context(target, data, device)
    path = build_teacher_data(
        ctx,
        ds,
        k,
        out,
        sampling=sampling,
        seed=seed,
        batch_size=batch_size,
        max_items=max_items,
        target_path=target,
        progress=not quiet,
    )
    teacher = load_teacher(path)
    typer.echo(
        f"teacher data: {len(teacher)} examples x top-{teacher.k} {teacher.kind} SIDs of {target} "
        f"on {ds.manifest.name} -> {path}"
    )
