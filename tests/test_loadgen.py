"""Load generator: arrival schedules (pure), open/closed loop against an in-process stub of the Serve
app's HTTP contract, outcome accounting, warm-up, the rate search, Parquet/MLflow rows and the CLI."""

from __future__ import annotations

import asyncio
import math
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.platform.loadgen.capacity import RatePoint, best_of, find_max_rate, sweep_rates
from genrec.platform.loadgen.client import OUTCOMES, RequestRecord, run_load
from genrec.platform.loadgen.requests import LoadConfig, RequestSource, arrival_schedule, inter_arrival_cv
from genrec.platform.loadgen.run import Tracking, load_histories, prepare, run_context, run_one
from genrec.platform.loadgen.stats import LoadSummary, summarize
from genrec.workloads.errors import UserInputError
from genrec.workloads.results_store import read_rows

# ------------------------------------------------------------------------------------- stub server


class StubServe:
    """Stand-in for the Serve app: `workers` requests decode at once for `service_s` each; at most
    `capacity` are admitted (decoding + waiting), beyond that 503 + Retry-After; every
    `fail_every`-th request answers 500. Counts what it saw, including the peak concurrency."""

    def __init__(
        self,
        dataset: Path,
        service_s: float = 0.005,
        workers: int = 4,
        capacity: int = 64,
        fail_every: int = 0,
    ) -> None:
        self.dataset, self.service_s, self.workers = dataset, service_s, workers
        self.capacity, self.fail_every = capacity, fail_every
        self.received = self.rejected = self.inflight = self.max_inflight = 0
        self.sem: asyncio.Semaphore | None = None
        app = web.Application()
        app.router.add_post("/recommend", self.recommend)
        app.router.add_get("/health", self.health)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "model": "/models/stub",
                "dataset": str(self.dataset),
                "decoders": ["beam"],
                "replicas": 1,
                "max_batch_size": self.workers,
                "batch_wait_timeout_s": 0.0,
            }
        )

    async def recommend(self, request: web.Request) -> web.Response:
        self.received += 1
        n = self.received
        t0 = time.perf_counter()
        body = await request.json()
        if not isinstance(body.get("history"), list) or not isinstance(body.get("k"), int):
            return web.json_response({"detail": "history must be a list and k an int"}, status=422)
        if body.get("decoder", "beam") != "beam":
            return web.json_response(
                {"detail": f"unknown decoder {body['decoder']!r}; known: ['beam']"}, status=404
            )
        if self.inflight >= self.capacity:
            self.rejected += 1
            return web.json_response({"detail": "queue full"}, status=503, headers={"Retry-After": "1"})
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            async with self.sem:
                queued = time.perf_counter() - t0
                batch = min(self.inflight, self.workers)
                await asyncio.sleep(self.service_s)
        finally:
            self.inflight -= 1
        if self.fail_every and n % self.fail_every == 0:
            return web.json_response({"detail": "decoder crashed"}, status=500)
        k = body["k"]
        return web.json_response(
            {
                "items": [{"item_id": i, "sid": [1, 2, 3], "score": -float(i)} for i in range(k)],
                "decoder": body.get("decoder", "beam"),
                "k": k,
                "history_truncated": False,
                "batch_size": batch,
                "timings_ms": {
                    "decoder_call": self.service_s * 1000,
                    "server": (time.perf_counter() - t0) * 1000,
                    "queue": queued * 1000,
                },
            }
        )

    def __enter__(self) -> StubServe:
        self.thread.start()

        async def start() -> int:
            self.sem = asyncio.Semaphore(self.workers)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            return self.runner.addresses[0][1]

        self.port = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def stub(synth_dir):
    servers: list[StubServe] = []

    def make(**kwargs) -> StubServe:
        server = StubServe(synth_dir, **kwargs).__enter__()
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.__exit__(None, None, None)


@pytest.fixture(scope="module")
def histories(synth_dir) -> list[list[int]]:
    return load_histories(synth_dir)


