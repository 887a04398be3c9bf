"""Seeded synthetic click logs for the ranking model.

Each user and item has a latent taste vector; the user's profile, the user's behaviour sequence (items
the user interacted with, noisy), the item features and the cross features are random linear views of
those latents, so the features carry the signal and the model has something to learn. Each task's
click probability is a sigmoid of a task-specific bilinear affinity plus a task bias; labels are
Bernoulli draws. Rows mix users, as training logs do (so Nu == B in training).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from genrec.workloads.ranking.model import RankingConfig


@dataclass(frozen=True)
class ClickData:
    profile: torch.Tensor  # [N, d_user]
    seq: torch.Tensor  # [N, seq_len, d_seq]
    item: torch.Tensor  # [N, d_item]
    cross: torch.Tensor  # [N, d_cross]
    labels: torch.Tensor  # [N, tasks] in {0, 1}

    def __len__(self) -> int:
        return self.labels.shape[0]

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.profile[idx], self.seq[idx], self.item[idx], self.cross[idx], self.labels[idx]


def synth_clicks(
    cfg: RankingConfig,
    rows: int = 4096,
    users: int = 256,
    items: int = 512,
    latent: int = 8,
    seed: int = 0,
    split: int = 0,
) -> ClickData:
    """`seed` fixes the world (latents, feature maps, task weights); `split` draws different rows
    (users x items pairs and label noise) from the same world, e.g. 0 = train, 1 = valid."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    user_lat, item_lat = randn(users, latent), randn(items, latent)
    to_profile, to_item = randn(latent, cfg.d_user) / latent**0.5, randn(latent, cfg.d_item) / latent**0.5
    to_seq, to_cross = randn(latent, cfg.d_seq) / latent**0.5, randn(latent, cfg.d_cross) / latent**0.5
    task_mix = randn(cfg.tasks, latent, latent) / latent
    task_bias = randn(cfg.tasks) * 0.5 - 0.5

    g.manual_seed(seed * 1_000_003 + 7919 * (split + 1))  # rows of this split, same world
    u = torch.randint(users, (rows,), generator=g)
    i = torch.randint(items, (rows,), generator=g)
    # behaviour sequence: items near the user's taste (latent + noise), one event per position
    seq_lat = user_lat[u].unsqueeze(1) + 0.7 * randn(rows, cfg.seq_len, latent)
    affinity = torch.einsum("nl,tlm,nm->nt", user_lat[u], task_mix, item_lat[i]) + task_bias
    labels = torch.bernoulli(torch.sigmoid(2.0 * affinity), generator=g)
    return ClickData(
        profile=user_lat[u] @ to_profile + 0.1 * randn(rows, cfg.d_user),
        seq=seq_lat @ to_seq,
        item=item_lat[i] @ to_item + 0.1 * randn(rows, cfg.d_item),
        cross=(user_lat[u] * item_lat[i]) @ to_cross,
        labels=labels,
    )
