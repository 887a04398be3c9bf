"""Replicas in the in-process serving harness: round-robin routing, arm labels with a replica count, and
the replica processes (fake decoders that sleep, then a tiny model): every request answered once, by the
replica its index routes to, two replicas carrying a load one cannot, and no process left behind, also
when a replica fails."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from genrec.workloads.serving.arms import Arm, Options, load_test, open_replicas, run_arms
from genrec.workloads.serving.open_loop import LoadSpec, poisson_arrivals, summarize
from genrec.workloads.serving.replicas import ReplicaError, ReplicaPool, ReplicaSetup, route_round_robin

SETUP = ReplicaSetup(model="unused", decoders=("fake",), beam_width=4, k=2)
SERVICE_S = 0.02  # the fake decoder's time per batch


def sleeping_decoders(setup: ReplicaSetup) -> dict:
    """A decoder per name that sleeps SERVICE_S per batch (runs in the replica process)."""
    return {d: (lambda batch: time.sleep(SERVICE_S)) for d in setup.decoders}


def failing_setup(setup: ReplicaSetup) -> dict:
    raise FileNotFoundError("no checkpoint at unused")


def failing_decoders(setup: ReplicaSetup) -> dict:
    def serve_batch(batch):
        raise RuntimeError("decoder exploded")

    return {d: serve_batch for d in setup.decoders}


@given(st.integers(0, 200), st.integers(1, 9))
def test_round_robin_routing_splits_every_request_to_exactly_one_replica(n, replicas):
    shares = route_round_robin(n, replicas)
    assert len(shares) == replicas
    assert sorted(i for share in shares for i in share) == list(range(n))
    for r, share in enumerate(shares):
        assert share == sorted(share) and all(i % replicas == r for i in share)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_round_robin_refuses_zero_replicas():
    with pytest.raises(ValueError, match="replicas must be >= 1"):
        route_round_robin(5, 0)


@pytest.mark.parametrize(
    "arm",
    [
        Arm("xgr", "fixed", max_batch_size=8, replicas=2),
        Arm("xgr", "fixed", max_batch_size=8),
        Arm("hf_beam", "slo", wait_share=0.05, budget_share=0.35, replicas=3),
        Arm("xgr", "slo", token_budget=4096, wait_share=0.3, replicas=4),
    ],
)
def test_arm_labels_carry_the_replica_count_and_parse_back(arm):
    assert Arm.parse(arm.label) == arm
    assert arm.label.endswith(f"-r{arm.replicas}") == (arm.replicas > 1)


def test_an_arm_needs_a_replica():
    with pytest.raises(ValueError, match="at least one replica"):
        Arm("xgr", "fixed", replicas=0)
    with pytest.raises(ValueError, match="-rREPLICAS"):
        Arm.parse("xgr/fixed-8-replicas")


def no_children_left() -> bool:
    deadline = time.monotonic() + 5
    while mp.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not mp.active_children()


def fake_requests(rate: float, duration_s: float) -> list[tuple[float, str, int]]:
    return [(float(t), f"u{i}", 10) for i, t in enumerate(poisson_arrivals(rate, duration_s, seed=3))]


def test_two_replicas_answer_every_request_once_routed_round_robin():
    opts = Options(beam_width=4, k=2, slo_ms=300.0, duration_s=1.5, warmup_s=0.2, batch_wait_ms=1.0)
    spec = LoadSpec(30.0, opts.duration_s, opts.warmup_s, slo_s=0.3)
    requests = fake_requests(30.0, opts.duration_s)
    with ReplicaPool(SETUP, 2, sleeping_decoders) as pool:
        records = pool.run(Arm("fake", "fixed", max_batch_size=1, replicas=2), opts, None, requests, spec)
    assert [r.index for r in records] == list(range(len(requests)))
    assert [r.arrival_s for r in records] == [t for t, _, _ in requests]
    assert all(r.outcome == "answered" and r.replica == r.index % 2 for r in records)
    assert all(SERVICE_S <= r.latency_s < 0.3 for r in records)
    assert summarize(records, spec)["slo_met"]
    assert no_children_left()


def test_two_replicas_carry_a_load_that_one_cannot():
    """1.2x one replica's capacity (fixed batches of one, 20 ms each): one replica's queue grows
    without bound and misses the SLO; two replicas are 60 % busy and meet it."""
    rate = 1.2 / SERVICE_S
    opts = Options(
        beam_width=4, k=2, slo_ms=300.0, duration_s=3.0, warmup_s=0.5, batch_wait_ms=1.0, max_queued=1000
    )
    pool_of_requests = [(f"u{i}", 10) for i in range(16)]
    serve_in_process = sleeping_decoders(SETUP)["fake"]
    with open_replicas(
        [Arm("fake", "fixed", max_batch_size=1, replicas=2)], SETUP, sleeping_decoders
    ) as pool:
        two = load_test(
            Arm("fake", "fixed", max_batch_size=1, replicas=2), rate, None, pool_of_requests, opts, None, pool
        )
    one = load_test(
        Arm("fake", "fixed", max_batch_size=1), rate, serve_in_process, pool_of_requests, opts, None
    )
    assert two["replicas"] == 2 and one["replicas"] == 1
    assert two["slo_met"] and two["p99_ms"] < 150, two
    assert not one["slo_met"] and one["p99_ms"] > 300, one
    assert no_children_left()


def test_a_replica_that_cannot_load_fails_the_pool_with_its_error_and_leaves_no_process():
    with pytest.raises(ReplicaError, match="FileNotFoundError: no checkpoint at unused"):
        ReplicaPool(SETUP, 2, failing_setup)
    assert no_children_left()


def test_a_failing_decoder_surfaces_as_a_replica_error_and_the_pool_still_closes():
    opts = Options(beam_width=4, k=2, duration_s=0.5, warmup_s=0.1)
    spec = LoadSpec(20.0, opts.duration_s, opts.warmup_s)
    with pytest.raises(ReplicaError, match="decoder exploded"):
        with ReplicaPool(SETUP, 2, failing_decoders) as pool:
            pool.run(Arm("fake", "fixed", replicas=2), opts, None, fake_requests(20.0, 0.5), spec)
    assert no_children_left()


def test_an_arm_with_replicas_needs_a_pool_and_the_pool_enough_processes():
    opts = Options(duration_s=0.5, warmup_s=0.1)
    with pytest.raises(ValueError, match="needs a ReplicaPool"):
        load_test(Arm("fake", "fixed", replicas=2), 5.0, None, [("u", 1)], opts, None)
    with open_replicas([Arm("fake", "fixed")], SETUP, sleeping_decoders) as nothing:
        assert nothing is None  # every arm has one replica: nothing is started
    with ReplicaPool(SETUP, 1, sleeping_decoders) as pool:
        with pytest.raises(ValueError, match="the pool has 1"):
            pool.run(Arm("fake", "fixed", replicas=2), opts, None, [], LoadSpec(5.0, 0.5))
    assert no_children_left()


@pytest.mark.slow
def test_the_harness_serves_a_tiny_model_with_two_replica_processes(tiny_model_dir):
    import torch

    from genrec.workloads.evaluation import load_context

    torch.set_num_threads(1)
    ctx, ds, _ = load_context(tiny_model_dir, None, "cpu")
    arms = [Arm("xgr", "fixed", max_batch_size=4, replicas=2), Arm("xgr", "slo", replicas=2)]
    opts = Options(beam_width=8, k=5, slo_ms=500.0, duration_s=1.5, warmup_s=0.3)
    setup = ReplicaSetup(str(tiny_model_dir), ("xgr",), opts.beam_width, opts.k, threads=1)
    histories = [ex.history for ex in ds.eval_examples("test")]
    with open_replicas(arms, setup) as pool:
        result = run_arms(ctx, histories, arms, opts, rates=[4], refine=0, repeats=1, replicas=pool)
    for arm in arms:
        point = result["arms"][arm.label]["repeats"][0]["points"][0]
        assert point["replicas"] == 2 and point["sent"] > 0 and point["answered"] == point["sent"], point
        assert point["p99_ms"] < 500
    assert no_children_left()


KILLED_HARNESS = """
import sys, time
sys.path.insert(0, {tests!r})
from test_serve_replicas import SETUP, fake_requests, sleeping_decoders
from genrec.workloads.serving.arms import Arm, Options
from genrec.workloads.serving.open_loop import LoadSpec
from genrec.workloads.serving.replicas import ReplicaPool

pool = ReplicaPool(SETUP, 2, sleeping_decoders)
print(*[p.pid for p in pool.procs], flush=True)
opts = Options(beam_width=4, k=2, duration_s=60.0, warmup_s=0.1)
pool.run(Arm("fake", "fixed", replicas=2), opts, None, fake_requests(10.0, 60.0), LoadSpec(10.0, 60.0))
"""


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"])
def test_a_harness_killed_mid_test_leaves_no_replica_behind(signal_name):
    """The parent dies while its replicas serve a 60 s load test; the kernel's parent-death signal
    stops them (SIGKILL: no cleanup code of the parent runs at all)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    code = KILLED_HARNESS.format(tests=str(Path(__file__).parent))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        time.sleep(1.0)  # the load test is running
        proc.send_signal(getattr(signal, signal_name))
        proc.wait(timeout=10)
    finally:
        proc.kill()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]
        time.sleep(0.1)
    assert not alive, f"replica processes {alive} outlived the harness ({os.uname().sysname})"


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
