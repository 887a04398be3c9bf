"""xSchedule's batching policies with a fake clock: never over the token budget, never holding a
request past its wait quota, admission by the SLO (no admitted request misses it when the service
model is exact), the service model itself, and the fixed-size batcher it is compared with."""

import math
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.serving.xschedule import (
    FixedBatchPolicy,
    FixedConfig,
    LatencyCalibration,
    ScheduleConfig,
    ServiceModel,
    SLOBatchPolicy,
    budget_for,
    request_tokens,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drain(policy) -> list[list]:
    out = []
    while batch := policy.next_batch():
        out.append(batch)
    return out


arrivals = st.lists(
    st.tuples(st.floats(0, 0.05), st.integers(1, 40), st.sampled_from([1, 4, 16, 32])),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(events=arrivals, budget=st.integers(64, 2048), slo=st.floats(0.05, 1.0), share=st.floats(0.05, 0.9))
def test_never_over_budget_and_never_past_the_quota(events, budget, slo, share):
    clock = FakeClock()
    cfg = ScheduleConfig(token_budget=budget, slo_s=slo, wait_share=share, initial_s_per_token=1e-9)
    policy = SLOBatchPolicy(cfg, clock)
    dispatched = []
    for gap, prompt, beams in events:
        # the serving loop wakes at arrivals and when the oldest request falls due
        target = clock.now + gap
        while (due := policy.due_in()) is not None and clock.now + due <= target:
            clock.now += due
            dispatched += [(clock.now, b) for b in drain(policy)]
        clock.now = target
        policy.admit(object(), prompt * beams)
        dispatched += [(clock.now, b) for b in drain(policy)]
        # invariant: after the loop ran, nobody still queued has waited past its quota
        assert all(clock.now - r.arrival_s < cfg.wait_quota_s + 1e-12 for r in policy.queue)
    for t, batch in dispatched:
        assert sum(r.tokens for r in batch) <= budget
        assert all(t - r.arrival_s <= cfg.wait_quota_s + 1e-9 for r in batch)
    order = [r.arrival_s for _, b in dispatched for r in b]
    assert order == sorted(order)  # oldest first


def simulate(policy, clock: FakeClock, events, service, unmodelled_s: float = 0.0) -> tuple[dict, list]:
    """One worker driven like the Serve scheduler and the harness: arrivals are admitted when they
    come; a free worker runs `next_batch()` (taking `service(tokens)` seconds, plus `unmodelled_s`
    that the policy never hears of, like the app's event-loop delays) or sleeps until the next
    arrival or due time; every answer is reported (`answered`). Returns ({key: (arrival,
    answered_at)}, rejected keys)."""
    pending = deque(events)  # (arrival time, tokens), ascending
    done, rejected, arrived, predicted = {}, [], {}, {}
    running, free_at, key = [], 0.0, 0
    while True:
        if running and clock.now >= free_at:
            policy.record(running, service(sum(r.tokens for r in running)))
            done.update({r.key: (arrived[r.key], free_at) for r in running})
            for r in running:
                policy.answered(predicted[r.key], free_at - arrived[r.key])
            running = []
        if not running and (batch := policy.next_batch()):
            running = batch
            free_at = clock.now + service(sum(r.tokens for r in batch)) + unmodelled_s
            continue
        due = policy.due_in() if not running else None
        wake = min(
            pending[0][0] if pending else math.inf,
            free_at if running else math.inf,
            clock.now + due if due is not None else math.inf,
        )
        if wake == math.inf:
            return done, rejected
        clock.now = max(clock.now, wake)
        while pending and pending[0][0] <= clock.now:
            t, tokens = pending.popleft()
            key += 1
            arrived[key] = t
            admission = policy.admit(key, tokens, arrival_s=t)
            predicted[key] = admission.predicted_s
            if not admission.admitted:
                rejected.append(key)


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(0, 0.02), min_size=1, max_size=80),
    tokens=st.lists(st.integers(1, 400), min_size=80, max_size=80),
    budget=st.integers(400, 4000),
    slo=st.floats(0.05, 0.5),
    share=st.floats(0.05, 0.6),
    overhead=st.floats(0, 0.01),
    per_token=st.floats(1e-6, 2e-5),
)
def test_no_admitted_request_misses_the_slo_with_an_exact_service_model(
    gaps, tokens, budget, slo, share, overhead, per_token
):
    clock = FakeClock()
    cfg = ScheduleConfig(
        budget, slo, share, initial_s_per_token=per_token, initial_overhead_s=overhead, smoothing=0.5
    )
    policy = SLOBatchPolicy(cfg, clock)
    times = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    done, rejected = simulate(policy, clock, list(zip(times, tokens)), lambda n: overhead + per_token * n)
    assert len(done) + len(rejected) == len(gaps)  # every request answered or rejected, none lost
    late = {k: end - start for k, (start, end) in done.items() if end - start > slo * (1 + 1e-6) + 1e-9}
    assert not late, f"admitted requests past the {slo} s SLO: {late}"


