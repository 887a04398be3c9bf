"""The Amazon importer's settings (`genrec data import amazon` options), validated before any file is read."""

from __future__ import annotations

from dataclasses import dataclass

from genrec.workloads.data.dataset import DatasetError

SPLIT_RULES = ("leave-one-out", "temporal")
SID_METHODS = ("rq-kmeans", "radix")


@dataclass(frozen=True)
class AmazonConfig:
    min_rating: float = 0.0
    k_core: int = 5
    split: str = "leave-one-out"
    levels: int = 3
    codebook_size: int = 256
    feature_dim: int = 64
    sid_method: str = "rq-kmeans"
    seed: int = 0  # random projection and k-means initialisation
    kmeans_iters: int = 20
    name: str | None = None

    def validate(self) -> None:
        def bad(msg: str) -> None:
            raise DatasetError(f"amazon import: {msg}")

        if self.k_core < 1:
            bad(f"k_core must be >= 1, got {self.k_core}")
        if self.split not in SPLIT_RULES:
            bad(f"split must be one of {SPLIT_RULES}, got {self.split!r}")
        if self.sid_method not in SID_METHODS:
            bad(f"sid_method must be one of {SID_METHODS}, got {self.sid_method!r}")
        if self.levels < 1 or self.codebook_size < 1:
            bad(f"levels ({self.levels}) and codebook_size ({self.codebook_size}) must be >= 1")
        if self.codebook_size**self.levels >= 2**63:
            bad(f"codebook_size {self.codebook_size} ** levels {self.levels} overflows a 64-bit SID key")
        if self.feature_dim < 1:
            bad(f"feature_dim must be >= 1, got {self.feature_dim}")
