"""`genrec atspeed ...`: AtSpeed draft training support (teacher data for the draft objectives).

Heavy imports (torch, the workloads) happen inside the commands so `genrec --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from genrec.workloads.training.teacher import TeacherMixture

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
    mix_draft: Annotated[
        Path | None,
        typer.Option(
            help="Draft checkpoint q: store the beam top-K of the mixture (1 - lambda) q + lambda p "
            "(the paper's D') instead of the target's own; log-probs stay the target's."
        ),
    ] = None,
    mix_lambda: Annotated[
        float | None,
        typer.Option(
            help="The target's weight lambda in [0, 1] in the --mix-draft mixture (default 0.5; the "
            "paper gives no value)."
        ),
    ] = None,
    all_steps: Annotated[
        bool,
        typer.Option(
            "--all-steps",
            help="Also store the target's beams after every SID level (the paper's Table 5 'w/ AD' data, "
            "for `genrec train --all-steps`); with --sampling, the sampled beams; not with --mix-draft.",
        ),
    ] = False,
    batch_size: Annotated[int, typer.Option(help="Examples per decode call.")] = 64,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Run the target (or its mixture with a draft) over every draft training example once; store
    the top-K SIDs and their log-probs under the target."""
    from genrec.workloads.evaluation import load_context
    from genrec.workloads.training.teacher import build_teacher_data, load_teacher

    mixture = teacher_mixture(mix_draft, mix_lambda, sampling)
    ctx, ds, _ = load_context(target, data, device, draft_dir=mix_draft)
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
        mixture=mixture,
        all_steps=all_steps,
    )
    teacher = load_teacher(path)
    source = str(target)
    if mixture is not None:
        source += f" mixed with draft {mix_draft} (lambda {mixture.mix_lambda})"
    steps = " (and the beams after every level)" if teacher.step_codes is not None else ""
    typer.echo(
        f"teacher data: {len(teacher)} examples x top-{teacher.k} {teacher.kind} SIDs{steps} of {source} "
        f"on {ds.manifest.name} -> {path}"
    )
    if teacher.step_codes is not None:
        from genrec.workloads.training.teacher_steps import step_coverage

        shares = ", ".join(f"{share:.1%}" for share in step_coverage(teacher.codes, teacher.step_codes))
        typer.echo(f"step beams with a descendant in the final top-{teacher.k}, per level 1..L-1: {shares}")


def teacher_mixture(
    mix_draft: Path | None, mix_lambda: float | None, sampling: bool
) -> TeacherMixture | None:
    """The --mix-draft / --mix-lambda pair as a TeacherMixture (None without a draft), checked before
    any model is loaded."""
    from genrec.workloads.errors import UserInputError
    from genrec.workloads.training.teacher import TeacherMixture, check_mixture_kind

    if mix_draft is None:
        if mix_lambda is not None:
            raise UserInputError("--mix-lambda weighs the --mix-draft mixture; pass --mix-draft DIR too")
        return None
    mixture = TeacherMixture(0.5 if mix_lambda is None else mix_lambda, str(mix_draft))
    check_mixture_kind(mixture, sampling)
    return mixture
