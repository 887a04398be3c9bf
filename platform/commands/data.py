"""`genrec data ...`: build dataset folders (synthetic generator and importers) and describe them.

Heavy imports (numpy, pyarrow, the workloads) happen inside the commands so `genrec --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from genrec.workloads.data.dataset import Manifest

app = typer.Typer(
    help="Create dataset folders: synthetic data or imports of public formats.", no_args_is_help=True
)
import_app = typer.Typer(help="Import a public data set into a dataset folder.", no_args_is_help=True)
app.add_typer(import_app, name="import")

OutOpt = Annotated[Path, typer.Option("--out", help="Dataset folder to create (written atomically).")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace --out if it already exists.")]
NameOpt = Annotated[
    str | None, typer.Option("--name", help="Dataset name in the manifest (default: derived).")
]


def parse_codebook_sizes(text: str) -> int | tuple[int, ...]:
    """'256' -> 256 (every level); '256,256,512' -> one size per level."""
    from genrec.workloads.data.dataset import DatasetError

    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise DatasetError(
            f"--codebook-size {text!r}: expected an integer (every level) "
            "or a comma-separated list per level, e.g. 32,32,64"
        ) from None
    return sizes[0] if len(sizes) == 1 else sizes


def summary_lines(manifest: Manifest, out: Path | None = None) -> list[str]:
    """Short human summary of a manifest (also used by `data info`)."""
    c = manifest.counts
    s = manifest.sid_stats
    lines = [
        f"dataset      {manifest.name}" + (f"  ({out})" if out is not None else ""),
        f"users        {manifest.num_users:,}",
        f"items        {manifest.num_items:,}",
        f"interactions train {c.get('train', 0):,} / valid {c.get('valid', 0):,} / test {c.get('test', 0):,}"
        f"  (split: {manifest.split_rule})",
        f"levels       {manifest.levels}  codebook sizes {manifest.codebook_sizes}",
    ]
    if "distinct_before" in s:
        extra = " (+1 disambiguation level)" if s.get("disambiguation_level") else ""
        lines.append(
            f"SIDs         {s['distinct_before']:,} distinct before resolution, "
            f"{s.get('colliding_items', 0):,} colliding items "
            f"in {s.get('collision_groups', 0):,} groups{extra}"
        )
        if "utilisation" in s:
            util = ", ".join(f"{u:.0%}" for u in s["utilisation"])
            lines.append(f"utilisation  {util} of each level's codebook")
    if manifest.feature_dim:
        lines.append(f"features     {manifest.feature_dim} dims")
    return lines


def _echo_summary(manifest: Manifest, out: Path, verb: str) -> None:
    for line in summary_lines(manifest):
        typer.echo(line)
    typer.echo(f"{verb} {out}")


@app.command("synth")
def synth(
    out: OutOpt,
    seed: Annotated[int, typer.Option(help="Random seed; the same seed and knobs give the same data.")] = 0,
    num_users: Annotated[int, typer.Option(help="Number of users.")] = 2000,
    num_items: Annotated[
        int, typer.Option(help="Number of items (must fit in prod(codebook sizes)).")
    ] = 1000,
    levels: Annotated[int, typer.Option(help="SID levels L.")] = 3,
    codebook_size: Annotated[
        str, typer.Option(help="Codes per level T: one integer for every level, or a comma list per level.")
    ] = "32",
    popularity_skew: Annotated[
        float, typer.Option(help="Zipf exponent of item popularity (0 = uniform).")
    ] = 1.0,
    min_history: Annotated[int, typer.Option(help="Shortest user history (>= 3).")] = 5,
    mean_history: Annotated[float, typer.Option(help="Mean history length (approximate).")] = 12.0,
    max_history: Annotated[int, typer.Option(help="Longest user history.")] = 40,
    num_clusters: Annotated[int, typer.Option(help="Latent item clusters (level 1 of the SIDs).")] = 20,
    num_subclusters: Annotated[int, typer.Option(help="Sub-clusters per cluster (level 2 of the SIDs).")] = 4,
    drift_prob: Annotated[
        float, typer.Option(help="Per-step probability a user moves to another cluster.")
    ] = 0.15,
    follow_prob: Annotated[
        float, typer.Option(help="Per-step probability of the previous item's fixed successor item.")
    ] = 0.3,
    sub_stickiness: Annotated[
        float, typer.Option(help="Per-step probability of staying in the previous item's sub-cluster.")
    ] = 0.5,
    feature_dim: Annotated[int, typer.Option(help="Item feature dimension (0 = no features).")] = 32,
    split: Annotated[str, typer.Option(help="'leave-one-out' or 'temporal' (global time order 8:1:1).")] = (
        "leave-one-out"
    ),
    name: NameOpt = None,
    overwrite: OverwriteOpt = False,
) -> None:
    """Generate a synthetic data set with learnable sequential structure."""
    import time

    from genrec.workloads.data.synth import SynthConfig, synth_dataset

    config = SynthConfig(
        seed=seed,
        num_users=num_users,
        num_items=num_items,
        levels=levels,
        codebook_size=parse_codebook_sizes(codebook_size),
        popularity_skew=popularity_skew,
        min_history=min_history,
        mean_history=mean_history,
        max_history=max_history,
        num_clusters=num_clusters,
        num_subclusters=num_subclusters,
        drift_prob=drift_prob,
        follow_prob=follow_prob,
        sub_stickiness=sub_stickiness,
        feature_dim=feature_dim,
        split=split,
        name=name,
    )
    t0 = time.perf_counter()
    path, manifest = synth_dataset(config, out, overwrite=overwrite)
    _echo_summary(manifest, path, f"wrote in {time.perf_counter() - t0:.2f}s:")


@import_app.command("atspeed")
def import_atspeed_cmd(
    path: Annotated[
        Path,
        typer.Option(
            "--path", help="Folder with sequential_{train,valid,test}.txt and the item index *.json."
        ),
    ],
    out: OutOpt,
    index: Annotated[
        Path | None, typer.Option(help="Item index JSON (default: the one *.json index in --path).")
    ] = None,
    codebook_size: Annotated[
        int | None,
        typer.Option(help="Codes per level (e.g. 256 for LC-Rec); default: max code seen + 1 per level."),
    ] = None,
    name: NameOpt = None,
    overwrite: OverwriteOpt = False,
) -> None:
    """Import the AtSpeed / LC-Rec format (temporal split kept as shipped)."""
    from genrec.workloads.data.atspeed import import_atspeed

    written, manifest = import_atspeed(
        path, out, overwrite=overwrite, name=name, index=index, codebook_size=codebook_size
    )
    _echo_summary(manifest, written, "wrote")


@import_app.command("amazon")
def import_amazon_cmd(
    reviews: Annotated[
        Path, typer.Option("--reviews", help="Amazon reviews file (2014 or 2018 JSON lines, gzip or plain).")
    ],
    out: OutOpt,
    meta: Annotated[
        Path | None, typer.Option(help="Amazon meta file (title, categories, brand) for item features.")
    ] = None,
    min_rating: Annotated[float, typer.Option(help="Keep reviews with overall >= this (0 keeps all).")] = 0.0,
    k_core: Annotated[int, typer.Option(help="Iterative k-core: users and items with >= k reviews.")] = 5,
    split: Annotated[
        str, typer.Option(help="'leave-one-out' or 'temporal' (global 8:1:1).")
    ] = "leave-one-out",
    levels: Annotated[int, typer.Option(help="Provisional SID levels.")] = 3,
    codebook_size: Annotated[int, typer.Option(help="Provisional codes per level.")] = 256,
    feature_dim: Annotated[int, typer.Option(help="Item feature dimension.")] = 64,
    sid_method: Annotated[
        str, typer.Option(help="Provisional SIDs: 'rq-kmeans' (on the features) or 'radix' (item index).")
    ] = "rq-kmeans",
    seed: Annotated[int, typer.Option(help="Seed for the co-occurrence projection and k-means.")] = 0,
    name: NameOpt = None,
    overwrite: OverwriteOpt = False,
) -> None:
    """Import a raw Amazon review dump (rating filter, k-core, time-ordered split, provisional SIDs)."""
    from genrec.workloads.data.amazon import import_amazon

    written, manifest = import_amazon(
        reviews,
        out,
        meta=meta,
        min_rating=min_rating,
        k_core=k_core,
        split=split,
        levels=levels,
        codebook_size=codebook_size,
        feature_dim=feature_dim,
        sid_method=sid_method,
        seed=seed,
        name=name,
        overwrite=overwrite,
        progress=True,
    )
    stages = manifest.provenance["stages"]
    typer.echo(
        "reviews      "
        + " -> ".join(f"{k.removeprefix('after_').replace('_', ' ')} {v:,}" for k, v in stages.items())
    )
    _echo_summary(manifest, written, "wrote")


@app.command("info")
def info(
    folder: Annotated[Path, typer.Argument(help="A dataset folder (from `genrec data synth` or `import`).")],
) -> None:
    """Validate a dataset folder and print its manifest summary."""
    from genrec.workloads.data.dataset import load_dataset

    ds = load_dataset(folder)
    for line in summary_lines(ds.manifest, ds.root):
        typer.echo(line)
    prov = ds.manifest.provenance
    source = prov.get("generator") or prov.get("importer")
    if source:
        typer.echo(f"source       {source} v{prov.get('version', '?')}")
