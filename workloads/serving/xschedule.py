"""xSchedule (xGR section 7): SLO-bounded batching by token capacity, and the fixed-size batcher it
replaces, as plain components with one interface.

A GR request's cost grows with its prompt and its beams (the beam cache, the per-step candidates), so
a batch is bounded by *tokens* - the sum of prompt tokens x beams of its requests - not by a request
count. `SLOBatchPolicy` dispatches a batch when either
  - the queued work fills the token budget (a full batch: waiting longer gains nothing), or
  - the oldest queued request has used its wait quota (`wait_share` of the SLO): it must start now to
    finish within the SLO,
taking requests oldest first while the batch stays within the budget. Admission control rejects a
request that cannot meet the SLO (it alone exceeds the budget, or its predicted queueing + service
time ends past its deadline) instead of queueing it past its deadline; the caller answers 503 +
Retry-After. `FixedBatchPolicy` is what Ray Serve's `@serve.batch` does plus the replica's bounded
queue: up to `max_batch_size` requests, dispatched when that many wait or the first has waited
`batch_wait_s`.

No Ray, no asyncio: the clock is injected (`time.monotonic` in production, a fake in tests), so the
same policies run inside the Serve app (platform/serve/scheduler.py drives one on the replica's event
loop) and in the in-process open-loop harness (workloads/serving/harness.py; the lent GPU machine has
no Ray). The service time of a batch is learned from finished batches (`record`) as a fixed overhead
plus a cost per token: a per-token rate alone, learned from the small batches of a quiet period,
would overstate a full batch's time many times over and turn every request away when load arrives.

The caller's loop: `admit` each arrival; whenever the worker is free, `next_batch()` (run it, then
`record` its time) or sleep `due_in()` seconds (None: until the next arrival); when an admitted
request is answered, `answered(its predicted latency, its observed latency)`. The SLO policy scales
its predictions by how late recent answers came against them (`LatencyCalibration`): in the Serve
replica under 3x overload, the event loop turning away hundreds of requests a second slowed the
decoder thread and delayed the dispatches between batches, none of which the service model sees, and
admitted requests missed a 200 ms SLO by up to 65% (server p99 288-328 ms, goodput 44% of capacity).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

POLICIES = ("slo", "fixed")


def request_tokens(beams: int, history_items: int, levels: int) -> int:
    """A request's work in tokens: its beams x its prompt (history items + the answer slot, `levels`
    tokens each). The Serve app's per-call limit (`max_batch_tokens`) counts the same way."""
    return beams * (history_items + 1) * levels


@dataclass(frozen=True)
class QueuedRequest:
    key: object  # the caller's handle (a future, a request record)
    arrival_s: float
    tokens: int  # prompt tokens x beams


@dataclass(frozen=True)
class Admission:
    admitted: bool
    reason: str = ""
    retry_after_s: float = 0.0  # rejected: when the queued work ahead should have drained
    predicted_s: float = 0.0  # admitted (slo): predicted latency from arrival to answer, at most,
    # before calibration (what `answered` compares the observed latency with)


class BatchPolicy(Protocol):
    """What the Serve scheduler and the harness drive (both policies below)."""

    def admit(self, key: object, tokens: int, arrival_s: float | None = None) -> Admission: ...

    def due_in(self) -> float | None: ...

    def next_batch(self) -> list[QueuedRequest]: ...

    def record(self, batch: list[QueuedRequest], seconds: float) -> None: ...

    def answered(self, predicted_s: float, latency_s: float) -> None: ...


# ---------------------------------------------------------------------------------- service model


