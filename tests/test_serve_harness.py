"""Serving without Ray: the open-loop harness (fake clock, then a tiny model for a few seconds), its rate
search, the `xgr_serving` benchmark, the Serve replica's policy scheduler on a plain event loop, and the
harness's entry point running with Ray, pydantic and FastAPI made unimportable (the lent GPU machine)."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

from genrec.platform.serve.scheduler import PolicyScheduler
from genrec.workloads.serving.arms import Arm, Options, run_arms
from genrec.workloads.serving.open_loop import LoadSpec, Record, poisson_arrivals, run_open_loop, summarize
from genrec.workloads.serving.rate_search import interleaved_search
from genrec.workloads.serving.slo import DEFAULT_MAX_UNANSWERED, meets_slo, nice_rate
from genrec.workloads.serving.xschedule import FixedBatchPolicy, FixedConfig, ScheduleConfig, SLOBatchPolicy


class FakeTime:
    """A clock that only moves when the harness sleeps or a fake decode runs."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def fake_decoder(clock: FakeTime, overhead_s: float, per_request_s: float, log: list):
    def serve_batch(payloads):
        log.append(list(payloads))
        clock.now += overhead_s + per_request_s * len(payloads)

    return serve_batch


def test_open_loop_with_a_fixed_batcher_on_a_fake_clock():
    clock, log = FakeTime(), []
    policy = FixedBatchPolicy(FixedConfig(max_batch_size=2, batch_wait_s=0.005, max_queued=1), clock)
    # a waits 5 ms for company and runs alone (5 + 5 ms); b and c arrive while it runs and go together
    # (15 ms); d and e arrive while b + c run: d is the third in flight, e finds the bound of 3 full and
    # is rejected, as the app's 503 (both are admitted only after b + c, as of their arrival)
    requests = [(0.0, "a", 1), (0.006, "b", 1), (0.007, "c", 1), (0.016, "d", 1), (0.017, "e", 1)]
    spec = LoadSpec(rate=1, duration_s=1, warmup_s=0, slo_s=0.05)
    recs = run_open_loop(policy, fake_decoder(clock, 0.005, 0.005, log), requests, spec, clock, clock.sleep)
    assert log == [["a"], ["b", "c"], ["d"]]
    assert [r.outcome for r in recs] == ["answered"] * 4 + ["rejected"]
    assert recs[0].latency_s == pytest.approx(0.015) and recs[0].queue_s == pytest.approx(0.005)
    # b and c waited for a (until 15 ms), then 15 ms for themselves; d's 5 ms wait was over at 30 ms
    assert [r.latency_s for r in recs[1:4]] == pytest.approx([0.024, 0.023, 0.024])
    assert recs[1].batch_size == 2
    s = summarize(recs, spec)
    assert s["sent"] == 5 and s["answered"] == 4 and s["rejected"] == 1
    assert not s["slo_met"]  # every latency is within 50 ms, but 20 % went unanswered


def test_open_loop_with_the_slo_policy_keeps_admitted_requests_within_the_slo():
    clock, log = FakeTime(), []
    cfg = ScheduleConfig(1000, 0.1, 0.2, initial_s_per_token=2e-5, initial_overhead_s=0.005)
    policy = SLOBatchPolicy(cfg, clock)
    # 400 requests/s of 100 tokens each, 2 ms + 5 ms per batch: past capacity, admission must shed
    requests = [(t, i, 100) for i, t in enumerate(poisson_arrivals(400, 2.0, seed=3))]
    spec = LoadSpec(rate=400, duration_s=2.0, warmup_s=0.0, slo_s=0.1)
    service = fake_decoder(clock, 0.005, 2e-3, log)
    recs = run_open_loop(policy, service, requests, spec, clock, clock.sleep)
    s = summarize(recs, spec)
    assert s["answered"] + s["rejected"] + s["timeout"] == s["sent"] == len(requests)
    assert s["rejected"] > 0 and s["answered"] > 100
    assert max(r.latency_s for r in recs if r.outcome == "answered") <= 0.1 + 1e-9
    assert max(len(b) for b in log) <= 10  # 1000-token budget / 100 tokens each