def run(cfg: LoadConfig, histories) -> tuple[list[RequestRecord], LoadSummary]:
    records, _ = asyncio.run(run_load(cfg, histories))
    return records, summarize(records, cfg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------- pure functions


def test_schedule_has_the_rate_and_is_seeded():
    times = arrival_schedule(rate=100, duration_s=100, seed=1)
    assert abs(len(times) - 10_000) < 4 * math.sqrt(10_000)  # Poisson count: mean = var = rate * T
    assert np.all(np.diff(times) > 0) and times[0] >= 0 and times[-1] < 100
    assert abs(inter_arrival_cv(times) - 1.0) < 0.05  # exponential gaps
    np.testing.assert_array_equal(times, arrival_schedule(100, 100, seed=1))
    assert not np.array_equal(times[:50], arrival_schedule(100, 100, seed=2)[:50])


def test_burstiness_sets_the_cv_but_not_the_rate():
    bursty = arrival_schedule(rate=100, duration_s=300, seed=3, burstiness=3.0)
    smooth = arrival_schedule(rate=100, duration_s=300, seed=3, burstiness=0.5)
    assert abs(inter_arrival_cv(bursty) - 3.0) < 0.3
    assert abs(inter_arrival_cv(smooth) - 0.5) < 0.05
    for times in (bursty, smooth):
        assert abs(len(times) / 300 - 100) < 10


def test_requests_are_seeded_histories():
    hist = [[1, 2], [3], [4, 5, 6]]
    a = RequestSource(hist, {"k": 5, "decoder": "beam"}, seed=7)
    b = RequestSource(hist, {"k": 5, "decoder": "beam"}, seed=7)
    drawn = [a.next() for _ in range(20)]
    assert drawn == [b.next() for _ in range(20)]
    assert [i for i, _ in drawn] == list(range(20))
    assert all(p["k"] == 5 and p["decoder"] == "beam" and p["history"] in hist for _, p in drawn)


def _record(i: int, outcome: str, warmup: bool, latency: float) -> RequestRecord:
    status = {"answered": 200, "rejected": 503, "error": 500, "timeout": 0}[outcome]
    return RequestRecord(
        i, i * 0.01, i * 0.01, i * 0.01 + latency / 1000, latency, status, outcome, warmup, 10, 3, 1
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(OUTCOMES), st.booleans(), st.floats(0.1, 500)),
        min_size=1,
        max_size=60,
    )
)
def test_summary_accounts_for_every_request(rows):
    records = [_record(i, o, w, lat) for i, (o, w, lat) in enumerate(rows)]
    s = summarize(records, LoadConfig(rate=100, duration_s=1, warmup_s=0))
    assert s.sent == sum(not w for _, w, _ in rows) and s.warmup == len(rows) - s.sent
    assert s.sent == s.answered + s.rejected + s.errors + s.timeouts
    if s.sent:
        assert math.isclose(s.unanswered_rate, (s.sent - s.answered) / s.sent)


def test_summary_refuses_a_request_without_outcome():
    records = [_record(0, "answered", False, 5.0), _record(1, "answered", False, 5.0)]
    records[1].outcome = "pending"
    with pytest.raises(AssertionError, match="without an outcome"):
        summarize(records, LoadConfig())


def _fake_measure(capacity: float, slo_ms: float, calls: list[float]):
    """Latency of an M/M/1-like server: 10 ms / (1 - rate / capacity); infinite at or past capacity."""

    def measure(rate: float) -> RatePoint:
        calls.append(rate)
        p99 = 10.0 / (1 - rate / capacity) if rate < capacity else math.inf
        return RatePoint(rate, p99, 0.0, p99 <= slo_ms)

    return measure


def test_find_max_rate_grows_then_bisects():
    calls: list[float] = []
    # 10 / (1 - r/100) <= 40  <=>  r <= 75: grow 5..80 (fails), then bisect between 40 and 80
    search = find_max_rate(_fake_measure(100, 40, calls), start_rate=5, max_rate=1000, refine_steps=8)
    assert calls[:6] == [5, 10, 20, 40, 80, 60]
    assert 72 <= search.best_rate <= 75 and not search.hit_limit
    assert len(calls) == len(set(calls)) == len(search.points)
    # every rate meets the SLO up to the cap: the answer is the cap, flagged as a lower bound
    capped = find_max_rate(_fake_measure(1e9, 50, []), start_rate=5, max_rate=30)
    assert capped.best_rate == 30 and capped.hit_limit
    assert find_max_rate(_fake_measure(100, 5, []), start_rate=5, max_rate=50).best_rate is None
    with pytest.raises(UserInputError, match="start-rate"):
        find_max_rate(_fake_measure(100, 50, []), start_rate=0, max_rate=10)


def test_sweep_rates_takes_the_highest_rate_below_the_first_failure():
    search = sweep_rates(_fake_measure(100, 50, []), [90, 10, 50])
    assert [p.rate for p in search.points] == [10, 50, 90] and search.best_rate == 50
    noisy = [RatePoint(10, 5, 0, True), RatePoint(20, 90, 0, False), RatePoint(30, 40, 0, True)]
    assert best_of(noisy) == 10


# ------------------------------------------------------------------------------- against the stub


