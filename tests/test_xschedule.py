"""xSchedule's SLO batching policy with a fake clock: never over the token budget, never holding a
request past its wait quota, admission by the SLO."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.platform.serve.xschedule import ScheduleConfig, SLOBatchPolicy


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drain(policy: SLOBatchPolicy) -> list[list]:
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
        policy.admit(object(), prompt, beams)
        dispatched += [(clock.now, b) for b in drain(policy)]
        # invariant: after the loop ran, nobody still queued has waited past its quota
        assert all(clock.now - r.arrival_s < cfg.wait_quota_s + 1e-12 for r in policy.queue)
    for t, batch in dispatched:
        assert sum(r.tokens for r in batch) <= budget
        assert all(t - r.arrival_s <= cfg.wait_quota_s + 1e-9 for r in batch)
    order = [r.arrival_s for _, b in dispatched for r in b]
    assert order == sorted(order)  # oldest first


def test_a_full_budget_dispatches_at_once_and_a_partial_one_waits_for_the_quota():
    clock = FakeClock()
    policy = SLOBatchPolicy(ScheduleConfig(token_budget=100, slo_s=1.0, wait_share=0.2), clock)
    policy.admit("a", 10, 4)  # 40 tokens
    assert policy.next_batch() == [] and policy.due_in() == pytest.approx(0.2)
    clock.now = 0.1
    policy.admit("b", 15, 4)  # 100 tokens queued: full
    assert [r.key for r in policy.next_batch()] == ["a", "b"]
    policy.admit("c", 5, 4)
    clock.now = 0.29
    assert policy.next_batch() == []
    clock.now = 0.31  # c arrived at 0.1: its 0.2 s quota is over
    assert [r.key for r in policy.next_batch()] == ["c"]
    assert policy.due_in() is None


def test_admission_rejects_what_cannot_meet_the_slo():
    clock = FakeClock()
    policy = SLOBatchPolicy(ScheduleConfig(token_budget=100, slo_s=0.1, initial_s_per_token=1e-4), clock)
    too_big = policy.admit("x", 30, 4)
    assert not too_big.admitted and "exceed the batch budget of 100" in too_big.reason
    # one full batch takes 100 tokens x 1e-4 s = 10 ms: ten budgets of queued work miss the 100 ms SLO
    admitted = [policy.admit(i, 25, 4).admitted for i in range(12)]
    assert admitted[:9] == [True] * 9 and not any(admitted[10:])
    late = policy.admit("y", 1, 1)
    assert not late.admitted and late.retry_after_s > 0 and "SLO" in late.reason


def test_the_service_estimate_learns_from_finished_batches():
    clock = FakeClock()
    policy = SLOBatchPolicy(ScheduleConfig(token_budget=100, slo_s=1.0, smoothing=0.5), clock)
    policy.admit("a", 25, 4)
    clock.now = 1.0
    batch = policy.next_batch()
    policy.record(batch, 0.01)  # 100 tokens in 10 ms
    assert policy.s_per_token == pytest.approx(0.5 * 1e-6 + 0.5 * 1e-4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"token_budget": 0, "slo_s": 1}, "token_budget"),
        ({"token_budget": 1, "slo_s": 0}, "slo_s"),
        ({"token_budget": 1, "slo_s": 1, "wait_share": 1.5}, "wait_share"),
    ],
)
def test_bad_configs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ScheduleConfig(**kwargs)
