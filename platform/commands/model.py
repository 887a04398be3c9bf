"""`genrec train` and `genrec eval`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from genrec.platform.commands.common import sid_pattern_option
from genrec.workloads.errors import UserInputError


def train_command(
    data: Annotated[
        Path, typer.Option(help="Dataset folder (from `genrec data synth` or `genrec data import`).")
    ],
    out: Annotated[Path, typer.Option(help="Checkpoint folder to write (model.safetensors + config.json).")],
    model: Annotated[
        str, typer.Option(help="Model size: tiny (CI), small (CPU benchmarks), base (GPU).")
    ] = "tiny",
    epochs: Annotated[int, typer.Option(help="Maximum epochs.")] = 20,
    batch_size: Annotated[int, typer.Option(help="Training windows per batch.")] = 128,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW).")] = 3e-3,
    weight_decay: Annotated[
        float,
        typer.Option(
            help="AdamW weight decay of the weight matrices (norms, biases and embeddings get none)."
        ),
    ] = 0.05,
    max_items: Annotated[int, typer.Option(help="History items per prompt.")] = 20,
    warmup_steps: Annotated[int, typer.Option(help="Linear warm-up steps before cosine decay.")] = 100,
    patience: Annotated[
        int, typer.Option(help="Early stop after this many epochs without validation gain.")
    ] = 3,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    threads: Annotated[int, typer.Option(help="CPU threads for torch (0 = torch default).")] = 0,
    max_steps: Annotated[int, typer.Option(help="Stop after this many steps (0 = no limit).")] = 0,
    objective: Annotated[
        str,
        typer.Option(
            help="next_item (beam search; SFT), nezha (NEZHA draft head), mtp (multi-token heads); "
            "decode nezha/mtp models with --decoder nezha / mtp. AtSpeed drafts (need --target): wordkd, "
            "tvdkd (token-level KD), seqkd, atspeed_s, atspeed_r (also need --teacher)."
        ),
    ] = "next_item",
    head_variant: Annotated[
        str,
        typer.Option(
            help="NEZHA ablation: full, no_context (NEZHA-1), no_placeholder (NEZHA-2), add (NEZHA-3)."
        ),
    ] = "full",
    head_batching: Annotated[
        str,
        typer.Option(
            help="How nezha/mtp batch their targets: packed (the next_item windows, same steps as "
            "next_item; default) or per_example (one prompt per target)."
        ),
    ] = "packed",
    init: Annotated[
        str | None,
        typer.Option(
            help="Start from a Hugging Face model. nezha / mtp: an imported checkpoint (`genrec model "
            "import hf`) or hf:DIR (imported on first use with --data's items); only the head trains, on "
            "its frozen backbone. next_item: hf:DIR, a pretrained causal LM folder; the data set's SID "
            "tokens are added (--sid-pattern, LC-Rec's by default) and it is fine-tuned."
        ),
    ] = None,
    train_rows: Annotated[
        str,
        typer.Option(
            "--train",
            help="With --init hf:DIR: all (every weight) or new-rows (only the SID tokens' embedding "
            "and LM-head rows).",
        ),
    ] = "all",
    init_sid_pattern: Annotated[
        str | None,
        sid_pattern_option(
            "With --init hf:DIR: the SID tokens to add (next_item) or to find (nezha / mtp; default: the "
            "preset the tokenizer holds)."
        ),
    ] = None,
    init_dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype",
            help="With --init hf:DIR (next_item): bfloat16 runs forward and backward under bf16 autocast "
            "(CPU or CUDA), float32 without; master weights stay fp32 (default: autocast on CUDA only).",
        ),
    ] = None,
    init_save_dtype: Annotated[
        str | None,
        typer.Option(
            "--save-dtype",
            help="With --init hf:DIR (next_item): float32, bfloat16 or float16 for the saved model and its "
            "HF export (default: the dtype the HF checkpoint was stored in).",
        ),
    ] = None,
    target: Annotated[
        Path | None,
        typer.Option(
            help="AtSpeed drafts: the target checkpoint the draft aligns to; one of ours, or an imported "
            "one (`genrec model import hf`): the draft is then ours on its SID table's codes, the target "
            "read on its own template prompts."
        ),
    ] = None,
    teacher: Annotated[
        Path | None,
        typer.Option(help="seqkd / atspeed_s / atspeed_r: teacher file from `genrec atspeed teacher`."),
    ] = None,
    alpha: Annotated[
        float, typer.Option(help="AtSpeed drafts: L = alpha * L_align + (1 - alpha) * L_rec (eq. 5, 9).")
    ] = 0.5,
    no_dr: Annotated[
        bool, typer.Option("--no-dr", help="atspeed_s ablation w/o DR (no density regularisation).")
    ] = False,
    no_ca: Annotated[
        bool, typer.Option("--no-ca", help="atspeed_s/_r ablation w/o CA (whole vocabulary, eq. 3).")
    ] = False,
    top1: Annotated[
        bool, typer.Option("--top1", help="Ablation w/o top-K: align on the teacher's top-1 SID only.")
    ] = False,
    all_steps: Annotated[
        bool,
        typer.Option(
            "--all-steps",
            help="seqkd / atspeed_s / atspeed_r: also align on the target's beam after every SID level "
            "(the paper's Table 5 'w/ AD'); needs a teacher file built with --all-steps.",
        ),
    ] = False,
    level_softmax: Annotated[
        bool,
        typer.Option(
            "--level-softmax",
            help="AtSpeed drafts of an imported --target: align to its per-level softmax over the level's "
            "tokens (decode with --param level_softmax=true) instead of its full-vocabulary log-softmax.",
        ),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", help="No progress bar or per-epoch lines; the summary still prints.")
    ] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace --out if it already holds a checkpoint.")
    ] = False,
) -> None:
    """Train the GR transformer on a dataset's train split (validation loss picks the best epoch)."""
    from genrec.workloads.training.train_config import TrainConfig
    from genrec.workloads.training.trainer import train

    check_train_options(
        epochs, batch_size, max_items, warmup_steps, patience, threads, max_steps, lr, weight_decay
    )
    check_train_output(out, overwrite, device)
    cfg = TrainConfig(
        model_size=model,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        weight_decay=weight_decay,
        max_items=max_items,
        warmup_steps=warmup_steps,
        patience=patience,
        seed=seed,
        device=device,
        threads=threads,
        max_steps=max_steps,
        objective=objective,
        head_variant=head_variant,
        head_batching=head_batching,
        target=str(target) if target else "",
        teacher=str(teacher) if teacher else "",
        alpha=alpha,
        no_dr=no_dr,
        no_ca=no_ca,
        top1=top1,
        all_steps=all_steps,
        level_softmax=level_softmax,
        init=init or "",
        train_rows=train_rows,
        init_sid_pattern=init_sid_pattern or "",
        init_dtype=init_dtype or "",
        init_save_dtype=init_save_dtype or "",
    )
    result = train(data, out, cfg, progress=not quiet)
    typer.echo(
        f"trained {init or model}: best val loss {result.best_val_loss:.4f} at epoch {result.best_epoch} "
        f"({result.epochs_run} epochs, {result.steps} steps, {result.seconds:.0f} s) -> {result.path}"
    )


