"""`genrec model import hf`: bring your own Hugging Face GR checkpoint (workloads/models/hf_checkpoint.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from genrec.platform.commands.common import sid_pattern_option

app = typer.Typer(help="Models brought from elsewhere, imported as genrec checkpoints.", no_args_is_help=True)
import_app = typer.Typer(help="Import a model into a genrec checkpoint folder.", no_args_is_help=True)
app.add_typer(import_app, name="import")


@import_app.command("hf")
def import_hf_command(
    path: Annotated[
        Path,
        typer.Option(
            help="HF folder (save_pretrained): config.json, model.safetensors or shards + index, "
            "tokenizer.json with the SID tokens, optionally generation_config.json."
        ),
    ],
    items: Annotated[
        Path,
        typer.Option(
            help="Items' SIDs: an LC-Rec index *.json, or *.parquet / *.csv with columns item_id, sid."
        ),
    ],
    out: Annotated[Path, typer.Option(help="Checkpoint folder to write, e.g. runs/models/NAME.")],
    sid_pattern: Annotated[str, sid_pattern_option()] = "lcrec",
    prompt_template: Annotated[
        Path | None,
        typer.Option(
            help="JSON prompt template the checkpoint was fine-tuned with ({history} in `text`); default: "
            "an LC-Rec-style instruction."
        ),
    ] = None,
    dtype: Annotated[
        str | None, typer.Option(help="float32, bfloat16 or float16 (default: the stored dtype).")
    ] = None,
    max_items: Annotated[int, typer.Option(help="History items per prompt.")] = 20,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out folder.")] = False,
) -> None:
    """Import an HF Llama / Mistral / Qwen2 / Qwen3 GR checkpoint with SID tokens for every decoder."""
    from genrec.platform.commands.common import check_new_output, check_range
    from genrec.workloads.models.hf_checkpoint import import_hf_checkpoint

    check_range("--max-items", max_items, 1, note="history items per prompt")
    check_new_output(out, overwrite, "a checkpoint or other files")
    rep = import_hf_checkpoint(path, items, out, sid_pattern, prompt_template, dtype, max_items)
    b = rep.backbone
    typer.echo(
        f"imported {b['architecture']} ({b['family']}, {b['n_params']:,} parameters, {b['dtype']}, "
        f"vocabulary {b['vocab_size']}) -> {rep.out}"
    )
    typer.echo(
        f"SID levels {list(rep.codebook_sizes)}: {rep.sid_tokens} SID tokens ({rep.gaps} "
        f"code{'' if rep.gaps == 1 else 's'} without a token), {rep.items} items"
    )
    if rep.overridden_generation_flags:
        flags = ", ".join(rep.overridden_generation_flags)
        typer.echo(f"generation_config.json has {flags}: recorded; hf_beam sets every search flag itself")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="model")
