"""In-process open-loop serving harness: a batching policy + a decoder, Poisson arrivals, no Ray.

    python -m genrec.platform.serve.harness --model DIR --decoder xgr --beam-width 32 \\
        --policy slo fixed --max-batch-size 4 16 --rates 5 10 20 40 --duration-s 20 --repeats 3 \\
        --out results.json
    python -m genrec.platform.serve.harness --model DIR --beam-width 32 \\
        --arm xgr/fixed-4 xgr/slo-w0.05-b0.2 hf_beam/fixed-1 hf_beam/slo-w0.3-b0.35 \\
        --rates 200 250 300 --decoder-rates hf_beam=2,4,8 --repeats 3 --out results.json

The same policy object the Serve app drives (workloads/serving/xschedule.py: `slo` = xSchedule's
token-capacity batching with SLO quotas and admission control, `fixed` = `@serve.batch` with the
replica's bounded queue) and the same decoder `decode` call, in one thread: arrivals are drawn up front
(Poisson, seeded), every request is admitted at its arrival time or, when it arrives during a decode,
right after that decode with its true arrival time (the latency clock starts at arrival either way),
and a free worker runs `next_batch()` or sleeps until the next arrival or due time. No HTTP, no event
loop: this is the policy and the decoder alone, which is what the lent GPU machine (no Ray) can run.

Per request: answered (latency = answer time - arrival), rejected (admission: 503 in the app) or
timed out (still queued after `request_timeout_s`, dropped before decoding as the app does). A rate
meets the SLO when the P99 latency of answered requests is within it and at most `max_unanswered`
(1 %) of the requests were rejected or timed out: the load generator's rule (platform/loadgen.py), so
a policy cannot pass by turning half the load away. Per arm (decoder x policy x batch size), rates are
tried in ascending order until one fails, then bisected `--refine` times; the result is the highest
rate that met the SLO with every lower one meeting it too. `--repeats` alternates the arms (rotated
order) so drift on a shared machine hits them alike; medians and min-max are reported.

The `slo` arm's token budget, unless given, is calibrated per decoder before the runs: batches of
1, 2, 4, ... requests are timed, a service model (overhead + per-token cost) is fitted, and the budget
is the token count predicted to take `budget_share` of the SLO. The same fit seeds the policy's
service model, which keeps learning from every batch.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

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

OUTCOMES = ("answered", "rejected", "timeout")
ServeBatch = Callable[[list[Any]], None]  # decodes a batch of payloads (blocking)


@dataclass(frozen=True)
class LoadSpec:
    """One open-loop load test."""

    rate: float  # requests per second (Poisson)
    duration_s: float  # arrivals are drawn on [0, duration)
    warmup_s: float = 2.0  # arrivals before this are served but not counted
    seed: int = 0
    slo_s: float = 0.2
    request_timeout_s: float = 10.0
    max_unanswered: float = 0.01


@dataclass
class Record:
    index: int
    arrival_s: float  # seconds from the start of the run
    tokens: int
    warmup: bool
    outcome: str = ""
    latency_s: float = math.nan
    queue_s: float = math.nan
    batch_size: int = 0
    predicted_s: float = 0.0  # the policy's prediction at admission (slo; 0 for fixed)


def poisson_arrivals(rate: float, duration_s: float, seed: int) -> np.ndarray:
    """Arrival times on [0, duration) of a Poisson process (exponential gaps with mean 1/rate)."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError("rate and duration_s must be > 0")
    rng = np.random.default_rng(seed)
    n = int(rate * duration_s + 6 * math.sqrt(rate * duration_s) + 16)
    times = np.cumsum(rng.exponential(1.0 / rate, size=n))
    while times[-1] < duration_s:  # a very unlikely short draw: extend it
        times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(1.0 / rate, size=n))])
    return times[times < duration_s]


# ------------------------------------------------------------------------------------------- run