def check_train_options(
    epochs: int,
    batch_size: int,
    max_items: int,
    warmup_steps: int,
    patience: int,
    threads: int,
    max_steps: int,
    lr: float,
    weight_decay: float,
) -> None:
    """The numeric options' ranges, named by flag."""
    from genrec.platform.commands.common import check_range

    for flag, value, low, note in (
        ("--epochs", epochs, 1, ""),
        ("--batch-size", batch_size, 1, ""),
        ("--max-items", max_items, 1, ""),
        ("--warmup-steps", warmup_steps, 0, "0 = no warm-up"),
        ("--patience", patience, 1, "epochs without validation gain before stopping"),
        ("--threads", threads, 0, "0 = torch's default"),
        ("--max-steps", max_steps, 0, "0 = no limit"),
    ):
        check_range(flag, value, low, note=note)
    if not lr > 0:
        raise UserInputError(f"--lr {lr}: must be > 0")
    if not weight_decay >= 0:
        raise UserInputError(f"--weight-decay {weight_decay}: must be >= 0 (0 = no decay)")


def check_train_output(out: Path, overwrite: bool, device: str) -> None:
    """--out and --device, before any training time is spent."""
    from genrec.platform.commands.common import check_device, check_new_output

    check_new_output(out, overwrite, "a checkpoint or other files")
    check_device(device)