def test_open_loop_warmup_is_recorded_but_not_counted(stub, histories):
    server = stub(service_s=0.005, workers=8)
    cfg = LoadConfig(url=server.url, rate=60, duration_s=0.8, warmup_s=0.3, slo_ms=200, seed=4)
    records, s = run(cfg, histories)
    assert server.received == len(records)  # every scheduled request reached the server
    assert [r.index for r in records] == list(range(len(records)))
    warm = [r for r in records if r.warmup]
    assert warm and all(r.scheduled_s < 0.3 for r in warm)
    assert all(r.scheduled_s >= 0.3 for r in records if not r.warmup)
    assert s.warmup == len(warm) and s.sent == len(records) - len(warm)
    assert s.sent == s.answered and s.rejected == s.errors == s.timeouts == 0
    assert s.latency_ms["p50"] >= 5.0 and s.latency_ms["p99"] >= s.latency_ms["p50"]
    assert s.decoder_p50_ms == pytest.approx(5.0) and s.overhead_p50_ms >= 0
    assert 1 <= s.batch_size_mean <= 8 and s.slo_met
    assert 20 < s.offered_rate_rps < 120 and s.throughput_rps > 20
    # the same seed sends the same schedule
    again, _ = run(cfg, histories)
    assert [r.scheduled_s for r in again] == [r.scheduled_s for r in records]


def test_closed_loop_keeps_n_requests_outstanding(stub, histories):
    server = stub(service_s=0.02, workers=16)
    cfg = LoadConfig(url=server.url, mode="closed", concurrency=4, duration_s=0.5, warmup_s=0.1)
    records, s = run(cfg, histories)
    assert server.max_inflight == 4
    assert max(r.inflight_at_send for r in records) == 4
    assert s.sent == s.answered > 0 and s.warmup > 0
    # each worker sends its next request only after its previous one answered: ~4 per 20 ms
    assert s.throughput_rps < 4 / 0.02 * 1.1


def test_burst_beyond_the_queue_is_rejected_not_dropped(stub, histories):
    server = stub(service_s=0.05, workers=1, capacity=3)
    cfg = LoadConfig(url=server.url, rate=200, duration_s=0.4, warmup_s=0, slo_ms=1000)
    records, s = run(cfg, histories)
    assert s.rejected > 0 and s.rejected == server.rejected
    assert s.sent == len(records) == s.answered + s.rejected + s.errors + s.timeouts
    rejected = [r for r in records if r.outcome == "rejected"]
    assert all(r.status == 503 and r.retry_after_s == 1 for r in rejected)
    assert s.rejection_rate > 0.01 and not s.slo_met  # fast answers do not excuse shed load


def test_errors_and_timeouts_are_counted(stub, histories):
    failing = stub(service_s=0.002, fail_every=3)
    _, s = run(LoadConfig(url=failing.url, rate=50, duration_s=0.4, warmup_s=0), histories)
    assert s.errors > 0 and s.sent == s.answered + s.errors
    slow = stub(service_s=0.5)
    records, s = run(LoadConfig(url=slow.url, rate=20, duration_s=0.2, warmup_s=0, timeout_s=0.1), histories)
    assert s.timeouts == s.sent == len(records) > 0
    assert all(r.outcome == "timeout" and 90 <= r.latency_ms < 400 for r in records)


def test_rows_go_to_parquet_and_mlflow(stub, histories, synth_dir, tmp_path):
    from genrec.platform.mlflow_store import MlflowStore, sqlite_uri

    server = stub(service_s=0.003)
    cfg = LoadConfig(url=server.url, rate=40, duration_s=0.5, warmup_s=0.1, beam_width=5, k=5)
    health, path, hist = prepare(cfg, None)
    assert path == synth_dir and len(hist) == len(histories)
    ctx = run_context("lt-test", "batching=on", path, health)
    res = run_one(cfg, hist, ctx, Tracking(tmp_path, mlflow=True), run_id="run1")
    table = pq.read_table(tmp_path / "loadtest" / "run1.parquet").to_pandas()
    assert len(table) == len(res.records) and table["warmup"].sum() == res.summary.warmup
    assert {
        "scheduled_s",
        "sent_s",
        "latency_ms",
        "status",
        "outcome",
        "batch_size",
        "decoder_ms",
        "k",
    } <= set(table.columns)
    (row,) = read_rows(tmp_path, "lt-test")
    assert row["kind"] == "loadtest" and row["label"] == "batching=on" and row["run_id"] == "run1"
    assert row["param_rate"] == 40 and row["param_beam_width"] == 5 and row["param_max_batch_size"] == 4
    assert row["count_sent"] == res.summary.sent and row["latency_p99_ms"] == res.summary.latency_ms["p99"]
    for key in (
        "latency_p95_ms",
        "goodput_rps",
        "overhead_p99_ms",
        "torch_version",
        "git_commit",
        "created_at",
    ):
        assert key in row
    runs = MlflowStore(sqlite_uri(tmp_path), "lt-test").runs()
    assert len(runs) == 1 and runs[0].data.metrics["latency_p99_ms"] == pytest.approx(row["latency_p99_ms"])
    assert float(runs[0].data.params["param_rate"]) == 40


