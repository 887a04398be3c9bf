"""Synthetic GR data with sequential structure a model can learn, generated in a few vectorised steps.

Generative story (all draws from one seeded numpy Generator):

* Items belong to latent clusters, and each cluster to a few sub-clusters. Item popularity is
  Zipf-like, weight (rank + 1) ** -popularity_skew, with ranks assigned at random.
* A user has a current cluster. At every step the cluster drifts with probability `drift_prob`
  along a sparse cluster-transition Markov chain (each cluster has a few successor clusters),
  otherwise it stays. The next item is drawn by popularity within the current cluster; with
  probability `sub_stickiness` (when the cluster did not change) within the previous item's
  sub-cluster only. With probability `follow_prob` the user instead takes the previous item's
  fixed "successor" item (a short-range item-to-item transition, like shampoo -> conditioner).
* History lengths are min_history + geometric, clipped to max_history.
* Semantic IDs are assigned from the latent hierarchy: level 1 encodes the cluster, level 2 the
  sub-cluster, deeper levels the item's popularity rank inside its sub-cluster; collisions (a full
  sub-cluster, more clusters than codes) are resolved by linear probing in mixed-radix key order,
  so every item gets a distinct SID with exactly `levels` levels and the prefix structure is kept
  wherever the codebook has room.
* Item features are cluster centre + sub-cluster offset + noise, so a tokenizer run on them can
  recover the hierarchy.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from genrec.workloads.data.dataset import (
    DatasetError,
    Manifest,
    interactions_table,
    items_table,
    split_counts,
    write_dataset,
)
from genrec.workloads.data.splits import leave_one_out, temporal_split
from genrec.workloads.sid_codec import SIDCodec, codebook_utilisation, ensure_unique_sids

GENERATOR_NAME = "genrec.synth"
GENERATOR_VERSION = "1"
SPLIT_RULES = ("leave-one-out", "temporal")


@dataclass(frozen=True)
class SynthConfig:
    seed: int = 0
    num_users: int = 2000
    num_items: int = 1000
    levels: int = 3
    codebook_size: int | tuple[int, ...] = 32  # one size for every level, or one per level
    popularity_skew: float = 1.0  # Zipf exponent; 0 = uniform popularity
    min_history: int = 5
    mean_history: float = 12.0  # approximate: the geometric tail is clipped at max_history
    max_history: int = 40
    num_clusters: int = 20
    num_subclusters: int = 4  # per cluster
    cluster_successors: int = 2  # out-degree of the cluster-transition chain
    drift_prob: float = 0.15  # per step, move to a successor cluster
    follow_prob: float = 0.3  # per step, take the previous item's successor item
    sub_stickiness: float = 0.5  # per step (no drift), stay in the previous item's sub-cluster
    feature_dim: int = 32  # 0 = no features column
    feature_noise: float = 0.1
    split: str = "leave-one-out"  # or "temporal" (global time order 8:1:1)
    name: str | None = None

    @property
    def codebook_sizes(self) -> tuple[int, ...]:
        if np.ndim(self.codebook_size) == 0:  # an int (also numpy ints from configs)
            return (int(self.codebook_size),) * self.levels
        return tuple(int(t) for t in self.codebook_size)

    @property
    def dataset_name(self) -> str:
        return self.name or f"synth-s{self.seed}-u{self.num_users}-i{self.num_items}"

    def validate(self) -> None:
        """Raise DatasetError naming the knob and a fix for impossible settings."""

        def bad(msg: str) -> None:
            raise DatasetError(f"synthetic data config: {msg}")

        if self.num_users < 1 or self.num_items < 1:
            bad(f"num_users ({self.num_users}) and num_items ({self.num_items}) must be >= 1")
        if self.levels < 1:
            bad(f"levels must be >= 1, got {self.levels}")
        if np.ndim(self.codebook_size) != 0 and len(self.codebook_size) != self.levels:
            bad(
                f"codebook_size {tuple(self.codebook_size)} has {len(self.codebook_size)} entries but levels "
                f"is {self.levels}; give one size or one per level"
            )
        sizes = self.codebook_sizes
        if any(t < 1 for t in sizes):
            bad(f"codebook sizes must be >= 1, got {sizes}")
        if math.prod(sizes) >= 2**63:
            bad(f"codebook sizes {sizes} overflow a 64-bit SID key; use fewer levels or smaller codebooks")
        if self.num_items > math.prod(sizes):
            bad(
                f"{self.num_items} items do not fit in {math.prod(sizes)} distinct SIDs "
                f"(codebook sizes {sizes}); raise codebook_size or levels, or lower num_items"
            )
        if not 3 <= self.min_history <= self.mean_history <= self.max_history:
            bad(
                f"need 3 <= min_history <= mean_history <= max_history, got {self.min_history}, "
                f"{self.mean_history}, {self.max_history} (3 so every user has train, valid and test items)"
            )
        if not 1 <= self.num_clusters <= self.num_items:
            bad(f"num_clusters must be in 1..num_items ({self.num_items}), got {self.num_clusters}")
        if self.num_subclusters < 1 or self.cluster_successors < 1:
            bad("num_subclusters and cluster_successors must be >= 1")
        for knob in ("drift_prob", "follow_prob", "sub_stickiness"):
            if not 0.0 <= getattr(self, knob) <= 1.0:
                bad(f"{knob} must be a probability in [0, 1], got {getattr(self, knob)}")
        if self.popularity_skew < 0 or self.feature_noise < 0 or self.feature_dim < 0:
            bad("popularity_skew, feature_noise and feature_dim must be >= 0")
        if self.split not in SPLIT_RULES:
            bad(f"split must be one of {SPLIT_RULES}, got {self.split!r}")


@dataclass
class LatentItems:
    """The hidden structure behind the catalogue (also written to items.parquet for diagnostics)."""

    cluster: np.ndarray  # [N] cluster id
    sub: np.ndarray  # [N] sub-cluster id within the cluster
    weight: np.ndarray  # [N] popularity weight
    successor: np.ndarray  # [N] item-to-item transition target


class GroupSampler:
    """Draw items by popularity restricted to a cluster or a (cluster, sub-cluster) group, vectorised.

    Items are laid out sorted by (cluster, sub) so every group is one contiguous range of a global
    cumulative-weight array; a draw is one searchsorted per sample.
    """

    def __init__(self, cluster: np.ndarray, sub: np.ndarray, weight: np.ndarray, n_clusters: int, n_sub: int):
        group = cluster * n_sub + sub
        self.order = np.lexsort((sub, cluster))
        self.cw = np.cumsum(weight[self.order])
        self.before = np.concatenate([[0.0], self.cw])
        self.cluster_bounds = _bounds(cluster[self.order], n_clusters)
        self.group_bounds = _bounds(group[self.order], n_clusters * n_sub)
        self.n_sub = n_sub

    def _draw(self, bounds: np.ndarray, ids: np.ndarray, u: np.ndarray) -> np.ndarray:
        start, end = bounds[ids], bounds[ids + 1]
        lo, hi = self.before[start], self.before[end]
        idx = np.searchsorted(self.cw, lo + u * (hi - lo), side="right")
        return self.order[np.clip(idx, start, end - 1)]

    def in_cluster(self, clusters: np.ndarray, u: np.ndarray) -> np.ndarray:
        return self._draw(self.cluster_bounds, clusters, u)

    def in_group(self, clusters: np.ndarray, subs: np.ndarray, u: np.ndarray) -> np.ndarray:
        return self._draw(self.group_bounds, clusters * self.n_sub + subs, u)


def _bounds(sorted_ids: np.ndarray, n: int) -> np.ndarray:
    """[n + 1] start offsets of each id's run in a sorted id array (empty runs allowed)."""
    return np.searchsorted(sorted_ids, np.arange(n + 1), side="left")