class OpenLoop:
    """One worker serving a fixed arrival schedule through a policy (see `run_open_loop`)."""

    def __init__(self, policy: BatchPolicy, serve_batch: ServeBatch, requests, spec: LoadSpec, clock) -> None:
        self.policy, self.serve_batch, self.spec, self.clock = policy, serve_batch, spec, clock
        self.records = [Record(i, off, tok, off < spec.warmup_s) for i, (off, _, tok) in enumerate(requests)]
        self.payloads = [p for _, p, _ in requests]
        self.next = 0  # the first request not yet admitted
        self.t0 = clock()

    def admit_arrived(self, now: float) -> None:
        """Admit every request that has arrived by `now`, each with its own arrival time."""
        while self.next < len(self.records) and self.t0 + self.records[self.next].arrival_s <= now:
            rec = self.records[self.next]
            admission = self.policy.admit(rec, rec.tokens, arrival_s=self.t0 + rec.arrival_s)
            rec.predicted_s = admission.predicted_s
            if not admission.admitted:
                rec.outcome = "rejected"
            self.next += 1

    def run_batch(self, batch: list) -> None:
        """Decode one batch; requests already past their timeout are dropped first (as the app does).
        Requests that arrived meanwhile are admitted before the policy hears the batch has ended, so
        they see the queue and the running batch as the app's event loop would have at their arrival."""
        start = self.clock()
        live = []
        for q in batch:
            if start - (self.t0 + q.key.arrival_s) > self.spec.request_timeout_s:
                q.key.outcome = "timeout"
            else:
                live.append(q)
        if live:
            self.serve_batch([self.payloads[q.key.index] for q in live])
        end = self.clock()
        self.admit_arrived(end)
        self.policy.record(live, end - start)
        for q in live:
            rec = q.key
            rec.outcome, rec.batch_size = "answered", len(live)
            rec.latency_s = end - (self.t0 + rec.arrival_s)
            rec.queue_s = start - (self.t0 + rec.arrival_s)
            self.policy.answered(rec.predicted_s, rec.latency_s)

    def wait_s(self, now: float) -> float | None:
        """How long the free worker may sleep: until the next arrival or due time (None: all done)."""
        due = self.policy.due_in()
        upcoming = (
            self.t0 + self.records[self.next].arrival_s - now if self.next < len(self.records) else None
        )
        if due is None and upcoming is None:
            return None
        return min(w for w in (due, upcoming) if w is not None)


def run_open_loop(
    policy: BatchPolicy,
    serve_batch: ServeBatch,
    requests: Sequence[tuple[float, Any, int]],
    spec: LoadSpec,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Record]:
    """Serve `requests` ((arrival offset s, payload, tokens), ascending) with one worker; returns one
    Record per request, each with its outcome. The policy must use the same `clock`."""
    run = OpenLoop(policy, serve_batch, requests, spec, clock)
    while True:
        now = clock()
        run.admit_arrived(now)
        batch = policy.next_batch()
        if batch:
            run.run_batch(batch)
            continue
        wait = run.wait_s(now)
        if wait is None:
            return run.records
        if wait > 0:
            sleep(wait)


def summarize(records: Sequence[Record], spec: LoadSpec) -> dict:
    """Latency percentiles of answered requests, goodput and the SLO verdict, over the measured part."""
    measured = [r for r in records if not r.warmup]
    missing = [r.index for r in records if r.outcome not in OUTCOMES]
    if missing:
        raise AssertionError(f"requests without an outcome: {missing[:10]}")
    n = len(measured)
    by = {o: sum(r.outcome == o for r in measured) for o in OUTCOMES}
    answered = [r for r in measured if r.outcome == "answered"]
    lat = np.array([r.latency_s for r in answered]) * 1e3
    end = max([r.arrival_s + r.latency_s for r in answered] + [spec.duration_s])
    window = max(end - spec.warmup_s, 1e-9)
    pct = {f"p{q}_ms": float(np.percentile(lat, q)) if len(lat) else math.nan for q in (50, 90, 99)}
    unanswered = (by["rejected"] + by["timeout"]) / n if n else math.nan
    slo_ms = spec.slo_s * 1e3
    return {
        "rate": spec.rate,
        "sent": n,
        **by,
        **pct,
        "mean_ms": float(lat.mean()) if len(lat) else math.nan,
        "queue_p50_ms": float(np.median([r.queue_s for r in answered]) * 1e3) if answered else math.nan,
        "batch_size_mean": float(np.mean([r.batch_size for r in answered])) if answered else math.nan,
        "offered_rps": n / max(spec.duration_s - spec.warmup_s, 1e-9),
        "throughput_rps": len(answered) / window,
        "goodput_rps": float((lat <= slo_ms).sum()) / window,
        "rejection_rate": by["rejected"] / n if n else math.nan,
        "unanswered_rate": unanswered,
        "slo_met": bool(n and len(lat) and pct["p99_ms"] <= slo_ms and unanswered <= spec.max_unanswered),
    }


