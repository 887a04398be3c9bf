"""Tokenize a dataset folder: learn semantic IDs from item features and write a new dataset folder.

    load dataset -> fit RQ-VAE or RQ-KMeans on items.parquet `features` -> encode every item
    -> ensure_unique_sids (an extra disambiguation level only if two items share a SID)
    -> write a NEW folder: same interactions, same item columns with the new `sid`, manifest with
       the new codebook sizes, `sid_stats` and the tokenizer in `provenance`.

Everything that can be checked before the (slow) fit is checked first, and the output is written
atomically by write_dataset, so bad input leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from genrec.workloads.data.dataset import Dataset, DatasetError, load_dataset, write_dataset
from genrec.workloads.errors import UserInputError
from genrec.workloads.sid_codec import codebook_utilisation, ensure_unique_sids, resolve_collisions
from genrec.workloads.tokenize.rqkmeans import RQKMeansConfig, fit_rq_kmeans
from genrec.workloads.tokenize.rqvae import RQVAEConfig, train_rqvae

METHODS = ("rqvae", "rqkmeans")
_KEY_LIMIT = 2**63  # SIDs pack into one int64 mixed-radix key (sid_codec)


@dataclass
class TokenizeConfig:
    """What to learn. `levels`, `codebook_size` and `seed` override the method config's own fields."""

    method: str = "rqvae"
    levels: int = 3
    codebook_size: int = 256
    seed: int = 0
    rqvae: RQVAEConfig = field(default_factory=RQVAEConfig)
    rqkmeans: RQKMeansConfig = field(default_factory=RQKMeansConfig)
    progress: bool = True

    def method_config(self) -> RQVAEConfig | RQKMeansConfig:
        base = self.rqvae if self.method == "rqvae" else self.rqkmeans
        return dataclasses.replace(base, levels=self.levels, codebook_size=self.codebook_size, seed=self.seed)

    def validate(self) -> None:
        if self.method not in METHODS:
            raise UserInputError(
                f"unknown tokenizer method {self.method!r}; choose one of {', '.join(METHODS)}"
            )
        if self.levels < 1:
            raise UserInputError(f"--levels must be >= 1, got {self.levels}")
        if self.codebook_size < 2:
            raise UserInputError(f"--codebook-size must be >= 2, got {self.codebook_size}")
        # levels > 63 overflows for any size >= 2 (and keeps the power below cheap to compute)
        if self.levels > 63 or self.codebook_size**self.levels >= _KEY_LIMIT:
            raise UserInputError(
                f"--codebook-size {self.codebook_size} with --levels {self.levels} gives "
                f"{self.codebook_size}^{self.levels} SIDs, which overflows the 64-bit SID key; "
                "lower --levels or --codebook-size"
            )
        params = self.method_config()
        params.validate()
        check_device(params.device)

    def to_dict(self) -> dict:
        """The parts that decide the result (for provenance); `progress` is presentation only."""
        return {
            "method": self.method,
            "levels": self.levels,
            "codebook_size": self.codebook_size,
            "seed": self.seed,
            "params": self.method_config().to_dict(),
        }


@dataclass
class FitResult:
    codes: np.ndarray  # [N, L] int64, before collision resolution
    reconstruct: Callable[[torch.Tensor], torch.Tensor]  # [N, l] code prefix -> [N, D] features
    training: dict  # method-specific summary for sid_stats


# --- checks --------------------------------------------------------------------------------------
def check_device(name: str) -> None:
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise UserInputError(f"--device {name!r} is not a torch device ({e}); use cpu or cuda") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserInputError(f"--device {name}: no CUDA device here; use --device cpu")


def check_catalogue(num_items: int, config: TokenizeConfig, where: Path) -> None:
    if num_items < config.codebook_size:
        raise UserInputError(
            f"{where}: {num_items} items but --codebook-size is {config.codebook_size}; every level "
            f"clusters the items into that many codes, so use --codebook-size <= {num_items} "
            "(well below it for good utilisation)"
        )


def item_features(ds: Dataset, where: Path) -> np.ndarray:
    features = ds.item_features()
    if features is None:
        raise DatasetError(
            f"{where}/items.parquet has no `features` column, and semantic IDs are learned from item "
            "features; create the dataset with features (e.g. `genrec data synth`, which writes them) "
            "or import item embeddings into items.parquet `features`"
        )
    if features.ndim != 2 or features.shape[1] == 0:
        raise DatasetError(f"{where}/items.parquet: `features` must be non-empty vectors of one length")
    if not np.isfinite(features).all():
        row = int(np.argwhere(~np.isfinite(features))[0, 0])
        raise DatasetError(
            f"{where}/items.parquet: item {row} has NaN or infinite features; fix or drop those values"
        )
    return features


