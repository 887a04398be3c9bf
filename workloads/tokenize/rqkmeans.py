"""RQ-KMeans: residual k-means semantic IDs (no neural network).

Level 1 clusters the features into T centres; level l clusters what is left after subtracting the
centres chosen at levels 1..l-1. An item's SID is its centre index at each level, and the sum of
its centres reconstructs the features, so each level refines the previous ones coarse to fine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from genrec.workloads.errors import UserInputError
from genrec.workloads.progress import bar_enabled
from genrec.workloads.tokenize.kmeans import INITS, assign, kmeans


@dataclass
class RQKMeansConfig:
    levels: int = 3
    codebook_size: int = 256
    n_iter: int = 50  # Lloyd iterations per level (stops earlier once converged)
    init: str = "kmeans++"
    seed: int = 0  # level l uses seed + l, so levels do not share random draws
    device: str = "cpu"

    def validate(self) -> None:
        if self.levels < 1:
            raise UserInputError(f"levels must be >= 1, got {self.levels}")
        if self.codebook_size < 2:
            raise UserInputError(f"codebook size must be >= 2, got {self.codebook_size}")
        if self.n_iter < 0:
            raise UserInputError(f"k-means iterations must be >= 0, got {self.n_iter}")
        if self.init not in INITS:
            raise UserInputError(f"unknown k-means init {self.init!r}; choose one of {', '.join(INITS)}")

    def to_dict(self) -> dict:
        return asdict(self)


def as_points(features: np.ndarray | torch.Tensor, device: str | torch.device = "cpu") -> torch.Tensor:
    """Features as a float32 [N, D] tensor on `device`."""
    x = torch.as_tensor(np.asarray(features) if not isinstance(features, torch.Tensor) else features)
    if x.ndim != 2:
        raise ValueError(f"expected [N, D] features, got shape {list(x.shape)}")
    return x.to(device=device, dtype=torch.float32)


@dataclass
class RQKMeans:
    codebooks: list[torch.Tensor]  # level l: [T_l, D]

    @property
    def levels(self) -> int:
        return len(self.codebooks)

    @property
    def codebook_sizes(self) -> tuple[int, ...]:
        return tuple(int(c.shape[0]) for c in self.codebooks)

    @torch.no_grad()
    def encode(self, features: np.ndarray | torch.Tensor) -> torch.Tensor:
        """[N, D] features -> [N, L] int64 codes (greedy nearest centre per level)."""
        residual = as_points(features, self.codebooks[0].device)
        codes = []
        for cb in self.codebooks:
            labels, _ = assign(residual, cb)
            codes.append(labels)
            residual = residual - cb[labels]
        return torch.stack(codes, 1)

    @torch.no_grad()
    def reconstruct(self, codes: np.ndarray | torch.Tensor) -> torch.Tensor:
        """[N, l] codes (any prefix of the levels) -> [N, D] sum of the chosen centres."""
        codes = torch.as_tensor(np.asarray(codes) if not isinstance(codes, torch.Tensor) else codes)
        codes = codes.to(device=self.codebooks[0].device, dtype=torch.int64)
        if codes.ndim != 2 or codes.shape[1] > self.levels:
            raise ValueError(f"expected [N, <= {self.levels}] codes, got shape {list(codes.shape)}")
        out = torch.zeros(codes.shape[0], self.codebooks[0].shape[1], device=codes.device)
        for l in range(codes.shape[1]):
            out += self.codebooks[l][codes[:, l]]
        return out


def fit_rq_kmeans(
    features: np.ndarray | torch.Tensor, config: RQKMeansConfig, progress: bool = False
) -> RQKMeans:
    config.validate()
    residual = as_points(features, config.device)
    codebooks = []
    for level in tqdm(range(config.levels), desc="rq-kmeans levels", disable=not bar_enabled(progress)):
        fit = kmeans(residual, config.codebook_size, config.n_iter, config.init, config.seed + level)
        codebooks.append(fit.centroids)
        residual = residual - fit.centroids[fit.labels]
    return RQKMeans(codebooks)