def test_requests_past_their_timeout_are_dropped_before_decoding():
    clock, log = FakeTime(), []
    policy = FixedBatchPolicy(FixedConfig(max_batch_size=1, batch_wait_s=0.0), clock)
    requests = [(0.0, "slow", 1), (0.001, "late", 1)]
    spec = LoadSpec(rate=1, duration_s=1, warmup_s=0, request_timeout_s=0.5)
    recs = run_open_loop(policy, fake_decoder(clock, 1.0, 0.0, log), requests, spec, clock, clock.sleep)
    assert [r.outcome for r in recs] == ["answered", "timeout"] and log == [["slow"]]


def test_interleaved_search_bisects_each_arm_and_alternates_them():
    capacity = {"a": 30.0, "b": 70.0}
    calls = []

    def measure(label, rate):
        calls.append((label, rate))
        return {"rate": rate, "slo_met": rate <= capacity[label]}

    out = interleaved_search(["a", "b"], measure, [10, 20, 40, 80], refine=2)
    assert out["a"].lo == 30 and out["a"].hi == 35  # 40 fails; bisect 30 (ok), 35 (fail)
    assert out["b"].lo == 70 and out["b"].hi == 80  # 80 fails; 60 ok, 70 ok
    assert calls[:6] == [("a", 10), ("b", 10), ("a", 20), ("b", 20), ("a", 40), ("b", 40)]
    assert ("a", 80) not in calls  # an arm drops out at its first failing rate
    never = interleaved_search(["a"], lambda label, r: {"rate": r, "slo_met": False}, [5, 10], refine=2)
    assert never["a"].lo is None and len(never["a"].points) == 1


def test_the_slo_rule_and_rate_rounding_are_one_definition_for_harness_and_load_generator():
    from genrec.platform.loadgen import capacity, stats
    from genrec.platform.loadgen.requests import LoadConfig
    from genrec.workloads.serving import slo

    # the load generator and the harness share the SLO module's one definition of each (no copy)
    assert stats.meets_slo is meets_slo is slo.meets_slo
    assert capacity.nice_rate is nice_rate is slo.nice_rate
    limits = (
        LoadSpec(1, 1).max_unanswered,
        Options().max_unanswered,
        LoadConfig().max_unanswered_rate,
    )
    assert DEFAULT_MAX_UNANSWERED == DEFAULT_MAX_UNANSWERED == 0.01 and set(limits) == {0.01}
    # both bounds inclusive; no answered request (P99 NaN) or no measured request never meets it
    assert meets_slo(200.0, 0.01, 200.0, 0.01) and meets_slo(np.float64(1.0), 0.0, 200.0, 0.01) is True
    assert not meets_slo(200.5, 0.0, 200.0, 0.01) and not meets_slo(1.0, 0.02, 200.0, 0.01)
    assert not meets_slo(math.nan, 0.0, 200.0, 0.01) and not meets_slo(1.0, math.nan, 200.0, 0.01)
    rates = (1234.5, 66.666, 0.012345, 75.0, 0.0, -3.0)
    assert [nice_rate(r) for r in rates] == [1230.0, 66.7, 0.0123, 75.0, 0.0, -3.0]
    # both summaries give the rule's verdict: P99 49.6 ms passes a 50 ms SLO, 59.6 ms does not, and a run
    # with nothing answered or nothing measured (all warm-up) fails
    spec = LoadSpec(rate=10, duration_s=1, warmup_s=0.5, slo_s=0.05)
    cfg = LoadConfig(rate=10, duration_s=1, warmup_s=0.5, slo_ms=50)
    ok = [Record(i, 0.5 + i / 10, 1, False, "answered", 0.01 * (i + 1)) for i in range(5)]
    slow = [*ok, Record(5, 0.99, 1, False, "answered", 0.06)]
    cases = [(ok, True), (slow, False), ([Record(0, 0.6, 1, False, "rejected")], False)]
    for recs, met in [*cases, ([Record(0, 0.1, 1, True, "answered", 0.01)], False)]:
        s = summarize(recs, spec)
        assert s["slo_met"] is met is meets_slo(s["p99_ms"], s["unanswered_rate"], 50.0, 0.01)
        assert stats.summarize([_as_request_record(r) for r in recs], cfg).slo_met is met