# --- fitting -------------------------------------------------------------------------------------
def fit_codes(features: np.ndarray, config: TokenizeConfig) -> FitResult:
    params = config.method_config()
    if isinstance(params, RQVAEConfig):
        model, history = train_rqvae(features, params, progress=config.progress)
        last = history[-1]
        training = {
            "epochs": len(history),
            "loss_first_epoch": history[0]["loss"],
            "loss_last_epoch": last["loss"],
            "reconstruction_loss": last["reconstruction"],
            "codebook_loss": last["codebook"],
            "commitment_loss": last["commitment"],
            "dead_codes_reset": int(sum(sum(h["dead_codes_reset"]) for h in history)),
        }
        return FitResult(model.encode(features).cpu().numpy(), model.reconstruct, training)
    rq = fit_rq_kmeans(features, params, progress=config.progress)
    return FitResult(rq.encode(features).cpu().numpy(), rq.reconstruct, {"kmeans_iters": params.n_iter})


def reconstruction_stats(
    features: np.ndarray, codes: np.ndarray, reconstruct: Callable[[torch.Tensor], torch.Tensor]
) -> dict:
    """Error of decoding each code prefix, relative to the features' total variance (1 - R^2)."""
    x = torch.as_tensor(features, dtype=torch.float32)
    total = float(((x - x.mean(0)) ** 2).sum()) or 1.0
    codes_t = torch.as_tensor(codes)
    errors = [
        float(((reconstruct(codes_t[:, :l]).cpu() - x) ** 2).sum()) for l in range(1, codes.shape[1] + 1)
    ]
    return {
        "mse": errors[-1] / x.numel(),
        "relative": errors[-1] / total,
        "relative_by_level": [e / total for e in errors],
    }


def sid_statistics(codes: np.ndarray, codebook_sizes: tuple[int, ...]) -> dict:
    """Per-level codebook use and how many distinct SID prefixes each depth yields."""
    codes = np.asarray(codes, dtype=np.int64)
    return {
        "utilisation": codebook_utilisation(codes, codebook_sizes),
        "codes_used": [int(len(np.unique(codes[:, l]))) for l in range(codes.shape[1])],
        "distinct_prefixes": [
            int(len(np.unique(codes[:, : l + 1], axis=0))) if len(codes) else 0 for l in range(codes.shape[1])
        ],
    }


# --- the command ---------------------------------------------------------------------------------
def tokenize_dataset(
    data_dir: str | Path, out_dir: str | Path, config: TokenizeConfig, overwrite: bool = False
) -> tuple[Path, dict]:
    """Learn SIDs for the dataset at `data_dir` and write the re-tokenized dataset to `out_dir`.

    Returns the written folder and the `sid_stats` recorded in its manifest.
    """
    config.validate()
    src, out = Path(data_dir).resolve(), Path(out_dir).resolve()
    if out == src:
        raise UserInputError(f"--out {out} is the source dataset; write the tokenized copy to a new folder")
    if out.exists() and not overwrite:
        raise DatasetError(f"{out}: already exists; pass --overwrite to replace it or choose another --out")
    ds = load_dataset(src)
    features = item_features(ds, src)
    check_catalogue(len(features), config, src)

    started = time.perf_counter()
    fit = fit_codes(features, config)
    fit_seconds = time.perf_counter() - started
    learned_sizes = (config.codebook_size,) * config.levels
    codes, sizes, collisions = ensure_unique_sids(fit.codes, learned_sizes)
    if math.prod(sizes) >= _KEY_LIMIT:
        raise UserInputError(
            f"after adding a disambiguation level of size {sizes[-1]} the codebook sizes {list(sizes)} "
            "overflow the 64-bit SID key; lower --levels or --codebook-size"
        )

    stats = {
        "method": config.method,
        "levels": config.levels,
        "codebook_sizes": list(learned_sizes),
        "final_codebook_sizes": list(sizes),
        **sid_statistics(fit.codes, learned_sizes),
        "collisions": {
            "before": {k: v for k, v in collisions.items() if k != "disambiguation_level"},
            "after": {k: v for k, v in resolve_collisions(codes)[1].items() if k != "items"},  # measured
            "disambiguation_level": collisions["disambiguation_level"],
            "disambiguation_size": int(sizes[-1]) if collisions["disambiguation_level"] else 0,
        },
        "reconstruction": reconstruction_stats(features, fit.codes, fit.reconstruct),
        "training": fit.training,
        "fit_seconds": round(fit_seconds, 3),
    }
    provenance = {**ds.manifest.provenance, "tokenizer": config.to_dict(), "tokenized_from": str(src)}
    manifest = dataclasses.replace(
        ds.manifest, codebook_sizes=list(sizes), sid_stats=stats, provenance=provenance
    )

    # Re-read the tables as Arrow so every other column (and its type) is carried over unchanged.
    interactions = pq.read_table(src / "interactions.parquet")
    items = pq.read_table(src / "items.parquet")
    sid = pa.FixedSizeListArray.from_arrays(pa.array(codes.reshape(-1), type=pa.int64()), codes.shape[1])
    items = items.set_column(items.schema.get_field_index("sid"), "sid", sid)
    written = write_dataset(out, manifest, interactions, items, overwrite=overwrite)
    return written, stats
