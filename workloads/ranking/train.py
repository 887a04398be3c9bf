"""Train the ranking model on synthetic clicks (BCE over every task), so benchmarked weights are trained
weights rather than an initialisation. Seeded and short: a few hundred steps on CPU."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from genrec.workloads.ranking.model import RankingConfig, RankingModel, init_model
from genrec.workloads.ranking.synth import ClickData, synth_clicks


@dataclass(frozen=True)
class TrainResult:
    model: RankingModel
    first_loss: float
    last_loss: float
    valid_auc: list[float]  # per task, on a held-out synthetic split


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC by ranks (ties get average ranks); 0.5 when one class is absent."""
    pos = labels.bool()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return 0.5
    order = scores.argsort()
    ranks = torch.empty_like(scores, dtype=torch.float64)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    values, inverse, counts = scores.unique(return_inverse=True, return_counts=True)
    if bool((counts > 1).any()):  # average ranks of ties
        sums = torch.zeros(len(values), dtype=torch.float64).index_add_(0, inverse, ranks)
        ranks = (sums / counts)[inverse]
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def train_ranking(
    cfg: RankingConfig,
    steps: int = 200,
    batch: int = 256,
    lr: float = 3e-3,
    seed: int = 0,
    data: ClickData | None = None,
) -> TrainResult:
    data = data or synth_clicks(cfg, rows=max(4096, 4 * batch), seed=seed)
    valid = synth_clicks(cfg, rows=2048, seed=seed, split=1)
    model = init_model(cfg, seed).train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        profile, seq, item, cross, labels = data.batch(torch.randint(len(data), (batch,), generator=g))
        probs = model(profile, seq, item, cross).clamp(1e-6, 1 - 1e-6)
        loss = F.binary_cross_entropy(probs, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    with torch.inference_mode():
        p = model(valid.profile, valid.seq, valid.item, valid.cross)
    aucs = [auc(p[:, t], valid.labels[:, t]) for t in range(cfg.tasks)]
    return TrainResult(
        model, losses[0] if losses else float("nan"), losses[-1] if losses else float("nan"), aucs
    )