def _as_request_record(r: Record):
    from genrec.platform.loadgen.client import RequestRecord

    status = 200 if r.outcome == "answered" else 503
    latency_ms = r.latency_s * 1e3 if r.outcome == "answered" else 1.0
    done = r.arrival_s + latency_ms / 1e3
    return RequestRecord(
        r.index, r.arrival_s, r.arrival_s, done, latency_ms, status, r.outcome, r.warmup, 10, 3, 1
    )


def test_arms_parse_from_their_labels_and_rates_can_differ_per_arm():
    arms = [
        Arm("xgr", "fixed", max_batch_size=4),
        Arm("hf_beam", "slo", wait_share=0.05, budget_share=0.2),
        Arm("xgr", "slo", token_budget=30000, wait_share=0.1),
        Arm("xgr", "slo"),
    ]
    assert [Arm.parse(a.label) for a in arms] == arms
    assert Arm.parse("xgr/slo") == Arm("xgr", "slo")
    with pytest.raises(ValueError, match="DECODER/fixed-N"):
        Arm.parse("xgr/greedy-4")
    seen = []
    rates = {"fast": [100, 200], "slow": [1, 2, 4]}
    interleaved_search(
        ["fast", "slow"], lambda a, r: seen.append((a, r)) or {"rate": r, "slo_met": True}, rates, 0
    )
    assert seen == [("fast", 100), ("slow", 1), ("fast", 200), ("slow", 2), ("slow", 4)]


def test_poisson_arrivals_have_the_rate_and_are_seeded():
    t = poisson_arrivals(200, 10.0, seed=1)
    assert (t == poisson_arrivals(200, 10.0, seed=1)).all() and t.max() < 10.0
    assert abs(len(t) - 2000) < 200 and (t[1:] > t[:-1]).all()


@pytest.mark.slow
def test_the_harness_serves_a_tiny_model_with_both_policies_and_decoders(tiny_model_dir):
    """A few seconds of real load: xgr and hf_beam, slo and fixed, a low rate every arm meets."""
    pytest.importorskip("transformers")
    import torch

    from genrec.workloads.evaluation import load_context

    torch.set_num_threads(1)
    ctx, ds, _ = load_context(tiny_model_dir, None, "cpu")
    arms = [
        Arm("xgr", "slo"),
        Arm("xgr", "fixed", max_batch_size=4),
        Arm("hf_beam", "fixed", max_batch_size=2),
    ]
    opts = Options(beam_width=8, k=5, slo_ms=500.0, duration_s=1.5, warmup_s=0.3)
    histories = [ex.history for ex in ds.eval_examples("test")]
    result = run_arms(ctx, histories, arms, opts, rates=[4], refine=0, repeats=1)
    for arm in arms:
        r = result["arms"][arm.label]
        point = r["repeats"][0]["points"][0]
        assert point["sent"] > 0 and point["answered"] == point["sent"], (arm.label, point)
        assert r["best_rate_median"] == 4 and point["p99_ms"] < 500
    slo = result["arms"]["xgr/slo-w0.3-b0.35"]
    assert slo["token_budget"] >= 8 * 3  # at least one request: beams x one history item's tokens
    assert result["calibration"]["xgr"]["s_per_token"] > 0


@pytest.mark.slow
def test_the_serving_benchmark_runs_as_a_registry_entry(tiny_model_dir):
    from genrec.platform.benchmarks import get_benchmark

    bench = get_benchmark("xgr_serving")
    out = bench.run(
        model=str(tiny_model_dir), beam_width=4, k=4, policy="fixed", max_batch_size=2,
        rates="3", refine=0, duration_s=1.0, warmup_s=0.2, slo_ms=1000.0,
    )  # fmt: skip
    assert out["best_rate"] == 3 and out["p99_ms_at_best"] < 1000
    assert set(bench.metrics) <= set(out)
    with pytest.raises(Exception, match="rates"):
        bench.run(model=str(tiny_model_dir), rates="fast")
    with pytest.raises(Exception, match="policy"):
        bench.run(model=str(tiny_model_dir), policy="greedy")


