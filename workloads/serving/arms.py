"""The arms the serving harness compares (decoder x batching policy x batch size or token budget), and
running them on a loaded model.

`Arm` names one arm (`xgr/fixed-4`, `xgr/slo-w0.3-b0.35`, ...) and `Options` what all arms share.
`make_policy` builds an arm's policy (workloads/serving/xschedule.py: `slo` = xSchedule's
token-capacity batching with SLO quotas and admission control, `fixed` = `@serve.batch` with the
replica's bounded queue). An `slo` arm's token budget, unless given, comes from `calibrate`: batches of
1, 2, 4, ... requests are timed, a service model (overhead + per-token cost) is fitted, and the budget
is the token count predicted to take `budget_share` of the SLO; the same fit seeds the policy's service
model, which keeps learning from every batch.

`load_test` is one arm at one rate (workloads/serving/open_loop.py); `run_arms` runs every arm's rate
search (workloads/serving/rate_search.py) `repeats` times with the arm order rotated, calling the
decoder's `decode` as the Serve app's DecoderHost does (`decode_batch_fn`).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from genrec.workloads.serving.open_loop import (
    LoadSpec,
    ServeBatch,
    poisson_arrivals,
    run_open_loop,
    summarize,
)
from genrec.workloads.serving.rate_search import Search, aggregate, interleaved_search
from genrec.workloads.serving.replicas import DecoderFactory, ReplicaPool, ReplicaSetup, load_decoders
from genrec.workloads.serving.slo import DEFAULT_MAX_UNANSWERED, DEFAULT_SLO_MS
from genrec.workloads.serving.xschedule import (
    POLICIES,
    BatchPolicy,
    FixedBatchPolicy,
    FixedConfig,
    ScheduleConfig,
    ServiceModel,
    SLOBatchPolicy,
    budget_for,
    request_tokens,
)


@dataclass(frozen=True)
class Options:
    """What every arm shares."""

    beam_width: int = 32
    k: int = 10
    slo_ms: float = DEFAULT_SLO_MS
    batch_wait_ms: float = 5.0  # fixed: Serve's batch_wait_timeout_s
    max_queued: int = 64  # fixed: the replica's queue bound beyond one batch
    duration_s: float = 20.0
    warmup_s: float = 2.0
    request_timeout_s: float = 10.0
    max_unanswered: float = DEFAULT_MAX_UNANSWERED
    seed: int = 0


@dataclass(frozen=True)
class Arm:
    decoder: str
    policy: str  # slo | fixed
    max_batch_size: int = 16  # fixed: requests per batch
    token_budget: int = 0  # slo: tokens per batch; 0: calibrated to budget_share of the SLO
    wait_share: float = 0.3  # slo: the wait quota as a share of the SLO
    budget_share: float = 0.35  # slo: a calibrated budget's predicted batch time, as a share of the SLO
    replicas: int = 1  # decoder processes, each with its own policy (workloads/serving/replicas.py)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"an arm needs at least one replica, got {self.replicas}")

    @property
    def label(self) -> str:
        if self.policy == "fixed":
            base = f"{self.decoder}/fixed-{self.max_batch_size}"
        else:
            budget = f"t{self.token_budget}" if self.token_budget else f"b{self.budget_share:g}"
            base = f"{self.decoder}/slo-w{self.wait_share:g}-{budget}"
        return base if self.replicas == 1 else f"{base}-r{self.replicas}"

    @classmethod
    def parse(cls, label: str) -> Arm:
        """The arm a label names: DECODER/fixed-N or DECODER/slo[-wSHARE][-bSHARE | -tTOKENS], either
        followed by -rREPLICAS when more than one replica serves it."""
        base, replicas = label, 1
        if m := re.fullmatch(r"(.+)-r(\d+)", label):
            base, replicas = m[1], int(m[2])
        if m := re.fullmatch(r"([\w-]+)/fixed-(\d+)", base):
            return cls(m[1], "fixed", max_batch_size=int(m[2]), replicas=replicas)
        if m := re.fullmatch(r"([\w-]+)/slo(?:-w([\d.]+))?(?:-b([\d.]+)|-t(\d+))?", base):
            shares = {
                "wait_share": float(m[2] or cls.wait_share),
                "budget_share": float(m[3] or cls.budget_share),
            }
            return cls(m[1], "slo", token_budget=int(m[4] or 0), replicas=replicas, **shares)
        raise ValueError(
            f"arm {label!r}: write DECODER/fixed-N or DECODER/slo[-wSHARE][-bSHARE|-tTOKENS], optionally "
            "followed by -rREPLICAS, e.g. xgr/fixed-4, xgr/slo-w0.3-b0.35 or xgr/fixed-8-r2"
        )


@dataclass
class Calibration:
    overhead_s: float
    s_per_token: float
    largest_request: int  # tokens: a budget below it would turn such requests away for good
    points: list[tuple[int, int, float]] = field(default_factory=list)  # (requests, tokens, seconds)

    def budget(self, target_s: float) -> int:
        """Tokens predicted to take `target_s`, and at least the largest request."""
        model = ServiceModel(self.s_per_token, self.overhead_s, 1.0)
        return max(budget_for(model, target_s), self.largest_request)


def arm_budget(arm: Arm, opts: Options, cal: Calibration | None) -> int:
    if arm.policy != "slo":
        return 0
    if arm.token_budget:
        return arm.token_budget
    if cal is None:
        raise ValueError(f"{arm.label}: an slo arm needs a token budget or a calibration")
    return cal.budget(arm.budget_share * opts.slo_ms / 1e3)


def make_policy(arm: Arm, opts: Options, cal: Calibration | None, clock) -> BatchPolicy:
    if arm.policy == "fixed":
        return FixedBatchPolicy(
            FixedConfig(arm.max_batch_size, opts.batch_wait_ms / 1e3, opts.max_queued), clock
        )
    if arm.policy != "slo":
        raise ValueError(f"policy must be one of {list(POLICIES)}, got {arm.policy!r}")
    seed = dict(initial_s_per_token=cal.s_per_token, initial_overhead_s=cal.overhead_s) if cal else {}
    cfg = ScheduleConfig(arm_budget(arm, opts, cal), opts.slo_ms / 1e3, arm.wait_share, **seed)
    return SLOBatchPolicy(cfg, clock)


def calibrate(
    serve_batch: ServeBatch, pool: Sequence[tuple[Any, int]], slo_s: float, max_requests: int = 64
) -> Calibration:
    """Time batches of 1, 2, 4, ... requests (twice each, after one untimed run) until one takes more
    than the SLO, and fit overhead + per-token cost by least squares."""
    points = []
    n = 1
    while n <= max_requests:
        batch = [pool[i % len(pool)] for i in range(n)]
        serve_batch([p for p, _ in batch])
        tokens = sum(t for _, t in batch)
        for _ in range(2):
            t0 = time.perf_counter()
            serve_batch([p for p, _ in batch])
            points.append((n, tokens, time.perf_counter() - t0))
        if points[-1][2] > slo_s:
            break
        n *= 2
    x = np.array([t for _, t, _ in points], dtype=np.float64)
    y = np.array([s for _, _, s in points])
    slope, intercept = np.polyfit(x, y, 1) if len(set(x)) > 1 else (y.mean() / x.mean(), 0.0)
    if slope <= 0 or intercept < 0:  # noise on a flat curve: no overhead, the mean rate
        slope, intercept = y.mean() / x.mean(), 0.0
    return Calibration(float(intercept), float(slope), max(t for _, t in pool), points)


def load_test(
    arm: Arm,
    rate: float,
    serve_batch: ServeBatch,
    pool,
    opts: Options,
    cal: Calibration | None,
    replicas: ReplicaPool | None = None,
) -> dict:
    """One open-loop load test of one arm at one rate: its summary. An arm with more than one replica
    runs on `replicas` (worker processes), the others in this process."""
    spec = LoadSpec(
        rate, opts.duration_s, opts.warmup_s, opts.seed, opts.slo_ms / 1e3,
        opts.request_timeout_s, opts.max_unanswered,
    )  # fmt: skip
    arrivals = poisson_arrivals(rate, opts.duration_s, opts.seed)
    pick = np.random.default_rng(opts.seed + 1).integers(0, len(pool), size=len(arrivals))
    requests = [(float(t), pool[i][0], pool[i][1]) for t, i in zip(arrivals, pick)]
    if arm.replicas > 1:
        if replicas is None:
            raise ValueError(f"{arm.label}: an arm with {arm.replicas} replicas needs a ReplicaPool")
        records = replicas.run(arm, opts, cal, requests, spec)
    else:
        records = run_open_loop(make_policy(arm, opts, cal, time.perf_counter), serve_batch, requests, spec)
    summary = summarize(records, spec)
    summary["replicas"] = arm.replicas
    summary["load_1m"] = os.getloadavg()[0]  # other jobs on a shared machine skew a point: keep it
    return summary


def format_point(label: str, s: dict) -> str:
    verdict = "ok" if s["slo_met"] else "FAIL"
    return (
        f"{label:>24} rate {s['rate']:>7g}: p50 {s['p50_ms']:7.1f}  p99 {s['p99_ms']:7.1f} ms  "
        f"goodput {s['goodput_rps']:7.1f}/s  rejected {100 * s['rejection_rate']:5.1f}%  "
        f"timeouts {s['timeout']}  batch {s['batch_size_mean']:5.1f}  {verdict}"
    )


# ------------------------------------------------------------------------------------- the model


def request_pool(ctx, histories: Sequence[Sequence[int]], beam_width: int) -> list[tuple[list[int], int]]:
    """(history, tokens) per request: the history as the model reads it (its last max_items items)."""
    levels, window = ctx.codec.levels, int(ctx.max_items)
    return [
        (list(h)[-window:], request_tokens(beam_width, min(len(h), window), levels)) for h in histories if h
    ]


def decode_batch_fn(ctx, decoder: str, beam_width: int, k: int) -> ServeBatch:
    """The decoder's `decode` on a batch of histories, as the Serve app's DecoderHost calls it (inference
    mode, results brought to the host)."""
    import torch

    from genrec.workloads.decoding.base import get_decoder, make_params

    dec = get_decoder(decoder)
    params = make_params(dec, {"beam_width": beam_width, "k": k})

    def serve_batch(histories: list[list[int]]) -> None:
        with torch.inference_mode():
            res = dec.decode(ctx, histories, params)
        res.item_ids.cpu(), res.scores.cpu()  # the answer leaves the device, as in the app

    return serve_batch


def warm_up(fns, pool: Sequence[tuple[Any, int]]) -> None:
    """One batch of 1, 4 and 16 requests per decoder: the allocator, HF's copies and the buffer pools
    of a few batch shapes are ready before anything is timed (here and in every replica process)."""
    for fn in fns:
        for n in (1, 4, 16):
            fn([pool[i % len(pool)][0] for i in range(n)])


def run_arms(
    ctx,
    histories,
    arms: Sequence[Arm],
    opts: Options,
    rates: Sequence[float] | Mapping[str, Sequence[float]],
    refine: int,
    repeats: int,
    progress=None,
    replicas: ReplicaPool | None = None,
) -> dict:
    """Every arm's rate search, interleaved, `repeats` times with the arm order rotated; `rates` may
    differ per decoder ({decoder: rates}). The decoders of slo arms are calibrated once first (in this
    process, one replica: every replica's policy starts from that fit), and every decoder is warmed up.
    Arms with more than one replica run on `replicas` (`open_replicas`)."""
    fns = {
        d: decode_batch_fn(ctx, d, opts.beam_width, opts.k) for d in dict.fromkeys(a.decoder for a in arms)
    }
    pool = request_pool(ctx, histories, opts.beam_width)
    slo_decoders = {a.decoder for a in arms if a.policy == "slo" and not a.token_budget}
    cals = {d: calibrate(fns[d], pool, opts.slo_ms / 1e3) for d in fns if d in slo_decoders}
    warm_up(fns.values(), pool)
    by_label = {a.label: a for a in arms}

    def measure(label: str, rate: float) -> dict:
        arm = by_label[label]
        point = load_test(arm, rate, fns[arm.decoder], pool, opts, cals.get(arm.decoder), replicas)
        if progress:
            progress(format_point(label, point))
        return point

    runs: dict[str, list[Search]] = {label: [] for label in by_label}
    for rep in range(repeats):
        shift = rep % len(arms)
        order = [a.label for a in [*arms[shift:], *arms[:shift]]]
        own = {a.label: rates[a.decoder] for a in arms} if isinstance(rates, Mapping) else rates
        for label, search in interleaved_search(order, measure, own, refine).items():
            runs[label].append(search)
    return {
        "arms": {
            label: aggregate(runs[label], arm_budget(arm, opts, cals.get(arm.decoder)))
            for label, arm in by_label.items()
        },
        "calibration": {d: asdict(c) for d, c in cals.items()},
    }


def open_replicas(arms: Sequence[Arm], setup: ReplicaSetup, factory: DecoderFactory = load_decoders):
    """A context manager giving the ReplicaPool the arms need (as many processes as the largest arm's
    replica count), or None when every arm has one replica and runs in this process."""
    size = max((a.replicas for a in arms), default=1)
    if size == 1:
        return contextlib.nullcontext(None)
    return ReplicaPool(setup, size, factory)
