"""`genrec tokenize`: learn semantic IDs from item features."""

from __future__ import annotations

from pathlib import Path

import typer

from genrec.workloads.errors import UserInputError


def format_summary(out: Path, stats: dict) -> str:
    """A plain-text table of what the tokenizer produced (kept free of torch for cheap testing)."""
    sizes = stats["codebook_sizes"]
    lines = [
        f"{stats['method']}: {stats['collisions']['before']['items']} items, "
        f"{stats['levels']} levels x {sizes[0]} codes, fitted in {stats['fit_seconds']:.1f} s",
        "",
        f"{'level':>5}  {'codes used':>12}  {'utilisation':>11}  {'distinct prefixes':>17}  "
        f"{'rel. recon err':>14}",
    ]
    rel = stats["reconstruction"]["relative_by_level"]
    for l, (used, util, prefixes) in enumerate(
        zip(stats["codes_used"], stats["utilisation"], stats["distinct_prefixes"], strict=True)
    ):
        lines.append(
            f"{l + 1:>5}  {f'{used}/{sizes[l]}':>12}  {util:>11.1%}  {prefixes:>17}  {rel[l]:>14.4f}"
        )
    c = stats["collisions"]
    before = c["before"]
    lines.append("")
    lines.append(
        f"collisions before: {before['colliding_items']} items in {before['collision_groups']} groups "
        f"(largest {before['max_group_size']})"
    )
    if c["disambiguation_level"]:
        lines.append(
            f"collisions after:  0 (added a disambiguation level of {c['disambiguation_size']} codes)"
        )
    else:
        lines.append("collisions after:  0 (no disambiguation level needed)")
    lines.append(f"codebook sizes:    {stats['final_codebook_sizes']}")
    lines.append(f"written:           {out}")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    @app.command("tokenize")
    def tokenize(
        data: Path = typer.Option(
            ..., "--data", help="Source dataset folder (items.parquet needs `features`)."
        ),
        out: Path = typer.Option(..., "--out", help="New dataset folder to write."),
        method: str = typer.Option("rqvae", "--method", help="rqvae | rqkmeans"),
        levels: int = typer.Option(3, "--levels", help="Codes per semantic ID (before disambiguation)."),
        codebook_size: int = typer.Option(256, "--codebook-size", help="Codes per level."),
        seed: int = typer.Option(0, "--seed"),
        epochs: int | None = typer.Option(None, "--epochs", help="RQ-VAE training epochs (default 100)."),
        batch_size: int | None = typer.Option(None, "--batch-size", help="RQ-VAE batch size (default 256)."),
        lr: float | None = typer.Option(None, "--lr", help="RQ-VAE learning rate (default 1e-3)."),
        kmeans_iters: int | None = typer.Option(
            None, "--kmeans-iters", help="k-means iterations (RQ-KMeans levels, RQ-VAE codebook init)."
        ),
        device: str = typer.Option("cpu", "--device", help="torch device, e.g. cpu or cuda."),
        threads: int = typer.Option(
            0, "--threads", help="CPU threads for torch (0: torch's default; 1 is best on a busy machine)."
        ),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out if it exists."),
        progress: bool = typer.Option(True, "--progress/--no-progress"),
    ) -> None:
        """Learn semantic IDs (RQ-VAE or RQ-KMeans) and write a re-tokenized copy of the dataset."""
        import dataclasses

        import torch

        from genrec.platform.commands.common import check_range
        from genrec.workloads.tokenize.pipeline import TokenizeConfig, tokenize_dataset
        from genrec.workloads.tokenize.rqkmeans import RQKMeansConfig
        from genrec.workloads.tokenize.rqvae import RQVAEConfig

        # None = the method's default; a given number must be valid (0 never means "the default")
        check_range("--epochs", epochs, 1)
        check_range("--batch-size", batch_size, 1)
        check_range("--kmeans-iters", kmeans_iters, 1)
        if lr is not None and not lr > 0:
            raise UserInputError(f"--lr {lr}: must be > 0")
        if method == "rqkmeans":
            given = [
                n
                for n, v in (("--epochs", epochs), ("--batch-size", batch_size), ("--lr", lr))
                if v is not None
            ]
            if given:
                raise UserInputError(
                    f"{', '.join(given)} only apply to --method rqvae; drop them for rqkmeans"
                )
        rqvae = RQVAEConfig(device=device)
        rqvae = dataclasses.replace(
            rqvae,
            epochs=rqvae.epochs if epochs is None else epochs,
            batch_size=rqvae.batch_size if batch_size is None else batch_size,
            lr=rqvae.lr if lr is None else lr,
            kmeans_iters=rqvae.kmeans_iters if kmeans_iters is None else kmeans_iters,
        )
        rqkmeans = RQKMeansConfig(device=device)
        if kmeans_iters is not None:
            rqkmeans = dataclasses.replace(rqkmeans, n_iter=kmeans_iters)
        if threads < 0:
            raise UserInputError(f"--threads must be >= 0, got {threads}")
        if threads:
            torch.set_num_threads(threads)
        config = TokenizeConfig(method, levels, codebook_size, seed, rqvae, rqkmeans, progress)
        written, stats = tokenize_dataset(data, out, config, overwrite=overwrite)
        typer.echo(format_summary(written, stats))
