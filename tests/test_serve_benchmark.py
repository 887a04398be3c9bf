"""The batching benchmark (platform/serve_benchmark.py) end to end, at its smallest: one repeat through
Serve's proxy, each batching arm searched at a single low rate, and the JSON summary it writes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("aiohttp")

from genrec.workloads.results_store import experiment_dir  # noqa: E402

RATE = 4.0  # req/s: far below what the tiny model serves, so both arms meet the (generous) SLO
TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_benchmark(argv: list[str], cwd) -> subprocess.CompletedProcess:
    """`python -m genrec.platform.serve_benchmark ARGV` in its own process: it starts and shuts down a
    local Ray of its own, which must not meet the one the other tests share (ray_session). Its own
    session, so a timeout takes Ray's processes down with it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "genrec.platform.serve_benchmark", *argv],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.slow
def test_benchmark_end_to_end_writes_both_arms(tiny_model_dir, synth_dir, tmp_path):
    out, results = tmp_path / "out.json", tmp_path / "results"
    argv = [
        *("--model", str(tiny_model_dir), "--data", str(synth_dir), "--beam-width", "8", "--k", "5"),
        *("--ingress", "proxy", "--port", str(free_port()), "--max-batch-size", "2", "--slo-ms", "2000"),
        *("--duration", "1", "--warmup-s", "0", "--overhead-requests", "10", "--refine-steps", "0"),
        *("--start-rate", str(RATE), "--max-rate", str(RATE), "--cpu-split-rates", str(RATE)),
        *("--experiment", "bench_test", "--results-dir", str(results), "--no-mlflow", "--out", str(out)),
    ]
    done = run_benchmark(argv, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    summary = json.loads(out.read_text())
    assert summary["command"].endswith(" ".join(argv[-4:]))
    assert (summary["model"], summary["decoder"], summary["beam_width"]) == (str(tiny_model_dir), "beam", 8)
    assert summary["slo_ms"] == 2000.0 and summary["wall_s"] > 0 and summary["threads"] == 1
    alone = summary["decoder_alone"]
    assert alone["ratio"] == pytest.approx(alone["batch_max_rps"] / alone["batch_1_rps"])
    assert summary["plain_uvicorn_noop_p50_ms"] > 0
    assert list(summary["ingresses"]) == ["proxy"]  # one variant: Serve's proxy, default handler loop
    proxy = summary["ingresses"]["proxy"]
    assert len(proxy["noop_endpoint_p50_ms"]) == 1 and proxy["noop_endpoint_p50_ms"][0] > 0
    assert list(proxy["arms"]) == ["batching=off", "batching=on"]
    for name, arm in proxy["arms"].items():
        assert arm["max_rates"] == [RATE], name  # the single rate searched met the SLO
        assert len(arm["overhead_p50_ms"]) == 1
        [search] = arm["searches"]
        assert [(p["rate"], p["meets"]) for p in search] == [(RATE, True)]
        assert search[0]["throughput_rps"] > 0 and search[0]["mean_batch"] >= 1
        [split] = arm["cpu_split"]
        assert split["repeat"] == 0 and split["rate"] == RATE
        assert set(split["cpu_ms_per_request"]) == {"client", "ingress", "replica", "other"}
        assert sum(split["cpu_ms_per_request"].values()) > 0  # the machine was busy serving
    assert proxy["ratio_on_over_off"] == pytest.approx(1.0)  # both arms capped at the same rate
    assert "ratio (median max rate, on / off): 1.00" in done.stdout
    assert done.stdout.rstrip().endswith(f"wrote {out}")

    # every load test is a result row: per arm, the low-load run, the one search rate and the CPU split
    rows = [pq.read_table(f).to_pylist()[0] for f in experiment_dir(results, "bench_test").glob("*.parquet")]
    assert sorted(r["label"] for r in rows) == ["batching=off"] * 3 + ["batching=on"] * 3
