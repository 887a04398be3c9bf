"""What a load test sends and when: its configuration, the open-loop arrival schedule and the requests.

`LoadConfig` is one load test (target, open or closed loop, request fields, SLO); `arrival_schedule`
draws the open-loop send times (Poisson or bursty gamma gaps) and `RequestSource` draws the request
bodies from a dataset's test histories with a seeded RNG. Nothing here sends anything: the async client
is platform/loadgen/client.py (the package map is in platform/loadgen/__init__.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from genrec.workloads.errors import UserInputError
from genrec.workloads.serving.slo import DEFAULT_MAX_UNANSWERED, DEFAULT_SLO_MS


@dataclass
class LoadConfig:
    """One load test: where to send, how (open/closed loop) and what."""

    url: str = "http://127.0.0.1:8000"
    mode: str = "open"  # open | closed
    rate: float = 10.0  # open loop: target requests per second
    concurrency: int = 1  # closed loop: outstanding requests
    burstiness: float = 1.0  # open loop: CV of inter-arrival times; 1 = Poisson, > 1 = bursty
    duration_s: float = 30.0  # measured part, after the warm-up
    warmup_s: float = 2.0
    warmup_requests: int = 0
    k: int = 10
    decoder: str | None = None
    beam_width: int | None = None
    constraint: str | None = None  # a set the deployment configures (GET /constraint-sets) or a rule
    seed: int = 0
    timeout_s: float = 10.0  # client-side limit per request; past it the request counts as a timeout
    slo_ms: float = DEFAULT_SLO_MS
    max_unanswered_rate: float = DEFAULT_MAX_UNANSWERED  # SLO also needs rejected+errors+timeouts below it

    def validate(self) -> LoadConfig:
        checks = [
            (self.mode in ("open", "closed"), f"--mode {self.mode!r}: use open or closed"),
            (self.rate > 0 or self.mode == "closed", f"--rate {self.rate}: must be > 0 requests/s"),
            (self.concurrency >= 1, f"--concurrency {self.concurrency}: must be >= 1"),
            (self.burstiness > 0, f"--burstiness {self.burstiness}: must be > 0 (1 = Poisson)"),
            (self.duration_s > 0, f"--duration {self.duration_s}: must be > 0 seconds"),
            (self.warmup_s >= 0, f"--warmup-s {self.warmup_s}: must be >= 0"),
            (self.warmup_requests >= 0, f"--warmup-requests {self.warmup_requests}: must be >= 0"),
            (self.k >= 1, f"--k {self.k}: must be >= 1"),
            (
                self.beam_width is None or self.beam_width >= 1,
                f"--beam-width {self.beam_width}: must be >= 1",
            ),
            (self.timeout_s > 0, f"--timeout-s {self.timeout_s}: must be > 0"),
            (self.slo_ms > 0, f"--slo-ms {self.slo_ms}: must be > 0"),
            (0 <= self.max_unanswered_rate < 1, "--max-rejection must be in [0, 1)"),
            (self.url.startswith(("http://", "https://")), f"--url {self.url!r}: expected http://HOST:PORT"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserInputError(message)
        return self

    def payload_fields(self) -> dict:
        """The request fields every request carries besides its history."""
        out: dict = {"k": self.k}
        if self.decoder:
            out["decoder"] = self.decoder
        if self.beam_width:
            out["beam_width"] = self.beam_width
        if self.constraint:
            out["constraint"] = self.constraint
        return out


# -------------------------------------------------------------------------------------- schedule


def arrival_schedule(rate: float, duration_s: float, seed: int, burstiness: float = 1.0) -> np.ndarray:
    """Send times (seconds from the start, increasing) of an open-loop arrival process on [0, duration).

    Inter-arrival gaps are gamma distributed with mean 1/rate and coefficient of variation
    `burstiness`: shape 1/CV^2 makes CV = 1 exactly the exponential gaps of a Poisson process,
    CV > 1 clumps requests into bursts with idle gaps between, CV < 1 is smoother than Poisson.
    Drawn in chunks so a long run does not allocate rate * duration gaps at once on a guess.
    """
    if rate <= 0 or duration_s <= 0 or burstiness <= 0:
        raise ValueError("rate, duration_s and burstiness must be > 0")
    rng = np.random.default_rng(seed)
    shape = 1.0 / burstiness**2
    scale = 1.0 / (rate * shape)
    chunks, t = [], 0.0
    expected = rate * duration_s
    while t < duration_s:
        n = int(expected + 4 * math.sqrt(expected) * max(1.0, burstiness)) + 16
        gaps = rng.gamma(shape, scale, size=n)
        times = t + np.cumsum(gaps)
        chunks.append(times)
        t = float(times[-1])
    times = np.concatenate(chunks)
    return times[times < duration_s]


def inter_arrival_cv(times: np.ndarray) -> float:
    gaps = np.diff(np.concatenate([[0.0], np.asarray(times, dtype=np.float64)]))
    return float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else float("nan")


def open_loop_horizon(cfg: LoadConfig) -> float:
    """Length of the open-loop schedule: warm-up (seconds, or requests at the target rate) + duration."""
    return cfg.warmup_s + cfg.duration_s + cfg.warmup_requests / cfg.rate


# -------------------------------------------------------------------------------------- requests


class RequestSource:
    """Request bodies from a dataset's test histories, drawn in index order with a seeded RNG
    (request i gets the same history in every run with the same seed, open or closed loop)."""

    def __init__(self, histories: Sequence[Sequence[int]], fields: dict, seed: int) -> None:
        if not histories:
            raise UserInputError("the dataset has no test users with a history to send")
        self.histories = histories
        self.fields = fields
        self.rng = np.random.default_rng(seed)
        self.index = 0

    def next(self) -> tuple[int, dict]:
        i = self.index
        self.index += 1
        history = self.histories[int(self.rng.integers(len(self.histories)))]
        return i, {"history": [int(x) for x in history], **self.fields}