def eval_command(
    model: Annotated[
        Path,
        typer.Option(
            help="Checkpoint folder from `genrec train` or `genrec model import hf`, or hf:DIR, a Hugging "
            "Face folder imported on first use with --data's items (cached; README: Bring your own model)."
        ),
    ],
    decoder: Annotated[str, typer.Option(help="Registered decoder name (see `genrec decoders`).")] = "beam",
    beam_width: Annotated[
        int | None, typer.Option(help="Beam width (decoders that have one); short for --param beam_width=N.")
    ] = None,
    k: Annotated[
        list[int], typer.Option("--k", help="Cut-offs K for HR/NDCG/Recall@K; several: --k 5 10.")
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            help="Decoder parameter NAME=VALUE, VALUE read as in a YAML file (repeatable), e.g. "
            "--param constraint=cold_start; `genrec decoders` lists them."
        ),
    ] = None,
    data: Annotated[
        Path | None, typer.Option(help="Dataset folder (default: the one the model was trained on).")
    ] = None,
    draft: Annotated[
        Path | None,
        typer.Option(
            help="Draft model for AtSpeed decoders (atspeed_*): a smaller checkpoint on the same codec, "
            "e.g. any next_item checkpoint of `genrec train --model tiny` on the same dataset, or hf:DIR."
        ),
    ] = None,
    split: Annotated[str, typer.Option(help="valid or test.")] = "test",
    batch_size: Annotated[int, typer.Option(help="Users per decode call.")] = 64,
    max_users: Annotated[int, typer.Option(help="Evaluate only the first N users (0 = all).")] = 0,
    baseline: Annotated[bool, typer.Option(help="Also evaluate the most-popular baseline.")] = True,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    threads: Annotated[int, typer.Option(help="CPU threads for torch (0 = torch default).")] = 0,
    repeats: Annotated[
        int, typer.Option(help="Timed passes: latency is their median, [fastest-slowest] beside it.")
    ] = 1,
    output: Annotated[
        Path | None, typer.Option(help="Write the result rows as JSON lines to this file.")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    all_params: Annotated[
        bool, typer.Option("--all-params", help="Show every decoder parameter, not only those set.")
    ] = False,
) -> None:
    """Decode a split with a registered decoder and print HR/NDCG/Recall@K, invalid rate and latency."""
    from genrec.workloads.evaluation import EvalConfig, evaluate, load_context, model_label

    check_eval_options(beam_width, k, batch_size, max_users, threads, repeats, decoder, draft, device)
    ks = tuple(sorted(set(k or [5, 10])))
    runs = decoder_runs(decoder, param, beam_width, baseline, ks)
    from genrec.platform.decoder_needs import check_decoder_fits

    model, draft = resolve_models(model, draft, data)
    check_decoder_fits(decoder, model, draft is not None)  # e.g. beam on a NEZHA checkpoint: one line
    check_run_capabilities(runs, device, None)  # a backend the device cannot run: before loading
    ctx, ds, _ = load_context(model, data, device, draft_dir=draft)
    check_run_capabilities(runs, device, ctx.codec.levels)
    draft_name = model_label(draft) if draft is not None else ""
    rows = []
    for name, p in runs:
        cfg = EvalConfig(
            decoder=name,
            params=p,
            split=split,
            ks=ks,
            batch_size=batch_size,
            max_users=max_users,
            device=device,
            threads=threads,
            repeats=repeats,
        )
        rows.append(evaluate(ctx, ds, cfg, model_label(model), progress=not quiet, draft_name=draft_name).row)
    print_eval_results(rows, ks, ds, split, model, draft, draft_name, all_params)
    if output:
        write_eval_rows(output, rows)


