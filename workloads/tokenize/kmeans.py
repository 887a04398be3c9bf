"""Batched k-means (Lloyd's algorithm) in torch, seeded and deterministic on CPU.

Used by RQ-KMeans (one k-means per residual level) and by RQ-VAE (k-means initialisation of each
codebook). Distances are computed in row chunks so an [N, K] matrix never has to fit at once.

Conventions, chosen so a plain reference implementation reproduces the result exactly:
- ties in the nearest-centre search go to the lowest centre index (torch.argmin's rule);
- an empty cluster is re-seeded with the point farthest from its current centre (the m-th empty
  cluster, in index order, takes the m-th farthest point; a stable sort breaks distance ties);
- iteration stops early once the assignment no longer changes: the next update would reproduce
  the same centres, so stopping cannot change the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INITS = ("kmeans++", "random")
# Rows per distance chunk are chosen so one chunk holds about this many distances (16 MB in fp32).
_CHUNK_ELEMS = 1 << 22


@dataclass(frozen=True)
class KMeansResult:
    centroids: torch.Tensor  # [K, D]
    labels: torch.Tensor  # [N] int64, nearest centroid of each point
    distances: torch.Tensor  # [N] squared distance of each point to its centroid
    n_iter: int  # Lloyd updates performed
    converged: bool  # the assignment stopped changing before n_iter ran out

    @property
    def inertia(self) -> float:
        return float(self.distances.sum())


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(int(seed))


def squared_distances(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """[N, D] x [K, D] -> [N, K] squared Euclidean distances, clamped at 0 against round-off."""
    x2 = (x * x).sum(1, keepdim=True)
    c2 = (centroids * centroids).sum(1)
    return (x2 - 2.0 * (x @ centroids.T) + c2).clamp_min_(0.0)


def assign(x: torch.Tensor, centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centroid of each row of x and the squared distance to it, computed in row chunks."""
    n, k = x.shape[0], centroids.shape[0]
    chunk = max(1, _CHUNK_ELEMS // max(k, 1))
    labels = torch.empty(n, dtype=torch.int64, device=x.device)
    dists = torch.empty(n, dtype=x.dtype, device=x.device)
    for start in range(0, n, chunk):
        d = squared_distances(x[start : start + chunk], centroids)
        best, idx = d.min(1)  # first minimum on ties
        labels[start : start + chunk] = idx
        dists[start : start + chunk] = best
    return labels, dists


def init_random(x: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """k distinct rows of x chosen uniformly."""
    idx = torch.randperm(x.shape[0], generator=generator, device=x.device)[:k]
    return x[idx].clone()


def init_kmeans_pp(x: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """k-means++ seeding: each new centre is drawn with probability proportional to D(x)^2.

    When every remaining point sits on a chosen centre (duplicate data), the next centre is drawn
    uniformly from the points not yet chosen, so k <= N always yields k rows.
    """
    n = x.shape[0]
    chosen = torch.zeros(n, dtype=torch.bool, device=x.device)
    first = int(torch.randint(n, (1,), generator=generator, device=x.device))
    idx = [first]
    chosen[first] = True
    closest = squared_distances(x, x[first : first + 1]).squeeze(1).double()
    for _ in range(1, k):
        weights = closest if float(closest.sum()) > 0 else (~chosen).double()
        nxt = int(torch.multinomial(weights, 1, generator=generator))
        idx.append(nxt)
        chosen[nxt] = True
        closest = torch.minimum(closest, squared_distances(x, x[nxt : nxt + 1]).squeeze(1).double())
    return x[torch.tensor(idx, device=x.device)].clone()


def update_centroids(x: torch.Tensor, labels: torch.Tensor, distances: torch.Tensor, k: int) -> torch.Tensor:
    """Cluster means; empty clusters move to the points farthest from their current centre."""
    counts = torch.bincount(labels, minlength=k)
    sums = torch.zeros(k, x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, labels, x)
    centroids = sums / counts.clamp_min(1).unsqueeze(1).to(x.dtype)
    empty = torch.nonzero(counts == 0).squeeze(1)
    if len(empty):
        far = torch.argsort(distances, descending=True, stable=True)[: len(empty)]
        centroids[empty] = x[far]
    return centroids


def check_inputs(x: torch.Tensor, k: int, n_iter: int) -> None:
    if x.ndim != 2:
        raise ValueError(f"k-means expects [N, D] points, got shape {list(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"k-means expects floating-point points, got {x.dtype}")
    if k < 1:
        raise ValueError(f"k-means needs k >= 1 centres, got {k}")
    if k > x.shape[0]:
        raise ValueError(
            f"k-means with {k} centres needs at least {k} points, got {x.shape[0]}; "
            "use fewer centres (a smaller codebook) or more items"
        )
    if n_iter < 0:
        raise ValueError(f"n_iter must be >= 0, got {n_iter}")
    if not torch.isfinite(x).all():
        raise ValueError("k-means points contain NaN or infinity; clean the features first")


def kmeans(
    x: torch.Tensor,
    k: int,
    n_iter: int = 50,
    init: str | torch.Tensor = "kmeans++",
    seed: int = 0,
) -> KMeansResult:
    """Lloyd's k-means on the rows of x. `init` is "kmeans++", "random" or a [k, D] tensor of centres."""
    check_inputs(x, k, n_iter)
    if isinstance(init, torch.Tensor):
        if init.shape != (k, x.shape[1]):
            raise ValueError(f"initial centres must have shape [{k}, {x.shape[1]}], got {list(init.shape)}")
        centroids = init.to(device=x.device, dtype=x.dtype).clone()
    elif init == "kmeans++":
        centroids = init_kmeans_pp(x, k, make_generator(seed, x.device))
    elif init == "random":
        centroids = init_random(x, k, make_generator(seed, x.device))
    else:
        raise ValueError(f"unknown k-means init {init!r}; choose one of {INITS} or pass a tensor")

    labels, dists = assign(x, centroids)
    done, converged = 0, False
    while done < n_iter:
        previous = centroids
        centroids = update_centroids(x, labels, dists, k)
        done += 1
        new_labels, dists = assign(x, centroids)
        # A fixed point: the same labels give the same means, and with empty clusters the same
        # distances (centres did not move) give the same re-seeding.
        same_labels = torch.equal(new_labels, labels)
        labels = new_labels
        if same_labels and (len(torch.unique(labels)) == k or torch.equal(centroids, previous)):
            converged = True
            break
    return KMeansResult(centroids, labels, dists, done, converged)