def test_overload_is_rejected_and_what_is_admitted_meets_the_slo():
    clock = FakeClock()
    cfg = ScheduleConfig(1000, 0.2, 0.3, initial_s_per_token=1e-4, initial_overhead_s=0.01)
    policy = SLOBatchPolicy(cfg, clock)
    # 500 tokens every 10 ms: 50k tokens/s offered, the worker does ~9k tokens/s
    events = [(0.01 * i, 500) for i in range(200)]
    done, rejected = simulate(policy, clock, events, lambda n: 0.01 + 1e-4 * n)
    assert len(rejected) > 100 and len(done) > 20
    assert max(end - start for start, end in done.values()) <= 0.2 + 1e-9


@pytest.mark.parametrize("calibrated", [True, False])
def test_lateness_the_service_model_cannot_see_is_learned_from_answers(calibrated):
    # every batch ends 30 ms after the service model says (the app: the event loop's delays, under
    # overload); without the lateness factor a quarter of the admitted requests miss the SLO
    clock = FakeClock()
    cfg = ScheduleConfig(1000, 0.2, 0.3, initial_s_per_token=1e-4, initial_overhead_s=0.01)
    policy = SLOBatchPolicy(cfg, clock)
    if not calibrated:
        policy.calibration = LatencyCalibration(window=1, quantile=1.0, min_samples=10**9)
    events = [(0.01 * i, 500) for i in range(600)]  # 50k tokens/s offered, ~9k/s served
    done, rejected = simulate(policy, clock, events, lambda n: 0.01 + 1e-4 * n, unmodelled_s=0.03)
    assert len(done) + len(rejected) == len(events)
    settled = [end - start for start, end in done.values() if start >= 3.0]  # once 20+ answers are in
    late = sum(latency > 0.2 + 1e-9 for latency in settled) / len(settled)
    if calibrated:
        assert late == 0 and policy.calibration.factor() > 1.2
        assert len(settled) >= 15  # still answering (one request per ~0.15 s), not turning all away
    else:
        assert late > 0.9


@settings(max_examples=100, deadline=None)
@given(
    ratios=st.lists(st.floats(0.01, 10.0), max_size=60),
    window=st.integers(1, 40),
    quantile=st.floats(0.05, 1.0),
    min_samples=st.integers(1, 30),
)
def test_the_lateness_factor_is_a_clamped_quantile_of_the_recent_ratios(
    ratios, window, quantile, min_samples
):
    cal = LatencyCalibration(window, quantile, min_samples=min_samples, max_factor=4.0)
    for r in ratios:
        cal.observe(0.1, 0.1 * r)
    cal.observe(0.0, 1.0)  # no prediction (the fixed policy's 0): ignored
    recent = ratios[-window:]
    if len(recent) < min_samples:
        assert cal.factor() == 1.0
    else:
        expected = min(4.0, max(1.0, float(np.quantile(np.array(recent) * 0.1 / 0.1, quantile))))
        assert cal.factor() == pytest.approx(expected)