class ServiceModel:
    """seconds(tokens) = overhead_s + s_per_token x tokens, fitted to finished batches by exponentially
    weighted least squares (weight `smoothing` for the newest batch) once their sizes spread enough
    to tell the two apart: a standard deviation of `min_spread` tokens (a tenth of the policy's budget;
    default a tenth of the mean size). Until then (a quiet period of one-request batches, or steady
    load when every batch is about a budget's size) it keeps the per-token cost it has (calibrated, or
    the initial guess) and moves the overhead, so it stays exact at the sizes it sees: a per-token
    rate fitted to a few small batches, extrapolated to a full budget, overstated a full batch's time
    five-fold in a test run and turned every request away."""

    def __init__(
        self, s_per_token: float, overhead_s: float, smoothing: float, min_spread: float = 0
    ) -> None:
        self.s_per_token, self.overhead_s, self.smoothing = s_per_token, overhead_s, smoothing
        self.min_spread = min_spread
        self.batches = 0
        self._m = (0.0, 0.0, 0.0, 0.0)  # weighted means of x, y, x^2, xy (x tokens, y seconds)

    def seconds(self, tokens: int) -> float:
        return self.overhead_s + self.s_per_token * tokens if tokens > 0 else 0.0

    def update(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        a = 1.0 if self.batches == 0 else self.smoothing
        sample = (tokens, seconds, tokens * tokens, tokens * seconds)
        self._m = tuple((1 - a) * m + a * s for m, s in zip(self._m, sample))
        self.batches += 1
        self._fit()

    def _fit(self) -> None:
        mx, my, mxx, mxy = self._m
        var = mxx - mx * mx
        if var > (self.min_spread or 0.1 * mx) ** 2:  # batch sizes spread enough: fit both
            slope = (mxy - mx * my) / var
            intercept = my - slope * mx
            if slope > 0 and intercept >= 0:
                self.s_per_token, self.overhead_s = slope, intercept
                return
        # about one size so far (or a noisy fit): keep the per-token cost, move the overhead
        intercept = my - self.s_per_token * mx
        if intercept >= 0:
            self.overhead_s = intercept
        else:  # the per-token cost alone overstates the batch: no overhead, the measured rate
            self.overhead_s, self.s_per_token = 0.0, my / mx


class LatencyCalibration:
    """How late answers come against their predictions: `factor()` is the `quantile` of observed /
    predicted latency over the last `window` answered requests, at least 1 (predictions are upper
    bounds by design; a factor below 1 would admit on the strength of a quiet period's slack) and at
    most `max_factor`; 1 until `min_samples` answers are in. Admission multiplies its prediction by it,
    so a request is admitted only if a prediction that late would still meet the SLO."""

    def __init__(self, window: int, quantile: float, min_samples: int = 20, max_factor: float = 4.0) -> None:
        self.ratios: deque[float] = deque(maxlen=window)
        self.quantile, self.min_samples, self.max_factor = quantile, min_samples, max_factor
        self._factor = 1.0  # recomputed per answer, not per admission: under overload admissions
        # outnumber answers several times over

    def observe(self, predicted_s: float, latency_s: float) -> None:
        if predicted_s > 0 and latency_s >= 0:
            self.ratios.append(latency_s / predicted_s)
            if len(self.ratios) >= self.min_samples:
                q = float(np.quantile(np.fromiter(self.ratios, float), self.quantile))
                self._factor = min(self.max_factor, max(1.0, q))

    def factor(self) -> float:
        return self._factor


def budget_for(service: ServiceModel, target_s: float) -> int:
    """The largest token budget whose batch is predicted to take at most `target_s` (at least 1)."""
    if service.s_per_token <= 0:
        raise ValueError("the service model has no per-token cost yet; measure some batches first")
    return max(1, math.floor((target_s - service.overhead_s) / service.s_per_token))


# ------------------------------------------------------------------------------------- SLO policy


@dataclass(frozen=True)
class ScheduleConfig:
    token_budget: int  # max sum(prompt tokens x beams) in one batch
    slo_s: float  # end-to-end latency objective of one request
    wait_share: float = 0.3  # share of the SLO a request may spend queued before it must dispatch
    initial_s_per_token: float = 1e-6  # service-time guess until a batch has been measured
    initial_overhead_s: float = 0.0  # fixed cost per batch, likewise
    smoothing: float = 0.2  # weight of the newest batch in the service-time estimate
    calibration_window: int = 200  # answered requests whose lateness calibrates admission
    calibration_quantile: float = 0.95  # of their observed / predicted latency

    def __post_init__(self) -> None:
        if self.token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {self.token_budget}")
        if not self.slo_s > 0:
            raise ValueError(f"slo_s must be > 0, got {self.slo_s}")
        if not 0 < self.wait_share < 1:
            raise ValueError(f"wait_share must be in (0, 1), got {self.wait_share}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing}")
        if self.initial_s_per_token < 0 or self.initial_overhead_s < 0:
            raise ValueError("initial_s_per_token and initial_overhead_s must be >= 0")
        if self.calibration_window < 1 or not 0 < self.calibration_quantile <= 1:
            raise ValueError("calibration_window must be >= 1 and calibration_quantile in (0, 1]")

    @property
    def wait_quota_s(self) -> float:
        return self.wait_share * self.slo_s


class SLOBatchPolicy:
    """Token-capacity batching with per-request SLO wait quotas and admission control."""

    def __init__(self, cfg: ScheduleConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg, self.clock = cfg, clock
        self.queue: deque[QueuedRequest] = deque()
        self.queued_tokens = 0
        self.service = ServiceModel(
            cfg.initial_s_per_token, cfg.initial_overhead_s, cfg.smoothing, 0.1 * cfg.token_budget
        )
        self.busy_until_s: float | None = None  # predicted end of the batch being decoded
        self.calibration = LatencyCalibration(cfg.calibration_window, cfg.calibration_quantile)

    def reconfigure(self, cfg: ScheduleConfig) -> None:
        """New budget / SLO / quota, live: the queue, the learned service times and the calibration
        stay (a new window or quantile starts the calibration afresh)."""
        old, self.cfg = self.cfg, cfg
        self.service.smoothing, self.service.min_spread = cfg.smoothing, 0.1 * cfg.token_budget
        window = (cfg.calibration_window, cfg.calibration_quantile)
        if window != (old.calibration_window, old.calibration_quantile):
            self.calibration = LatencyCalibration(cfg.calibration_window, cfg.calibration_quantile)

    @property
    def s_per_token(self) -> float:
        return self.service.s_per_token

    def service_s(self, tokens: int) -> float:
        """Estimated time to decode a batch of `tokens`."""
        return self.service.seconds(tokens)

    def budget(self) -> int:
        """The batch budget in force: the configured token capacity, capped so that a full batch is
        predicted to take at most (SLO - quota) / 2, leaving room for the quota or a running batch
        before it. When the machine slows down, batches shrink instead of every request being turned
        away (a request larger than the cap still runs, alone)."""
        cfg = self.cfg
        if self.service.s_per_token <= 0:
            return cfg.token_budget
        cap_s = (cfg.slo_s - cfg.wait_quota_s) / 2
        return max(1, min(cfg.token_budget, math.floor((cap_s - self.service.overhead_s) / self.s_per_token)))

    # --- admission ---------------------------------------------------------------------------------
    def predict_finish(self, new: QueuedRequest, now: float) -> tuple[float, float]:
        """(seconds from `now` until `new` is answered at the latest, seconds until the work queued
        before it has run). The queue packs into batches as `next_batch` forms them (oldest first: a
        later arrival never joins an earlier batch), which run back to back after the running one;
        the batch holding `new` starts then, or when its oldest request's quota runs out if it is not
        full, and later arrivals may grow it up to the budget, so its time is a full budget's. With an
        exact service model no admitted request can then miss the SLO (tests/test_xschedule.py)."""
        t = max(0.0, self.busy_until_s - now) if self.busy_until_s is not None else 0.0
        budget = self.budget()
        tokens, oldest = 0, new.arrival_s
        for r in self.queue:
            if tokens and tokens + r.tokens > budget:
                t += self.service_s(tokens)
                tokens = 0
            if tokens == 0:
                oldest = r.arrival_s
            tokens += r.tokens
        ahead = t + self.service_s(tokens)
        if tokens and tokens + new.tokens > budget:  # `new` starts a batch of its own
            t, tokens, oldest = ahead, 0, new.arrival_s
        tokens += new.tokens
        if tokens < budget:
            t = max(t, oldest + self.cfg.wait_quota_s - now)
        return t + self.service_s(max(budget, tokens)), ahead

    def admit(self, key: object, tokens: int, arrival_s: float | None = None) -> Admission:
        """Queue the request, or say why it cannot meet the SLO. `arrival_s` (default: now) is when it
        arrived, for a caller that admits late (the harness admits between decodes)."""
        now = self.clock()
        req = QueuedRequest(key, now if arrival_s is None else arrival_s, int(tokens))
        if req.tokens > self.cfg.token_budget:
            return Admission(
                False,
                f"{req.tokens} tokens (prompt x beams) exceed the batch budget of {self.cfg.token_budget}",
            )
        finish, ahead = self.predict_finish(req, now)
        waited = now - req.arrival_s
        # the lateness factor applies only behind other work: a request that would start on an idle
        # worker is what the server does best then, and turning it away would also stop the answers
        # the factor learns from (it could never come down again)
        late = self.calibration.factor() if ahead > 0 else 1.0
        if waited + late * finish > self.cfg.slo_s:
            lateness = f", x{late:.2f} for recent lateness" if late > 1 else ""
            return Admission(
                False,
                f"predicted latency {(waited + late * finish) * 1e3:.0f} ms (queued work "
                f"{late * ahead * 1e3:.0f} ms ahead{lateness}) is over the {self.cfg.slo_s * 1e3:g} ms SLO",
                late * ahead,
            )
        self.queue.append(req)
        self.queued_tokens += req.tokens
        return Admission(True, predicted_s=waited + finish)

    # --- dispatch ----------------------------------------------------------------------------------
    def due_in(self) -> float | None:
        """Seconds until the oldest request's quota runs out (0: dispatch now); None when idle."""
        if not self.queue:
            return None
        if self.queued_tokens >= self.budget():
            return 0.0
        return max(0.0, self.queue[0].arrival_s + self.cfg.wait_quota_s - self.clock())

    def next_batch(self) -> list[QueuedRequest]:
        """The batch to run now (oldest first, within the budget), or [] to keep waiting. The caller
        runs it at once: the policy counts it as running until `record`."""
        due = self.due_in()
        if due is None or due > 0:
            return []
        batch, tokens, budget = [], 0, self.budget()
        while self.queue and (not batch or tokens + self.queue[0].tokens <= budget):
            req = self.queue.popleft()
            batch.append(req)
            tokens += req.tokens
        self.queued_tokens -= tokens
        self.busy_until_s = self.clock() + self.service_s(tokens)
        return batch

    def record(self, batch: list[QueuedRequest], seconds: float) -> None:
        """A batch finished after `seconds`: learn its service time; the worker is free."""
        self.service.update(sum(r.tokens for r in batch), seconds)
        self.busy_until_s = None

    def answered(self, predicted_s: float, latency_s: float) -> None:
        """An admitted request (predicted `predicted_s`, as its Admission said) was answered after
        `latency_s` from its arrival, as the caller measures it (in the app: until its answer is ready
        to send, event-loop delays included)."""
        self.calibration.observe(predicted_s, latency_s)


# ----------------------------------------------------------------------------------- fixed policy


@dataclass(frozen=True)
class FixedConfig:
    max_batch_size: int  # requests per batch (1: no batching)
    batch_wait_s: float = 0.005  # longest wait for a batch to fill, from its first request
    max_queued: int = 64  # beyond max_batch_size: the replica's bound on waiting requests

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_queued < 0 or self.batch_wait_s < 0:
            raise ValueError(f"need max_batch_size >= 1, max_queued >= 0, batch_wait_s >= 0; got {self}")


class FixedBatchPolicy:
    """A fixed request count per batch (Serve's `@serve.batch`), and the app's bounded queue: at most
    max_queued + max_batch_size requests waiting or decoding, the rest rejected at once."""

    def __init__(self, cfg: FixedConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg, self.clock = cfg, clock
        self.queue: deque[QueuedRequest] = deque()
        self.running = 0

    def admit(self, key: object, tokens: int, arrival_s: float | None = None) -> Admission:
        bound = self.cfg.max_queued + self.cfg.max_batch_size
        if len(self.queue) + self.running >= bound:
            return Admission(False, f"overloaded: {bound} requests queued or decoding", 1.0)
        self.queue.append(QueuedRequest(key, self.clock() if arrival_s is None else arrival_s, int(tokens)))
        return Admission(True)

    def due_in(self) -> float | None:
        if not self.queue:
            return None
        if len(self.queue) >= self.cfg.max_batch_size:
            return 0.0
        return max(0.0, self.queue[0].arrival_s + self.cfg.batch_wait_s - self.clock())

    def next_batch(self) -> list[QueuedRequest]:
        due = self.due_in()
        if due is None or due > 0:
            return []
        n = min(len(self.queue), self.cfg.max_batch_size)
        batch = [self.queue.popleft() for _ in range(n)]
        self.running = n
        return batch

    def record(self, batch: list[QueuedRequest], seconds: float) -> None:
        self.running = 0

    def answered(self, predicted_s: float, latency_s: float) -> None:
        """Nothing to learn: the fixed policy makes no predictions."""
