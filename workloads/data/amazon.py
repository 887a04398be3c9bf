"""Import raw Amazon review dumps (2014 or 2018 release) into a dataset folder.

Input: one review per line with keys reviewerID, asin, overall, unixReviewTime, gzip or plain.
2018 files are strict JSON; the 2014 files are Python dict literals (single quotes), parsed with
ast.literal_eval, never eval. Pipeline, each step a small pure function:

1. rating filter: keep overall >= min_rating (default 0 keeps everything, as the usual
   sequential-recommendation preprocessing treats every review as an interaction);
2. duplicates: a user reviewing the same item twice keeps only the earliest review;
3. iterative k-core: drop users and items with fewer than k reviews until none is left;
4. each user's reviews in time order (equal times keep file order);
5. split: leave-one-out (last -> test, second-last -> valid) or global temporal 8:1:1.

Ids: users and items are dense in sorted source-id order; items keep the asin in `source_id`.

Item features (feature_dim floats, L2-normalised, deterministic, no network: amazon_features.py) and
provisional SIDs (real ones come from `genrec tokenize`: amazon_sids.py) follow. Everything is read
and validated before anything is written.

Modules: amazon_config.py (AmazonConfig), amazon_reviews.py (reading the dumps),
amazon_interactions.py (steps 1-5), amazon_features.py, amazon_sids.py; their names stay importable
from here.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa

from genrec.workloads.data.amazon_config import AmazonConfig
from genrec.workloads.data.amazon_features import item_features
from genrec.workloads.data.amazon_interactions import (
    filter_and_split,
)
from genrec.workloads.data.amazon_reviews import (
    read_meta,
    read_reviews,
)
from genrec.workloads.data.amazon_sids import provisional_sids
from genrec.workloads.data.dataset import (
    DatasetError,
    Manifest,
    interactions_table,
    items_table,
    split_counts,
    write_dataset,
)

__all__ = ["IMPORTER_VERSION", "build_amazon", "import_amazon"]

IMPORTER_VERSION = "1"


def _default_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json", ".jsonl"):
        name = name.removesuffix(suffix)
    return name or "amazon"


def build_amazon(
    reviews: str | os.PathLike,
    meta: str | os.PathLike | None = None,
    config: AmazonConfig | None = None,
    progress: bool = False,
) -> tuple[Manifest, pa.Table, pa.Table]:
    """Read, filter, split and featurise; returns (manifest, interactions, items) without writing."""
    cfg = config or AmazonConfig()
    cfg.validate()
    path = Path(reviews)
    inter = filter_and_split(read_reviews(path, progress), cfg, path)
    meta_tokens_by_asin = read_meta(Path(meta), progress) if meta is not None else None
    features, feature_info = item_features(inter, cfg, meta_tokens_by_asin)
    codes, sizes, sid_stats = provisional_sids(features, cfg)
    files = [path] + ([Path(meta)] if meta is not None else [])
    manifest = Manifest(
        name=cfg.name or _default_name(path),
        codebook_sizes=list(sizes),
        num_users=int(inter.users.max()) + 1,
        num_items=len(inter.item_source_ids),
        counts=split_counts(inter.splits),
        split_rule=cfg.split,
        provenance={
            "importer": "amazon",
            "version": IMPORTER_VERSION,
            "files": {str(p.resolve()): p.stat().st_size for p in files},
            "config": asdict(cfg),
            "stages": inter.stage_counts,
            "sid_method": cfg.sid_method,
            "user_id_rule": "dense in sorted reviewerID order",
            **feature_info,
        },
        sid_stats=sid_stats,
        feature_dim=cfg.feature_dim,
    )
    interactions = interactions_table(inter.users, inter.items, inter.positions, inter.splits)
    return manifest, interactions, items_table(codes, inter.item_source_ids, features)


def import_amazon(
    reviews: str | os.PathLike,
    out: str | os.PathLike,
    meta: str | os.PathLike | None = None,
    min_rating: float = 0.0,
    k_core: int = 5,
    split: str = "leave-one-out",
    levels: int = 3,
    codebook_size: int = 256,
    feature_dim: int = 64,
    sid_method: str = "rq-kmeans",
    seed: int = 0,
    name: str | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> tuple[Path, Manifest]:
    """Import an Amazon review dump into the dataset folder `out` (atomic); returns (out, manifest)."""
    cfg = AmazonConfig(
        min_rating=min_rating,
        k_core=k_core,
        split=split,
        levels=levels,
        codebook_size=codebook_size,
        feature_dim=feature_dim,
        sid_method=sid_method,
        seed=seed,
        name=name,
    )
    if Path(out).exists() and not overwrite:  # fail before a long read; write_dataset checks again
        raise DatasetError(
            f"{Path(out).resolve()}: already exists; pass --overwrite to replace it or choose another --out"
        )
    manifest, interactions, items = build_amazon(reviews, meta, cfg, progress)
    return write_dataset(out, manifest, interactions, items, overwrite=overwrite), manifest