def nice(rate: float) -> float:
    """3 significant digits, so bisected rates read well."""
    return round(rate, 2 - int(math.floor(math.log10(rate)))) if rate > 0 else rate


@dataclass
class Search:
    """One arm's rate search: the highest rate meeting the SLO lies in [lo, hi)."""

    points: list[dict] = field(default_factory=list)
    lo: float | None = None  # highest rate that met the SLO (every lower tried rate met it too)
    hi: float | None = None  # lowest rate that failed it

    def add(self, point: dict) -> None:
        self.points.append(point)
        if point["slo_met"]:
            self.lo = max(self.lo or 0.0, point["rate"])
        else:
            self.hi = min(self.hi or math.inf, point["rate"])

    def midpoint(self) -> float | None:
        """The next rate to bisect at, or None (no pass and fail to bisect between, or they touch)."""
        if self.lo is None or self.hi is None:
            return None
        mid = nice((self.lo + self.hi) / 2)
        return mid if self.lo < mid < self.hi else None


def interleaved_search(
    labels: Sequence[str],
    measure: Callable[[str, float], dict],
    rates: Sequence[float] | Mapping[str, Sequence[float]],
    refine: int,
) -> dict[str, Search]:
    """Every arm's rate search, interleaved one load test at a time so drift on a shared machine hits
    all arms alike: its rates in ascending order (`rates`, or `rates[label]`; an arm drops out at its
    first failure), then `refine` rounds of bisection between each arm's last pass and first failure."""
    searches = {label: Search() for label in labels}
    own = {label: sorted(set(rates[label] if isinstance(rates, Mapping) else rates)) for label in labels}
    for i in range(max(len(r) for r in own.values())):
        for label in labels:
            if searches[label].hi is None and i < len(own[label]):
                searches[label].add(measure(label, own[label][i]))
    for _ in range(refine):
        for label in labels:
            mid = searches[label].midpoint()
            if mid is not None:
                searches[label].add(measure(label, mid))
    return searches


# ------------------------------------------------------------------------------------------ arms


@dataclass(frozen=True)
class Options:
    """What every arm shares."""

    beam_width: int = 32
    k: int = 10
    slo_ms: float = 200.0
    batch_wait_ms: float = 5.0  # fixed: Serve's batch_wait_timeout_s
    max_queued: int = 64  # fixed: the replica's queue bound beyond one batch
    duration_s: float = 20.0
    warmup_s: float = 2.0
    request_timeout_s: float = 10.0
    max_unanswered: float = 0.01
    seed: int = 0


@dataclass(frozen=True)
class Arm:
    decoder: str
    policy: str  # slo | fixed
    max_batch_size: int = 16  # fixed: requests per batch
    token_budget: int = 0  # slo: tokens per batch; 0: calibrated to budget_share of the SLO
    wait_share: float = 0.3  # slo: the wait quota as a share of the SLO
    budget_share: float = 0.35  # slo: a calibrated budget's predicted batch time, as a share of the SLO

    @property
    def label(self) -> str:
        if self.policy == "fixed":
            return f"{self.decoder}/fixed-{self.max_batch_size}"
        budget = f"t{self.token_budget}" if self.token_budget else f"b{self.budget_share:g}"
        return f"{self.decoder}/slo-w{self.wait_share:g}-{budget}"

    @classmethod
    def parse(cls, label: str) -> Arm:
        """The arm a label names: DECODER/fixed-N, DECODER/slo[-wSHARE][-bSHARE | -tTOKENS]."""
        if m := re.fullmatch(r"([\w-]+)/fixed-(\d+)", label):
            return cls(m[1], "fixed", max_batch_size=int(m[2]))
        if m := re.fullmatch(r"([\w-]+)/slo(?:-w([\d.]+))?(?:-b([\d.]+)|-t(\d+))?", label):
            shares = {
                "wait_share": float(m[2] or cls.wait_share),
                "budget_share": float(m[3] or cls.budget_share),
            }
            return cls(m[1], "slo", token_budget=int(m[4] or 0), **shares)
        raise ValueError(
            f"arm {label!r}: write DECODER/fixed-N or DECODER/slo[-wSHARE][-bSHARE|-tTOKENS], "
            "e.g. xgr/fixed-4 or xgr/slo-w0.3-b0.35"
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
    arm: Arm, rate: float, serve_batch: ServeBatch, pool, opts: Options, cal: Calibration | None
) -> dict:
    """One open-loop load test of one arm at one rate: its summary."""
    spec = LoadSpec(
        rate, opts.duration_s, opts.warmup_s, opts.seed, opts.slo_ms / 1e3,
        opts.request_timeout_s, opts.max_unanswered,
    )  # fmt: skip
    arrivals = poisson_arrivals(rate, opts.duration_s, opts.seed)
    pick = np.random.default_rng(opts.seed + 1).integers(0, len(pool), size=len(arrivals))
    requests = [(float(t), pool[i][0], pool[i][1]) for t, i in zip(arrivals, pick)]
    policy = make_policy(arm, opts, cal, time.perf_counter)
    summary = summarize(run_open_loop(policy, serve_batch, requests, spec), spec)
    summary["load_1m"] = os.getloadavg()[0]  # other jobs on a shared machine skew a point: keep it
    return summary


