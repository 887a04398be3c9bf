"""xSchedule (xGR section 6): SLO-bounded batching by token capacity, as a plain component.

A GR request's cost grows with its prompt and its beams (the beam cache, the per-step candidates), so
a batch is bounded by *tokens* - the sum of prompt tokens x beams of its requests - not by a request
count. The policy dispatches a batch when either
  - the queued work fills the token budget (a full batch: waiting longer gains nothing), or
  - the oldest queued request has used its wait quota (`wait_share` of the SLO): it must start now to
    finish within the SLO,
taking requests oldest first while the batch stays within the budget. Admission control rejects a
request that cannot meet the SLO (it alone exceeds the budget, or the work queued before it cannot
drain in time) instead of queueing it past its deadline; the caller answers 503 + Retry-After.

No Ray, no asyncio: the clock is injected (`time.monotonic` in production, a fake in tests), so the
same policy runs inside the Serve app and in an in-process open-loop harness (the lent GPU machine
has no Ray). Service time per token is learned from finished batches (`record`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduleConfig:
    token_budget: int  # max sum(prompt tokens x beams) in one batch
    slo_s: float  # end-to-end latency objective of one request
    wait_share: float = 0.3  # share of the SLO a request may spend queued before it must dispatch
    initial_s_per_token: float = 1e-6  # service-time guess until a batch has been measured
    smoothing: float = 0.2  # weight of the newest batch in the service-time estimate

    def __post_init__(self) -> None:
        if self.token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {self.token_budget}")
        if not self.slo_s > 0:
            raise ValueError(f"slo_s must be > 0, got {self.slo_s}")
        if not 0 < self.wait_share < 1:
            raise ValueError(f"wait_share must be in (0, 1), got {self.wait_share}")

    @property
    def wait_quota_s(self) -> float:
        return self.wait_share * self.slo_s


@dataclass(frozen=True)
class QueuedRequest:
    key: object  # the caller's handle (a future, a request id)
    arrival_s: float
    prompt_tokens: int
    beams: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens * self.beams


@dataclass(frozen=True)
class Admission:
    admitted: bool
    reason: str = ""
    retry_after_s: float = 0.0


class SLOBatchPolicy:
    """Token-capacity batching with per-request SLO wait quotas and admission control."""

    def __init__(self, cfg: ScheduleConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg, self.clock = cfg, clock
        self.queue: deque[QueuedRequest] = deque()
        self.queued_tokens = 0
        self.s_per_token = cfg.initial_s_per_token

    # --- admission ---------------------------------------------------------------------------------
    def service_s(self, tokens: int) -> float:
        """Estimated time to decode a batch of `tokens`."""
        return tokens * self.s_per_token

    def admit(self, key: object, prompt_tokens: int, beams: int) -> Admission:
        """Queue the request, or say why it cannot meet the SLO."""
        req = QueuedRequest(key, self.clock(), prompt_tokens, beams)
        if req.tokens > self.cfg.token_budget:
            return Admission(
                False,
                f"{req.tokens} tokens (prompt x beams) exceed the batch budget of {self.cfg.token_budget}",
            )
        # the queued work drains in full batches before this request's batch runs
        ahead = self.service_s(self.queued_tokens)
        finish = ahead + self.service_s(self.cfg.token_budget)
        if finish > self.cfg.slo_s:
            return Admission(
                False, f"queued work needs {finish:.3f} s, over the {self.cfg.slo_s} s SLO", ahead
            )
        self.queue.append(req)
        self.queued_tokens += req.tokens
        return Admission(True)

    # --- dispatch ----------------------------------------------------------------------------------
    def due_in(self) -> float | None:
        """Seconds until the oldest request's quota runs out (0: dispatch now); None when idle."""
        if not self.queue:
            return None
        if self.queued_tokens >= self.cfg.token_budget:
            return 0.0
        return max(0.0, self.queue[0].arrival_s + self.cfg.wait_quota_s - self.clock())

    def next_batch(self) -> list[QueuedRequest]:
        """The batch to run now (oldest first, within the budget), or [] to keep waiting."""
        due = self.due_in()
        if due is None or due > 0:
            return []
        batch, tokens = [], 0
        while self.queue and tokens + self.queue[0].tokens <= self.cfg.token_budget:
            req = self.queue.popleft()
            batch.append(req)
            tokens += req.tokens
        self.queued_tokens -= tokens
        return batch

    def record(self, batch: list[QueuedRequest], seconds: float) -> None:
        """Learn the service time per token from a finished batch (exponential smoothing)."""
        tokens = sum(r.tokens for r in batch)
        if tokens and seconds > 0:
            a = self.cfg.smoothing
            self.s_per_token = (1 - a) * self.s_per_token + a * seconds / tokens