def test_admission_scales_its_prediction_by_the_lateness_factor():
    clock = FakeClock()
    cfg = ScheduleConfig(token_budget=100, slo_s=0.1, wait_share=0.2, initial_s_per_token=4e-4)
    policy = SLOBatchPolicy(cfg, clock)
    assert policy.admit("a", 100).predicted_s == pytest.approx(0.04)
    policy.next_batch()  # running until 0.04
    for _ in range(20):  # answers came 2.5x later than predicted
        policy.answered(0.04, 0.1)
    assert policy.calibration.factor() == pytest.approx(2.5)
    late = policy.admit("b", 40)  # 80 ms predicted, x2.5 = 200 ms: over the 100 ms SLO
    assert not late.admitted and "x2.50 for recent lateness" in late.reason
    assert late.retry_after_s == pytest.approx(2.5 * 0.04)  # the running batch, as late as recent ones
    policy.record([], 0.04)  # the worker is free and nothing is queued: a request starts at once,
    alone = policy.admit("c", 40)  # whatever the factor (turning it away would stop the answers
    assert alone.admitted and alone.predicted_s == pytest.approx(0.06)  # the factor learns from)


def test_a_batch_that_grows_after_admission_still_meets_the_slo():
    # r1 arrives alone and waits for its quota; r2 (900 tokens) arrives just before r1's batch starts.
    # A 100 ms SLO with a 50 ms quota leaves 25 ms per batch: 416 tokens at 60 us each, so the policy
    # runs r2 in a batch of its own instead of growing r1's to 55 ms (which would answer r1 at 105 ms)
    clock = FakeClock()
    policy = SLOBatchPolicy(ScheduleConfig(1000, 0.1, 0.5, initial_s_per_token=6e-5), clock)
    assert policy.budget() == 416
    done, rejected = simulate(policy, clock, [(0.0, 10), (0.049, 900)], lambda n: 6e-5 * n)
    assert rejected == [] and all(end - start <= 0.1 + 1e-9 for start, end in done.values()), done
    assert done[1][1] == pytest.approx(0.049 + 6e-4)  # r1 ran at once, alone, when r2 arrived


def test_a_slower_service_shrinks_the_budget_instead_of_turning_everyone_away():
    clock = FakeClock()
    cfg = ScheduleConfig(100_000, 0.2, 0.3, initial_s_per_token=1e-6)
    policy = SLOBatchPolicy(cfg, clock)
    assert policy.budget() == 70_000  # (200 - 60) / 2 ms at 1 us per token
    policy.service.s_per_token = 1e-5  # the machine got ten times slower
    assert policy.budget() == 7000
    admitted = policy.admit("a", 5000)
    assert admitted.admitted and admitted.predicted_s == pytest.approx(0.06 + 0.07)
    assert policy.admit("b", 9000).admitted  # above the cap, within the configured budget: runs alone
    assert [len(policy.next_batch())] == [1]  # a's batch is due (b does not fit with it)


def test_a_full_budget_dispatches_at_once_and_a_partial_one_waits_for_the_quota():
    clock = FakeClock()
    policy = SLOBatchPolicy(ScheduleConfig(token_budget=100, slo_s=1.0, wait_share=0.2), clock)
    policy.admit("a", 40)
    assert policy.next_batch() == [] and policy.due_in() == pytest.approx(0.2)
    clock.now = 0.1
    policy.admit("b", 60)  # 100 tokens queued: full
    assert [r.key for r in policy.next_batch()] == ["a", "b"]
    policy.record([], 0.0)
    policy.admit("c", 20)
    clock.now = 0.29
    assert policy.next_batch() == []
    clock.now = 0.31  # c arrived at 0.1: its 0.2 s quota is over
    assert [r.key for r in policy.next_batch()] == ["c"]
    assert policy.due_in() is None


def test_admission_rejects_what_cannot_meet_the_slo():
    clock = FakeClock()
    policy = SLOBatchPolicy(ScheduleConfig(token_budget=100, slo_s=0.1, initial_s_per_token=1e-4), clock)
    too_big = policy.admit("x", 120)
    assert not too_big.admitted and "exceed the batch budget of 100" in too_big.reason
    # one full batch takes 100 tokens x 1e-4 s = 10 ms: ten budgets of queued work miss the 100 ms SLO
    admitted = [policy.admit(i, 100).admitted for i in range(12)]
    assert admitted[:9] == [True] * 9 and not any(admitted[10:])
    late = policy.admit("y", 1)
    assert not late.admitted and late.retry_after_s > 0 and "SLO" in late.reason