def format_point(label: str, s: dict) -> str:
    verdict = "ok" if s["slo_met"] else "FAIL"
    return (
        f"{label:>24} rate {s['rate']:>7g}: p50 {s['p50_ms']:7.1f}  p99 {s['p99_ms']:7.1f} ms  "
        f"goodput {s['goodput_rps']:7.1f}/s  rejected {100 * s['rejection_rate']:5.1f}%  "
        f"timeouts {s['timeout']}  batch {s['batch_size_mean']:5.1f}  {verdict}"
    )


def aggregate(searches: list[Search], token_budget: int) -> dict:
    """Medians and spread of one arm's repeats (a repeat with no passing rate counts as 0)."""
    best = [s.lo or 0.0 for s in searches]
    at_best = [next((p for p in s.points if p["rate"] == s.lo), None) for s in searches]
    p99 = [p["p99_ms"] for p in at_best if p]
    return {
        "best_rates": best,
        "best_rate_median": statistics.median(best),
        "best_rate_min": min(best),
        "best_rate_max": max(best),
        "p99_ms_at_best_median": statistics.median(p99) if p99 else math.nan,
        "hit_limit": any(s.hi is None for s in searches),
        "token_budget": token_budget,
        "repeats": [{"points": s.points, "best_rate": s.lo, "hit_limit": s.hi is None} for s in searches],
    }


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


def run_arms(
    ctx,
    histories,
    arms: Sequence[Arm],
    opts: Options,
    rates: Sequence[float] | Mapping[str, Sequence[float]],
    refine: int,
    repeats: int,
    progress=None,
) -> dict:
    """Every arm's rate search, interleaved, `repeats` times with the arm order rotated; `rates` may
    differ per decoder ({decoder: rates}). The decoders of slo arms are calibrated once first, and
    every decoder is warmed up."""
    fns = {
        d: decode_batch_fn(ctx, d, opts.beam_width, opts.k) for d in dict.fromkeys(a.decoder for a in arms)
    }
    pool = request_pool(ctx, histories, opts.beam_width)
    slo_decoders = {a.decoder for a in arms if a.policy == "slo" and not a.token_budget}
    cals = {d: calibrate(fns[d], pool, opts.slo_ms / 1e3) for d in fns if d in slo_decoders}
    for fn in fns.values():  # allocator, HF copy, buffer pools of a few batch shapes
        for n in (1, 4, 16):
            fn([pool[i % len(pool)][0] for i in range(n)])
    by_label = {a.label: a for a in arms}

    def measure(label: str, rate: float) -> dict:
        arm = by_label[label]
        point = load_test(arm, rate, fns[arm.decoder], pool, opts, cals.get(arm.decoder))
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


