"""A multi-task ranking model in the shape of MaRI's Fig. 1: one user scored against B candidate items.

Inputs (rows = users or candidates):
    profile [Nu, d_user]          dense user profile                       (user side)
    seq     [Nu, seq_len, d_seq]  the user's behaviour sequence            (user side)
    item    [B, d_item]           candidate item features                  (item side)
    cross   [B, d_cross]          user-item interaction features           (cross side)
Nu is B when user features are tiled at batching (training, VanI) and 1 when they are not (UOI, MaRI):
the forward tiles user tensors with `tile` (an expand, no copy) just before each concatenation with
candidate-side tensors, so one code path serves every mode.

Blocks:
    user-only   key/value projections of the sequence, its mean ("interest"), a user embedding, and the
                MMoE gates (conditioned on the user, as personalised gating does)
    mixed       cross-attention query from [profile | item]; the fused input [profile | interest | item |
                cross | attention] of every expert; each task tower's input [expert mixture | user emb]
The first FC of each expert, the first FC of each tower and the query projection are thus exactly the
MatMuls that take a concatenation of user and candidate features: the ones MaRI re-parameterises.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from genrec.workloads.errors import UserInputError


@dataclass(frozen=True)
class RankingConfig:
    d_user: int = 256  # dense user profile width
    d_seq: int = 32  # width of one behaviour-sequence event
    seq_len: int = 20
    d_item: int = 64
    d_cross: int = 16
    d_attn: int = 32  # cross-attention width (single head)
    d_hidden: int = 128  # expert width
    d_user_emb: int = 32  # user embedding fed into every task tower
    d_tower: int = 64
    experts: int = 4
    tasks: int = 3

    def validate(self) -> RankingConfig:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserInputError(f"RankingConfig.{name}: must be an integer >= 1, got {value!r}")
        return self

    @property
    def d_fused(self) -> int:
        return self.d_user + self.d_seq + self.d_item + self.d_cross + self.d_attn


# A benchmark-sized model: the user profile dominates the fused width, as in industrial rankers.
BENCH_CONFIG = RankingConfig(
    d_user=1024,
    d_seq=64,
    seq_len=50,
    d_item=256,
    d_cross=64,
    d_attn=64,
    d_hidden=256,
    d_user_emb=64,
    d_tower=128,
    experts=4,
    tasks=3,
)


def tile(user: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast a [1, D] (or already [B, D]) user tensor to like's rows; an expand, no copy."""
    return user.expand(like.shape[0], -1)


class Expert(nn.Module):
    def __init__(self, d_in: int, d_hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc2(F.relu(self.fc1(x))))


class Tower(nn.Module):
    def __init__(self, d_in: int, d_tower: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_tower)
        self.fc2 = nn.Linear(d_tower, d_tower // 2 or 1)
        self.out = nn.Linear(d_tower // 2 or 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.fc2(F.relu(self.fc1(x)))))


class RankingModel(nn.Module):
    """Returns per-task click probabilities [B, tasks]."""

    def __init__(self, cfg: RankingConfig) -> None:
        super().__init__()
        self.cfg = cfg.validate()
        self.key = nn.Linear(cfg.d_seq, cfg.d_attn, bias=False)
        self.value = nn.Linear(cfg.d_seq, cfg.d_attn, bias=False)
        self.query = nn.Linear(cfg.d_user + cfg.d_item, cfg.d_attn)
        self.user_emb = nn.Linear(cfg.d_user, cfg.d_user_emb)
        self.gates = nn.Linear(cfg.d_user, cfg.tasks * cfg.experts)
        self.experts = nn.ModuleList(Expert(cfg.d_fused, cfg.d_hidden) for _ in range(cfg.experts))
        self.towers = nn.ModuleList(
            Tower(cfg.d_hidden + cfg.d_user_emb, cfg.d_tower) for _ in range(cfg.tasks)
        )

    def forward(
        self, profile: torch.Tensor, seq: torch.Tensor, item: torch.Tensor, cross: torch.Tensor
    ) -> torch.Tensor:
        cfg = self.cfg
        # user-only work: once per request when Nu == 1
        k = self.key(seq)  # [Nu, L, A]
        v = self.value(seq)
        interest = seq.mean(1)  # [Nu, d_seq]
        u_emb = F.relu(self.user_emb(profile))  # [Nu, d_user_emb]
        gates = self.gates(profile).view(-1, cfg.tasks, cfg.experts).softmax(-1)  # [Nu, T, E]

        # cross-attention: item queries (conditioned on the user profile) over the user sequence;
        # matmul broadcasts the Nu = 1 keys/values over the B queries
        q = self.query(torch.cat([tile(profile, item), item], -1))  # [B, A]
        scores = torch.matmul(q.unsqueeze(1), k.transpose(1, 2)) / math.sqrt(cfg.d_attn)  # [B, 1, L]
        att = torch.matmul(scores.softmax(-1), v).squeeze(1)  # [B, A]

        fused = torch.cat([tile(profile, item), tile(interest, item), item, cross, att], -1)
        h = torch.stack([e(fused) for e in self.experts], 1)  # [B, E, H]
        mixed = torch.matmul(gates, h)  # [B, T, H]
        user_for_towers = tile(u_emb, item)
        logits = torch.cat(
            [tower(torch.cat([mixed[:, t], user_for_towers], -1)) for t, tower in enumerate(self.towers)], -1
        )
        return torch.sigmoid(logits)


def eligible_reference_nodes(cfg: RankingConfig) -> set[str]:
    """The fx node names (module paths) of the MatMuls with mixed inputs, by construction."""
    return (
        {"query"}
        | {f"experts.{i}.fc1" for i in range(cfg.experts)}
        | {f"towers.{t}.fc1" for t in range(cfg.tasks)}
    )


def init_model(cfg: RankingConfig, seed: int = 0) -> RankingModel:
    torch.manual_seed(seed)
    return RankingModel(cfg).eval()