def test_admission_counts_the_running_batch_and_the_time_already_waited():
    clock = FakeClock()
    cfg = ScheduleConfig(token_budget=100, slo_s=0.1, wait_share=0.2, initial_s_per_token=4e-4)
    policy = SLOBatchPolicy(cfg, clock)
    assert policy.admit("a", 100).predicted_s == pytest.approx(0.04)  # full at once: 40 ms of service
    assert len(policy.next_batch()) == 1  # running until 0.04
    # 40 tokens: waits for the running batch (40 ms), then up to a full budget's 40 ms
    assert policy.admit("b", 40).predicted_s == pytest.approx(0.08)
    clock.now = 0.03
    # a request that arrived 60 ms ago (the harness admits between decodes) has 40 ms fewer to spare
    late = policy.admit("c", 40, arrival_s=-0.03)
    assert not late.admitted and "predicted latency 110 ms" in late.reason
    assert policy.admit("d", 40).predicted_s == pytest.approx(0.05)  # joins b: 10 ms + 40 ms


def test_the_service_model_learns_overhead_and_per_token_cost():
    model = ServiceModel(s_per_token=2e-6, overhead_s=0.0, smoothing=0.3)
    # single-request batches of a quiet period: the overhead moves, the per-token cost stays (scaling
    # 10 ms per 200 tokens up would predict 1 s for a 20k-token batch)
    for _ in range(5):
        model.update(200, 0.0104)
    assert model.s_per_token == 2e-6 and model.overhead_s == pytest.approx(0.01)
    model.update(100, 1e-5)  # faster than the per-token cost alone allows: no overhead, its rate
    assert model.overhead_s >= 0 and model.seconds(100) > 0
    for _ in range(30):  # sizes that spread: both are fitted
        for tokens in (200, 5000, 800, 3000):
            model.update(tokens, 0.01 + 2e-5 * tokens)
    assert model.overhead_s == pytest.approx(0.01, rel=1e-3)
    assert model.s_per_token == pytest.approx(2e-5, rel=1e-3)
    assert budget_for(model, 0.05) == pytest.approx(2000, abs=2)


def test_the_service_estimate_learns_from_finished_batches():
    clock = FakeClock()
    policy = SLOBatchPolicy(ScheduleConfig(token_budget=100, slo_s=1.0, smoothing=0.5), clock)
    policy.admit("a", 100)
    batch = policy.next_batch()
    policy.record(batch, 0.01)  # 100 tokens in 10 ms
    assert policy.service_s(100) == pytest.approx(0.01) and policy.s_per_token == 1e-6
    assert policy.busy_until_s is None


def test_fixed_policy_batches_by_count_and_bounds_its_queue():
    clock = FakeClock()
    policy = FixedBatchPolicy(FixedConfig(max_batch_size=2, batch_wait_s=0.005, max_queued=1), clock)
    assert policy.admit("a", 10_000).admitted  # tokens do not matter to it
    assert policy.next_batch() == [] and policy.due_in() == pytest.approx(0.005)
    assert policy.admit("b", 1).admitted
    assert [r.key for r in policy.next_batch()] == ["a", "b"]  # two waiting: a full batch
    assert policy.admit("c", 1).admitted
    overloaded = policy.admit("d", 1)  # 2 decoding + 1 waiting = the bound of 3
    assert not overloaded.admitted and overloaded.retry_after_s > 0
    policy.record([], 0.01)
    clock.now = 0.006
    assert [r.key for r in policy.next_batch()] == ["c"]  # c's wait is over


def test_request_tokens_counts_beams_times_the_prompt():
    assert request_tokens(beams=32, history_items=9, levels=3) == 32 * 10 * 3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"token_budget": 0, "slo_s": 1}, "token_budget"),
        ({"token_budget": 1, "slo_s": 0}, "slo_s"),
        ({"token_budget": 1, "slo_s": 1, "wait_share": 1.5}, "wait_share"),
        ({"token_budget": 1, "slo_s": 1, "smoothing": 0}, "smoothing"),
    ],
)
def test_bad_configs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ScheduleConfig(**kwargs)
    with pytest.raises(ValueError, match="max_batch_size"):
        FixedConfig(max_batch_size=0)