@pytest.mark.slow
def test_the_harness_entry_point_runs_without_ray_pydantic_or_fastapi(tiny_model_dir, tmp_path):
    blocked = ["ray", "pydantic", "fastapi", "starlette", "mlflow", "yaml", "typer", "plotly"]
    out = tmp_path / "r.json"
    argv = [
        "--model", str(tiny_model_dir), "--decoder", "xgr", "--policy", "slo", "fixed",
        "--max-batch-size", "2", "--beam-width", "4", "--k", "4", "--rates", "3",
        "--duration-s", "1", "--warmup-s", "0.2", "--slo-ms", "1000", "--refine", "0", "--out", str(out),
    ]  # fmt: skip
    code = (
        "import runpy, sys\n"
        f"for m in {blocked!r}:\n"
        "    sys.modules[m] = None  # any import of it now raises ImportError\n"
        f"sys.argv = ['harness', *{argv!r}]\n"
        "runpy.run_module('genrec.platform.serve.harness', run_name='__main__')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["arms"]) == {"xgr/slo-w0.3-b0.35", "xgr/fixed-2"}
    assert all(r["best_rate_median"] == 3 for r in result["arms"].values())
    assert "highest" not in run.stderr and "best rate" in run.stdout


# ---- the Serve replica's scheduler, on a plain event loop (no Ray) ----------------------------------


def test_policy_scheduler_batches_rejects_and_survives_a_failed_batch():
    async def scenario():
        batches = []

        async def run_batch(items):
            batches.append(items)
            await asyncio.sleep(0.01)
            if "boom" in items:
                raise RuntimeError("decoder failed")
            return [f"answer {x}" for x in items]

        cfg = ScheduleConfig(token_budget=300, slo_s=0.5, wait_share=0.05, initial_s_per_token=1e-5)
        sched = PolicyScheduler(SLOBatchPolicy(cfg), run_batch)
        first = [sched.submit(x, 100) for x in ("a", "b", "c")]  # a full budget: dispatched at once
        later = sched.submit("d", 100)  # waits for its 25 ms quota
        too_big = sched.submit("e", 400)
        answers = await asyncio.gather(*(f for _, f in [*first, later]))
        failing = sched.submit("boom", 100)[1]
        with pytest.raises(RuntimeError, match="decoder failed"):
            await failing
        # a client that gave up (its wait was cancelled) does not break the dispatcher
        gone = sched.submit("x", 100)[1]
        gone.cancel()
        assert await sched.submit("y", 100)[1] == "answer y"
        await sched.stop()
        return batches, answers, too_big

    batches, answers, (admission, future) = asyncio.run(scenario())
    assert answers == ["answer a", "answer b", "answer c", "answer d"]
    assert batches[:3] == [["a", "b", "c"], ["d"], ["boom"]]
    assert future is None and not admission.admitted and "budget" in admission.reason


def test_the_serve_config_selects_and_checks_the_batching_policy():
    from genrec.platform.serve.config import parse_serve_config, read_serve_file
    from genrec.workloads.errors import UserInputError

    shipped = parse_serve_config(read_serve_file(REPO / "serve.yaml").args).batching
    assert shipped.policy in ("fixed", "slo")
    slo = parse_serve_config(
        {
            "model": "m",
            "batching": {"policy": "slo", "token_budget": 5000, "slo_ms": 100, "wait_quota_ms": 20},
        }
    ).batching
    assert slo.schedule_config() == ScheduleConfig(5000, 0.1, 0.2)
    with pytest.raises(UserInputError, match="wait_quota_ms"):
        parse_serve_config({"model": "m", "batching": {"slo_ms": 50, "wait_quota_ms": 60}})
    with pytest.raises(UserInputError, match="batching.policy"):
        parse_serve_config({"model": "m", "batching": {"policy": "greedy"}})