def resolve_models(model: Path, draft: Path | None, data: Path | None) -> tuple[Path, Path | None]:
    """--model / --draft as checkpoint folders: hf:DIR imported (or found) in the cache, --data's items."""
    from genrec.workloads.models.hf_cache import resolve_model

    model = resolve_model(str(model), data)
    return model, None if draft is None else resolve_model(str(draft), data, role="--draft")


def check_eval_options(
    beam_width: int | None,
    k: list[int] | None,
    batch_size: int,
    max_users: int,
    threads: int,
    repeats: int,
    decoder: str,
    draft: Path | None,
    device: str,
) -> None:
    """Explicit ranges, named by flag, before anything loads: 0 is never read as "the default"."""
    from genrec.platform.commands.common import check_device, check_range
    from genrec.workloads.decoding.draft import draft_needed_message, needs_draft

    check_range("--beam-width", beam_width, 1, note="beams kept per decoding step")
    for cut in k or []:
        check_range("--k", cut, 1, note="cut-offs of HR/NDCG/Recall@K")
    check_range("--batch-size", batch_size, 1)
    check_range("--max-users", max_users, 0, note="0 = every user")
    check_range("--threads", threads, 0, note="0 = torch's default")
    check_range("--repeats", repeats, 1, note="timed passes over the split")
    if needs_draft(decoder) and draft is None:
        raise UserInputError(draft_needed_message(decoder))
    check_device(device)


def decoder_runs(
    decoder: str, param: list[str] | None, beam_width: int | None, baseline: bool, ks: tuple[int, ...]
) -> list[tuple[str, object]]:
    """(decoder, typed parameters) to evaluate: the decoder, then the popular baseline unless off.

    Typed and validated before the model loads: a bad parameter costs no time."""
    from genrec.platform.params import cli_values, eval_params

    values = cli_values(param or [])
    if beam_width is not None:
        if "beam_width" in values:
            raise UserInputError("give the beam width once: --beam-width or --param beam_width, not both")
        values["beam_width"] = beam_width
    runs = [(decoder, eval_params(decoder, values, ks))]
    if baseline and decoder != "popular":
        runs.append(("popular", eval_params("popular", {}, ks)))
    return runs


def check_run_capabilities(runs: list[tuple[str, object]], device: str, levels: int | None) -> None:
    """Each run's parameters against what `device` (and SIDs of `levels` levels) can run: exit 2 with
    one line, never a traceback from inside a kernel."""
    from genrec.platform.capabilities import check_capabilities

    for _, params in runs:
        check_capabilities(params, device, levels)


def print_eval_results(
    rows: list,
    ks: tuple[int, ...],
    ds,
    split: str,
    model: Path,
    draft: Path | None,
    draft_name: str,
    all_params: bool = False,
) -> None:
    from genrec.workloads.evaluation import format_table, model_label

    head = rows[0]
    drafted = f", draft {draft_name} ({draft.resolve()})" if draft is not None else ""
    typer.echo(
        f"{ds.manifest.name} / {split}: {head.users} users, model {model_label(model)}{drafted}, "
        f"{head.env.device}"
    )
    typer.echo(format_table(rows, ks, all_params))


def write_eval_rows(output: Path, rows: list) -> None:
    """The result rows as JSON lines."""
    from genrec.workloads.io import atomic_write_text

    atomic_write_text(output, "".join(r.to_json().replace("\n", "") + "\n" for r in rows))
    typer.echo(f"result rows -> {output}")


def decoders_command() -> None:
    """List registered decoders: what each does, what it needs from a checkpoint, and its parameters
    (name: type = default; set them with --param)."""
    from genrec.platform.decoder_needs import decoder_needs
    from genrec.platform.params import describe_parameters
    from genrec.workloads.decoding.base import decoder_names

    for name in decoder_names():
        needs = decoder_needs(name)
        params = ", ".join(f"{p.name}: {p.type} = {p.default!r}" for p in describe_parameters(name))
        typer.echo(f"{name}: {needs.what}")
        typer.echo(f"    needs: {needs.needs_text()}")
        typer.echo(f"    params: {params or '(none)'}")


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
    app.command("eval")(eval_command)
    app.command("decoders")(decoders_command)