def _ensure_registered() -> None:
    """Register `genrec loadtest` on the CLI app unless platform/cli.py already does."""
    from genrec.platform import cli
    from genrec.platform.commands import loadtest

    if not any(c.name == "loadtest" for c in cli.app.registered_commands):
        loadtest.register(cli.app)


def test_cli_prints_the_summary(stub, tmp_path, capsys):
    _ensure_registered()
    server = stub(service_s=0.003)
    argv = ["loadtest", "--url", server.url, "--rate", "20", "--duration", "0.5", "--slo-ms", "200"]
    code = run_cli([*argv, "--warmup-s", "0.2", "--no-mlflow", "--results-dir", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "open loop, 20 req/s offered (Poisson)" in out and "p99" in out and "goodput" in out
    assert "SLO (P99 <= 200 ms" in out and "met" in out
    assert len(read_rows(tmp_path, "loadtest")) == 1


def test_cli_rate_sweep_finds_the_max_rate(stub, tmp_path, capsys):
    _ensure_registered()
    server = stub(service_s=0.01, workers=1)  # serves at most 100 requests/s
    argv = ["loadtest", "--url", server.url, "--sweep-rates", "5,300", "--duration", "0.6", "--slo-ms", "100"]
    code = run_cli([*argv, "--warmup-s", "0", "--no-mlflow", "--results-dir", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "highest rate meeting P99 <= 100 ms" in out and ": 5 req/s" in out
    rows = read_rows(tmp_path, "loadtest")
    assert sorted(r["param_rate"] for r in rows) == [5, 300]
    assert [r["slo_met"] for r in sorted(rows, key=lambda r: r["param_rate"])] == [True, False]


def test_cli_unreachable_server_exits_2(tmp_path, capsys):
    _ensure_registered()
    url = f"http://127.0.0.1:{free_port()}"
    code = run_cli(
        ["loadtest", "--url", url, "--rate", "20", "--duration", "1", "--results-dir", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"cannot reach the Serve app at {url}" in err and "genrec serve --model DIR" in err


def test_cli_bad_dataset_and_options_exit_2(stub, tmp_path, capsys):
    _ensure_registered()
    server = stub()
    code = run_cli(["loadtest", "--url", server.url, "--data", str(tmp_path / "nope"), "--duration", "1"])
    assert code == 2 and "--data" in capsys.readouterr().err
    code = run_cli(["loadtest", "--url", server.url, "--decoder", "nope", "--results-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert (
        code == 2
        and "refused a request with k=10, decoder=nope: HTTP 404" in err
        and "unknown decoder" in err
    )
    assert not (tmp_path / "parquet").exists()  # nothing sent, nothing written
    code = run_cli(["loadtest", "--url", server.url, "--rate", "-1"])
    assert code == 2 and "--rate" in capsys.readouterr().err
    code = run_cli(["loadtest", "--url", server.url, "--sweep-rates", "10,x"])
    assert code == 2 and "--sweep-rates" in capsys.readouterr().err


def test_config_replace_keeps_validation():
    with pytest.raises(UserInputError, match="--mode"):
        replace(LoadConfig(), mode="sideways").validate()


def test_rows_name_the_apps_batching_policy():
    from genrec.platform.loadgen.rows import decoder_params

    cfg = LoadConfig(url="http://127.0.0.1:1", rate=40, duration_s=1.0, beam_width=32, k=10)
    base = {"max_batch_size": 8, "batch_wait_timeout_s": 0.005, "replicas": 1}
    slo = {**base, "batching": {"policy": "slo", "token_budget": 22044, "wait_quota_ms": 10.0, "slo_ms": 200}}
    fixed = {**base, "batching": {"policy": "fixed", "max_batch_size": 8, "token_budget": 22044}}
    assert decoder_params(cfg, slo)["batching_policy"] == "slo"
    assert (
        decoder_params(cfg, slo)["token_budget"] == 22044
        and decoder_params(cfg, slo)["wait_quota_ms"] == 10.0
    )
    assert decoder_params(cfg, fixed)["batching_policy"] == "fixed" and "token_budget" not in decoder_params(
        cfg, fixed
    )
    assert "batching_policy" not in decoder_params(cfg, base)  # an older app's /health: nothing invented
    assert decoder_params(cfg, slo) != decoder_params(cfg, fixed)
