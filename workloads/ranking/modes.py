"""Three ways to score one user against B candidates with the same weights.

    vani  user features tiled to B at batching: every user-only module runs B times (Fig. 1b)
    uoi   user-only modules once on one row; user tensors tiled just before each concatenation (Fig. 1c)
    mari  as uoi, and every MatMul fed by a user/candidate concatenation rewritten by GCA into eq. 7

`RankingScorer.score(user, items, cross, mode)` is the entry point a service can wrap: shapes are
checked and a wrong one raises UserInputError naming the tensor, the expected shape and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import fx

from genrec.workloads.errors import UserInputError
from genrec.workloads.ranking.gca import Eligible, mari_rewrite
from genrec.workloads.ranking.model import RankingModel

MODES = ("vani", "uoi", "mari")
USER_INPUTS = {"profile", "seq"}
ITEM_INPUTS = {"item", "cross"}


def check_inputs(
    model: RankingModel, user: Mapping[str, torch.Tensor], items: torch.Tensor, cross: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate one request and return (profile [1, Du], seq [1, L, Ds], items [B, Di], cross [B, Dc])."""
    cfg = model.cfg
    if not isinstance(user, Mapping) or set(user) != {"profile", "seq"}:
        got = sorted(user) if isinstance(user, Mapping) else type(user).__name__
        raise UserInputError(f"user features: give a mapping with keys 'profile' and 'seq', got {got}")
    profile, seq = torch.as_tensor(user["profile"]), torch.as_tensor(user["seq"])
    items, cross = torch.as_tensor(items), torch.as_tensor(cross)
    if profile.dim() == 1:
        profile = profile.unsqueeze(0)
    if seq.dim() == 2:
        seq = seq.unsqueeze(0)
    expect = [
        ("user profile", profile, (1, cfg.d_user)),
        ("user seq", seq, (1, cfg.seq_len, cfg.d_seq)),
    ]
    for name, t, shape in expect:
        if tuple(t.shape) != shape:
            raise UserInputError(
                f"{name}: expected shape {list(shape[1:])} (or {list(shape)}), got {list(t.shape)}; "
                "one user per request"
            )
    if items.dim() != 2 or items.shape[1] != cfg.d_item or items.shape[0] < 1:
        raise UserInputError(
            f"item features: expected [B, {cfg.d_item}] with B >= 1, got {list(items.shape)}"
        )
    if cross.dim() != 2 or cross.shape[1] != cfg.d_cross or cross.shape[0] != items.shape[0]:
        raise UserInputError(
            f"cross features: expected [{items.shape[0]}, {cfg.d_cross}] (one row per candidate), "
            f"got {list(cross.shape)}"
        )
    for name, t in (("user profile", profile), ("user seq", seq), ("items", items), ("cross", cross)):
        if not t.is_floating_point():
            raise UserInputError(f"{name}: expected floating point features, got {t.dtype}")
        if not bool(torch.isfinite(t).all()):
            raise UserInputError(f"{name}: contains NaN or inf")
    return profile, seq, items, cross


class RankingScorer:
    """One model, three inference modes. The MaRI graph is built (traced, coloured, rewritten) once."""

    def __init__(self, model: RankingModel) -> None:
        self.model = model.eval()
        self._mari: fx.GraphModule | None = None
        self.eligible: list[Eligible] = []

    @property
    def mari_module(self) -> fx.GraphModule:
        if self._mari is None:
            cfg = self.model.cfg
            p = next(self.model.parameters())
            example = (
                torch.zeros(1, cfg.d_user, dtype=p.dtype, device=p.device),
                torch.zeros(1, cfg.seq_len, cfg.d_seq, dtype=p.dtype, device=p.device),
                torch.zeros(2, cfg.d_item, dtype=p.dtype, device=p.device),
                torch.zeros(2, cfg.d_cross, dtype=p.dtype, device=p.device),
            )
            self._mari, self.eligible = mari_rewrite(self.model, example, USER_INPUTS, ITEM_INPUTS)
        return self._mari

    @torch.inference_mode()
    def run(
        self, profile: torch.Tensor, seq: torch.Tensor, items: torch.Tensor, cross: torch.Tensor, mode: str
    ) -> torch.Tensor:
        """Unchecked fast path (benchmarks): one-row user tensors in, [B, tasks] scores out."""
        if mode == "vani":
            b = items.shape[0]
            # tiling at batching materialises B copies, as a batcher building training-shaped rows does
            return self.model(
                profile.expand(b, -1).contiguous(), seq.expand(b, -1, -1).contiguous(), items, cross
            )
        if mode == "uoi":
            return self.model(profile, seq, items, cross)
        if mode == "mari":
            return self.mari_module(profile, seq, items, cross)
        raise UserInputError(f"mode {mode!r}: choose one of {list(MODES)}")

    def score(
        self, user: Mapping[str, torch.Tensor], items: torch.Tensor, cross: torch.Tensor, mode: str = "mari"
    ) -> torch.Tensor:
        if mode not in MODES:
            raise UserInputError(f"mode {mode!r}: choose one of {list(MODES)}")
        p = next(self.model.parameters())
        profile, seq, items, cross = (
            t.to(device=p.device, dtype=p.dtype) for t in check_inputs(self.model, user, items, cross)
        )
        return self.run(profile, seq, items, cross, mode)


def score(
    scorer: RankingScorer,
    user_feats: Mapping[str, torch.Tensor],
    item_feats: torch.Tensor,
    cross_feats: torch.Tensor,
    mode: str = "mari",
) -> torch.Tensor:
    return scorer.score(user_feats, item_feats, cross_feats, mode)
