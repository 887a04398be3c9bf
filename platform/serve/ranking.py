"""Parsing and checking `POST /rank` bodies, with no Ray or HTTP server involved.

    {"user": {"profile": [D_user floats], "seq": [[D_seq floats] x seq_len]},
     "items": [[D_item floats] x B], "cross": [[D_cross floats] x B], "mode": "mari" | "uoi" | "vani"}

`parse_rank` turns raw body bytes into a `RankJob` (tensors ready for `RankingScorer.run`) or raises
`RequestError(status, message)` whose message names the offending field (shapes: the message of
`check_inputs`, which names the tensor and the expected shape).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from genrec.platform.serve.requests import RequestError, describe_validation_error, load_json_body
from genrec.workloads.errors import UserInputError
from genrec.workloads.ranking.checkpoint import load_ranking
from genrec.workloads.ranking.modes import MODES, RankingScorer, check_inputs

EXAMPLE = '{"user": {"profile": [...], "seq": [[...], ...]}, "items": [[...], ...], "cross": [[...], ...]}'
NO_RANKING_MODEL = (
    "this deployment serves no ranking model; start it with ranking: DIR (genrec rank train --out DIR)"
)
MAX_ERRORS = 5  # a body with a million bad numbers gets a short message


class RankUser(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    profile: list[float] = Field(description="dense user profile, D_user floats")
    seq: list[list[float]] = Field(description="behaviour sequence, seq_len rows of D_seq floats")


class RankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    user: RankUser
    items: list[list[float]] = Field(description="candidate item features, B rows of D_item floats")
    cross: list[list[float]] = Field(description="user-item cross features, B rows of D_cross floats")
    mode: str | None = None


@dataclass(frozen=True)
class RankLimits:
    max_candidates: int
    default_mode: str = "mari"
    max_body_bytes: int = 1 << 20

    @staticmethod
    def for_config(cfg, max_candidates: int) -> RankLimits:
        """A body limit that fits `max_candidates` rows of this model's features (32 bytes a number)."""
        numbers = cfg.d_user + cfg.seq_len * cfg.d_seq + max_candidates * (cfg.d_item + cfg.d_cross)
        return RankLimits(max_candidates=max_candidates, max_body_bytes=32 * numbers + (1 << 16))


@dataclass(frozen=True)
class RankJob:
    profile: torch.Tensor  # [1, d_user]
    seq: torch.Tensor  # [1, seq_len, d_seq]
    items: torch.Tensor  # [B, d_item]
    cross: torch.Tensor  # [B, d_cross]
    mode: str

    @property
    def candidates(self) -> int:
        return int(self.items.shape[0])


def _fields_of(loc: tuple) -> list[str]:
    if loc and loc[0] == "user":
        return sorted(RankUser.model_fields)
    return sorted(RankRequest.model_fields)


def _tensor(name: str, rows: list) -> torch.Tensor:
    try:
        return torch.from_numpy(np.asarray(rows, dtype=np.float32))
    except ValueError:  # ragged rows
        lengths = sorted({len(r) for r in rows})
        raise RequestError(
            422, f"`{name}`: rows have different lengths {lengths[:10]}; every row needs the same width"
        ) from None


def parse_rank(
    body: bytes,
    limits: RankLimits,
    check: Callable[[dict, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]],
) -> RankJob:
    """Body bytes -> RankJob. `check(user, items, cross)` is the model's shape check (`check_inputs`
    bound to the served model): it returns (profile, seq, items, cross) or raises UserInputError."""
    raw = load_json_body(
        body,
        limits.max_body_bytes,
        EXAMPLE,
        f" (ranking_max_candidates={limits.max_candidates} rows of this model's features)",
        finite_only=False,  # NaN/inf get the model check's 422 naming the tensor
    )
    if not isinstance(raw, dict):
        raise RequestError(400, f"request body must be a JSON object, got {type(raw).__name__}")
    try:
        req = RankRequest.model_validate(raw)
    except ValidationError as e:
        raise RequestError(422, describe_validation_error(e, _fields_of, MAX_ERRORS)) from None

    mode = req.mode if req.mode is not None else limits.default_mode
    if mode not in MODES:
        raise RequestError(422, f"`mode`: {mode!r} is not a ranking mode; choose one of {list(MODES)}")
    if len(req.items) > limits.max_candidates:
        raise RequestError(
            413,
            f"`items` has {len(req.items)} candidates; this deployment scores at most "
            f"{limits.max_candidates} per request (ranking_max_candidates): split the candidates "
            "over several requests",
        )
    if not req.items:
        raise RequestError(422, "`items` is empty; send at least one candidate row")
    user = {"profile": _tensor("user.profile", req.user.profile), "seq": _tensor("user.seq", req.user.seq)}
    items, cross = _tensor("items", req.items), _tensor("cross", req.cross)
    try:
        profile, seq, items, cross = check(user, items, cross)
    except UserInputError as e:
        raise RequestError(422, str(e)) from None
    return RankJob(profile=profile, seq=seq, items=items, cross=cross, mode=mode)


class RankingService:
    """What a Serve replica holds for /rank: the loaded model, its scorer (the MaRI graph built once,
    at start) and the request limits. `answer` scores inline: each request carries its B candidates."""

    def __init__(self, path: str | Path, device: str | torch.device, max_candidates: int) -> None:
        t0 = time.perf_counter()
        self.path = Path(path)
        self.model = load_ranking(self.path, device=device)
        self.scorer = RankingScorer(self.model)
        self.scorer.mari_module  # noqa: B018 (trace, colour and rewrite now, not on the first request)
        self.device = torch.device(device)
        self.limits = RankLimits.for_config(self.model.cfg, max_candidates)
        self.load_s = time.perf_counter() - t0
        self.answered = 0

    def check(self, user: dict, items: torch.Tensor, cross: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return check_inputs(self.model, user, items, cross)

    def describe(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "config": asdict(self.model.cfg),
            "modes": list(MODES),
            "default_mode": self.limits.default_mode,
            "max_candidates": self.limits.max_candidates,
            "device": str(self.device),
            "mari_rewritten": sorted(e.target for e in self.scorer.eligible),
            "load_s": self.load_s,
            "answered": self.answered,
        }

    def answer(self, body: bytes, arrived: float) -> dict[str, Any]:
        """Body bytes -> the response body; raises RequestError for a bad request."""
        job = parse_rank(body, self.limits, self.check)
        with torch.inference_mode():
            t0 = time.perf_counter()
            tensors = (t.to(self.device) for t in (job.profile, job.seq, job.items, job.cross))
            scores = self.scorer.run(*tensors, job.mode)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            score_ms = (time.perf_counter() - t0) * 1e3
            out = scores.float().cpu().tolist()
        self.answered += 1
        return {
            "scores": out,
            "mode": job.mode,
            "tasks": self.model.cfg.tasks,
            "candidates": job.candidates,
            "timings_ms": {"score": score_ms, "server": (time.perf_counter() - arrived) * 1e3},
        }