# --- latent structure ------------------------------------------------------------------------------
def make_latent_items(cfg: SynthConfig, rng: np.random.Generator) -> tuple[LatentItems, GroupSampler]:
    n, c, s = cfg.num_items, cfg.num_clusters, cfg.num_subclusters
    # balanced random assignment: every cluster gets items (num_clusters <= num_items)
    slot = np.empty(n, dtype=np.int64)
    slot[rng.permutation(n)] = np.arange(n)
    cluster = slot % c
    sub = (slot // c) % s
    rank = rng.permutation(n)
    weight = (rank + 1.0) ** -cfg.popularity_skew
    sampler = GroupSampler(cluster, sub, weight, c, s)
    successor = sampler.in_cluster(cluster, rng.random(n))
    # avoid self-loops: redraw once; a single-item cluster keeps its self-loop
    again = successor == np.arange(n)
    successor[again] = sampler.in_cluster(cluster[again], rng.random(int(again.sum())))
    return LatentItems(cluster, sub, weight, successor), sampler


def make_cluster_chain(cfg: SynthConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sparse cluster-transition chain: [C, k] successor clusters and their cumulative probabilities."""
    c, k = cfg.num_clusters, cfg.cluster_successors
    if c == 1:
        return np.zeros((1, k), dtype=np.int64), np.linspace(1.0 / k, 1.0, k)[None, :]
    # successors exclude the cluster itself (staying is handled by 1 - drift_prob)
    succ = np.stack([(i + 1 + rng.choice(c - 1, size=k, replace=k > c - 1)) % c for i in range(c)])
    probs = rng.dirichlet(np.ones(k), size=c)
    return succ, np.cumsum(probs, axis=1)


def history_lengths(cfg: SynthConfig, rng: np.random.Generator) -> np.ndarray:
    extra = cfg.mean_history - cfg.min_history
    tail = rng.geometric(1.0 / (extra + 1.0), size=cfg.num_users) - 1 if extra > 0 else 0
    return np.clip(cfg.min_history + tail, cfg.min_history, cfg.max_history).astype(np.int64)


def simulate_sequences(
    cfg: SynthConfig, latent: LatentItems, sampler: GroupSampler, rng: np.random.Generator, max_len: int
) -> np.ndarray:
    """[num_users, max_len] item ids; each column is one step for every user at once."""
    u_count = cfg.num_users
    succ_c, cum_p = make_cluster_chain(cfg, rng)
    mass = np.bincount(latent.cluster, weights=latent.weight, minlength=cfg.num_clusters)
    cur = rng.choice(cfg.num_clusters, size=u_count, p=mass / mass.sum())
    seq = np.empty((u_count, max_len), dtype=np.int64)
    seq[:, 0] = sampler.in_cluster(cur, rng.random(u_count))
    for t in range(1, max_len):
        prev = seq[:, t - 1]
        r = rng.random((5, u_count))
        drift = r[0] < cfg.drift_prob
        col = np.minimum((r[1][:, None] > cum_p[cur]).sum(axis=1), cum_p.shape[1] - 1)
        cur = np.where(drift, succ_c[cur, col], cur)
        nxt = sampler.in_cluster(cur, r[2])
        sticky = ~drift & (r[3] < cfg.sub_stickiness)
        nxt = np.where(sticky, sampler.in_group(latent.cluster[prev], latent.sub[prev], r[4]), nxt)
        follow = rng.random(u_count) < cfg.follow_prob
        nxt = np.where(follow, latent.successor[prev], nxt)
        seq[:, t] = nxt
        cur = latent.cluster[nxt]
    return seq


def make_features(cfg: SynthConfig, latent: LatentItems, rng: np.random.Generator) -> np.ndarray | None:
    if cfg.feature_dim == 0:
        return None
    d = cfg.feature_dim
    centres = rng.normal(size=(cfg.num_clusters, d))
    offsets = 0.5 * rng.normal(size=(cfg.num_clusters, cfg.num_subclusters, d))
    noise = cfg.feature_noise * rng.normal(size=(cfg.num_items, d))
    return (centres[latent.cluster] + offsets[latent.cluster, latent.sub] + noise).astype(np.float32)


# --- semantic IDs --------------------------------------------------------------------------------
def hierarchical_sids(latent: LatentItems, sizes: tuple[int, ...], n_sub: int) -> tuple[np.ndarray, dict]:
    """Distinct SIDs whose prefix follows (cluster, sub-cluster, popularity rank).

    Preferred key: level 1 = cluster mod T_1; the remaining mixed-radix space R = prod T_2.. is cut
    into one block per sub-cluster, the item's rank inside its sub-cluster indexes the block. Two
    items wanting the same key are resolved by linear probing over keys in sorted order (vectorised
    as a running maximum), so a collision moves an item to the next free code at the deepest level.
    """
    codec = SIDCodec(sizes)
    n = len(latent.cluster)
    rest = math.prod(sizes[1:])
    block = max(1, rest // n_sub)
    # rank inside (cluster, sub) by popularity, most popular first
    order = np.lexsort((-latent.weight, latent.sub, latent.cluster))
    group = (latent.cluster * n_sub + latent.sub)[order]
    first = np.searchsorted(group, group, side="left")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - first
    within = np.minimum(latent.sub * block + rank, rest - 1)
    preferred = (latent.cluster % sizes[0]) * rest + within
    # linear probing in key order: assigned_i = i + max_{j <= i} (pref_j - j)
    by_key = np.argsort(preferred, kind="stable")
    p = preferred[by_key]
    idx = np.arange(n)
    assigned_sorted = idx + np.maximum.accumulate(p - idx)
    total = codec.num_sids
    overflow = assigned_sorted >= total
    if overflow.any():  # wrap around: the smallest keys nobody took
        free = np.setdiff1d(np.arange(min(total, 2 * n + 1)), assigned_sorted[~overflow])
        assigned_sorted[overflow] = free[: int(overflow.sum())]
    keys = np.empty(n, dtype=np.int64)
    keys[by_key] = assigned_sorted
    codes = np.asarray(codec.keys_to_codes(keys), dtype=np.int64)
    stats = {"method": "hierarchical(cluster, sub-cluster, popularity rank) + linear probing"}
    stats["relocated_items"] = int((keys != preferred).sum())
    return codes, stats


def interaction_times(lengths: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Users start at random times and act at exponential gaps, so global order interleaves users."""
    start = rng.uniform(0.0, float(lengths.mean()), size=len(lengths))
    gaps = rng.exponential(1.0, size=int(lengths.sum()))
    user_start = np.repeat(np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    csum = np.cumsum(gaps)
    within = csum - (csum[user_start] - gaps[user_start])  # cumulative gap restarted per user
    return np.repeat(start, lengths) + within


# --- public API ----------------------------------------------------------------------------------
def generate_synthetic(config: SynthConfig) -> tuple[Manifest, pa.Table, pa.Table]:
    config.validate()
    rng = np.random.default_rng(config.seed)
    sizes = config.codebook_sizes
    latent, sampler = make_latent_items(config, rng)
    lengths = history_lengths(config, rng)
    seq = simulate_sequences(config, latent, sampler, rng, int(lengths.max()))
    mask = np.arange(seq.shape[1])[None, :] < lengths[:, None]
    users = np.repeat(np.arange(config.num_users), lengths)
    items = seq[mask]
    positions = np.nonzero(mask)[1]
    if config.split == "leave-one-out":
        splits = leave_one_out(lengths, positions)
    else:
        splits = temporal_split(interaction_times(lengths, rng))
    features = make_features(config, latent, rng)

    codes, probe_stats = hierarchical_sids(latent, sizes, config.num_subclusters)
    codes, sizes, sid_stats = ensure_unique_sids(codes, sizes)  # a guard: probing already made them distinct
    sid_stats.update(probe_stats)
    sid_stats["utilisation"] = codebook_utilisation(codes, sizes)

    item_tab = items_table(codes, features=features)
    item_tab = item_tab.append_column("cluster", pa.array(latent.cluster.astype(np.int32)))
    item_tab = item_tab.append_column("subcluster", pa.array(latent.sub.astype(np.int32)))
    cfg = asdict(config)
    cfg["codebook_size"] = list(config.codebook_sizes)
    manifest = Manifest(
        name=config.dataset_name,
        codebook_sizes=list(sizes),
        num_users=config.num_users,
        num_items=config.num_items,
        counts=split_counts(splits),
        split_rule=config.split,
        provenance={"generator": GENERATOR_NAME, "version": GENERATOR_VERSION, "config": cfg},
        sid_stats=sid_stats,
        feature_dim=config.feature_dim,
    )
    return manifest, interactions_table(users, items, positions, splits), item_tab


def synth_dataset(
    config: SynthConfig, out: str | os.PathLike, overwrite: bool = False
) -> tuple[Path, Manifest]:
    """Generate and write a dataset folder atomically; returns the folder and its manifest."""
    manifest, interactions, items = generate_synthetic(config)
    return write_dataset(out, manifest, interactions, items, overwrite=overwrite), manifest