# ------------------------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None, prog: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint folder (genrec train --out)")
    p.add_argument("--data", default=None, help="dataset folder (default: the checkpoint's)")
    p.add_argument("--decoder", nargs="+", default=["xgr"], help="one or more decoders (arms)")
    p.add_argument("--policy", nargs="+", default=["slo"], choices=POLICIES)
    p.add_argument("--max-batch-size", type=int, nargs="+", default=[16], help="fixed: one arm each")
    p.add_argument("--token-budget", type=int, nargs="+", default=[0], help="slo: 0 = calibrated")
    p.add_argument("--wait-share", type=float, nargs="+", default=[0.3], help="slo: quota / SLO")
    p.add_argument("--budget-share", type=float, nargs="+", default=[0.35], help="slo: batch time / SLO")
    p.add_argument(
        "--arm",
        nargs="+",
        default=None,
        help="explicit arms instead of the decoder x policy product: DECODER/fixed-N, "
        "DECODER/slo-wSHARE-bSHARE or DECODER/slo-wSHARE-tTOKENS (e.g. xgr/fixed-4 hf_beam/slo-w0.3-b0.35)",
    )
    p.add_argument("--rates", type=float, nargs="+", default=[5, 10, 20, 40, 80])
    p.add_argument(
        "--decoder-rates",
        nargs="+",
        default=[],
        metavar="DECODER=R1,R2,...",
        help="rates for one decoder's arms instead of --rates (e.g. hf_beam=2,4,8 xgr=100,200,300)",
    )
    p.add_argument("--refine", type=int, default=2, help="bisection steps after the first failing rate")
    p.add_argument("--repeats", type=int, default=1, help="alternate the arms this many times")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: leave as is)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    for name, default in asdict(Options()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def arms_of(a: argparse.Namespace) -> list[Arm]:
    """--arm as given, else decoder x policy: each fixed arm once per --max-batch-size, each slo arm
    once per budget and share (a given --token-budget makes --budget-share moot)."""
    if a.arm:
        return list(dict.fromkeys(Arm.parse(label) for label in a.arm))
    arms = []
    for decoder in a.decoder:
        if "fixed" in a.policy:
            arms += [Arm(decoder, "fixed", max_batch_size=n) for n in a.max_batch_size]
        if "slo" in a.policy:
            for budget in a.token_budget:
                shares = a.budget_share if not budget else [Arm.budget_share]
                arms += [
                    Arm(decoder, "slo", token_budget=budget, wait_share=w, budget_share=b)
                    for w in a.wait_share
                    for b in shares
                ]
    return list(dict.fromkeys(arms))


def rates_of(a: argparse.Namespace, arms: Sequence[Arm]) -> Sequence[float] | dict[str, list[float]]:
    """--rates, or {decoder: rates} when --decoder-rates gives some decoders their own."""
    if not a.decoder_rates:
        return a.rates
    own = {}
    for spec in a.decoder_rates:
        decoder, _, values = spec.partition("=")
        try:
            own[decoder] = [float(v) for v in values.split(",") if v]
        except ValueError:
            own[decoder] = []
        if not own[decoder] or min(own[decoder]) <= 0:
            raise ValueError(f"--decoder-rates {spec!r}: write DECODER=R1,R2,... with positive rates")
    return {arm.decoder: own.get(arm.decoder, a.rates) for arm in arms}


def format_table(result: dict) -> str:
    lines = [f"{'arm':>24}  {'best rate (median)':>18}  {'min-max':>13}  {'p99 at best':>11}  budget"]
    for label, r in result["arms"].items():
        more = "+" if r["hit_limit"] else ""
        lines.append(
            f"{label:>24}  {r['best_rate_median']:>17g}{more:1}  "
            f"{r['best_rate_min']:>6g}-{r['best_rate_max']:<6g}  {r['p99_ms_at_best_median']:>8.1f} ms  "
            f"{r['token_budget'] or '-'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "python -m genrec.workloads.serving.harness") -> int:
    import json

    import torch

    from genrec.workloads.errors import UserInputError
    from genrec.workloads.evaluation import load_context
    from genrec.workloads.io import atomic_write_text
    from genrec.workloads.results import current_environment

    a = parse_args(argv, prog)
    if a.threads:
        torch.set_num_threads(a.threads)
    opts = Options(**{name: getattr(a, name) for name in asdict(Options())})
    try:
        ctx, ds, _ = load_context(a.model, a.data, a.device)
        histories = [ex.history for ex in ds.eval_examples("test")]
        load_before = os.getloadavg()
        arms = arms_of(a)
        result = run_arms(
            ctx, histories, arms, opts, rates_of(a, arms), a.refine, a.repeats, lambda m: print(m, flush=True)
        )
    except (UserInputError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result.update(
        command=f"{prog} " + " ".join(sys.argv[1:] if argv is None else argv),
        options=asdict(opts),
        model=str(a.model),
        dataset=str(ds.root),
        env=asdict(current_environment(ctx.device)),
        load_avg_before=list(load_before),
        load_avg_after=list(os.getloadavg()),
    )
    print(format_table(result))
    if a.out:
        atomic_write_text(a.out, json.dumps(result, indent=2, default=float) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
