"""Serving report: load-test rows -> latency/goodput vs offered rate and the max rate under the SLO."""

from __future__ import annotations

import math
import re

import pandas as pd
import plotly.offline
import pytest
from conftest import run_cli

from genrec.dashboards.report import build_report
from genrec.dashboards.serving import build_serving_report, max_rate_table, rate_points
from genrec.platform.tracking import write_result_row
from genrec.workloads.errors import UserInputError
from genrec.workloads.results_store import read_results

EXP = "serving"
# p99 (ms) per offered rate for two setups: without batching the SLO (200 ms) breaks at 40 req/s,
# with batching at 80 req/s
P99 = {
    "off": {10: 30.0, 20: 90.0, 40: 450.0, 80: 2000.0},
    "on": {10: 35.0, 20: 50.0, 40: 120.0, 80: 900.0},
}


def loadtest_row(label: str, rate: float, p99: float, seed: int = 0, **extra) -> dict:
    served = min(rate, 30.0 if label == "off" else 60.0)
    row = {
        "experiment": EXP,
        "run_id": f"{label}-{rate:g}-{seed}",
        "kind": "loadtest",
        "label": f"batching={label}",
        "decoder": "beam",
        "decoder_params": "{}",
        "param_mode": "open",
        "param_rate": float(rate),
        "param_k": 10,
        "param_beam_width": 10,
        "dataset": "synth",
        "model": "/models/tiny",
        "seed": seed,
        "latency_p50_ms": p99 / 3,
        "latency_p90_ms": p99 / 1.5,
        "latency_p95_ms": p99 / 1.2,
        "latency_p99_ms": p99,
        "throughput_rps": served,
        "goodput_rps": served if p99 <= 200 else served / 3,
        "offered_rate_rps": float(rate),
        "unanswered_rate": 0.0,
        "rejection_rate": 0.0,
        "error_rate": 0.0,
        "timeout_rate": 0.0,
        "overhead_p50_ms": 2.0,
        "overhead_p99_ms": 6.0,
        "batch_size_mean": 1.0 if label == "off" else 4.0,
        "slo_ms": 200.0,
        "max_unanswered_rate": 0.01,
        "device": "client:x86_64",
        "git_commit": "abc123",
        "created_at": f"2026-11-22T10:00:{int(rate) % 60:02d}+00:00",
    }
    return row | extra


@pytest.fixture
def results(tmp_path):
    for label, curve in P99.items():
        for rate, p99 in curve.items():
            write_result_row(tmp_path, loadtest_row(label, rate, p99))
    # a repeat of one point: the report averages it
    write_result_row(tmp_path, loadtest_row("on", 10, 45.0, seed=1))
    return tmp_path


def max_rate_rows(html_text: str) -> dict[str, list[str]]:
    table = re.search(r'<table class="maxrate">(.*?)</table>', html_text, re.S).group(1)
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1], re.S)
    cells = [re.findall(r"<td>(.*?)</td>", r, re.S) for r in rows]
    return {c[0]: c[1:] for c in cells}


def test_report_has_the_figures_and_the_max_rate_table(results, tmp_path):
    out = build_serving_report(results, EXP, tmp_path / "serving.html")
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>")
    # offline: plotly.js from the file beside the page (written from plotly's bundle), no stylesheet
    assert text.count("<script src") == 1 and '<script src="plotly.min.js"' in text and "<link" not in text
    assert (out.parent / "plotly.min.js").read_text() == plotly.offline.get_plotlyjs()
    for heading in ("Latency percentiles vs offered rate", "Throughput and goodput vs offered rate"):
        assert heading in text
    assert text.count('class="plotly-graph-div"') == 2
    assert "SLO 200 ms" in text and "served = offered" in text and "star" in text
    rows = max_rate_rows(text)
    assert rows["beam [batching=off]"][0] == "20" and rows["beam [batching=off]"][4] == "40"
    assert rows["beam [batching=on]"][0] == "40" and rows["beam [batching=on]"][4] == "80"
    assert "P99 ≤ 200 ms" in text


def test_slo_override_moves_the_answer(results, tmp_path):
    text = build_serving_report(results, EXP, tmp_path / "s.html", slo_ms=32).read_text()
    rows = max_rate_rows(text)
    assert rows["beam [batching=off]"][0] == "10"
    # batching=on at 10 req/s ran twice (35 and 45 ms): its mean p99 of 40 ms misses a 32 ms SLO
    assert rows["beam [batching=on]"][0] == "none meets the SLO"
    points = rate_points(read_results(results, EXP))
    on10 = points[(points["config"] == "beam [batching=on]") & (points["rate"] == 10)]
    assert on10["n"].item() == 2 and on10["latency_p99_ms"].item() == pytest.approx(40.0)


def test_genrec_report_dispatches_load_test_rows(results, capsys):
    code = run_cli(["report", "--experiment", EXP, "--results-dir", str(results)])
    out = capsys.readouterr().out
    assert code == 0, out
    page = (results / "reports" / f"{EXP}.html").read_text()
    assert "genrec serving report: serving" in page and 'class="maxrate"' in page
    assert build_report(results, EXP, results / "x.html").read_text().count('class="maxrate"') == 1


def test_max_rate_needs_every_lower_rate_and_few_unanswered():
    points = pd.DataFrame(
        {
            "config": ["a"] * 4 + ["b"] * 2,
            "rate": [10.0, 20.0, 30.0, 40.0, 10.0, 20.0],
            "latency_p99_ms": [50.0, 300.0, 100.0, 100.0, 50.0, 60.0],
            "unanswered_rate": [0.0, 0.0, 0.0, 0.0, 0.0, 0.2],  # b sheds a fifth of its load at 20
            "throughput_rps": [10.0, 20.0, 30.0, 40.0, 10.0, 16.0],
            "goodput_rps": [10.0, 5.0, 30.0, 40.0, 10.0, 16.0],
        }
    )
    table = max_rate_table(points, slo_ms=200, max_unanswered=0.01).set_index("config")
    assert table.loc["a", "best_rate"] == 10 and table.loc["a", "first_failing_rate"] == 20
    assert table.loc["b", "best_rate"] == 10 and table.loc["b", "first_failing_rate"] == 20
    never = max_rate_table(points, slo_ms=10, max_unanswered=0.01)
    assert never["best_rate"].map(math.isnan).all()


def test_no_load_test_rows_is_a_clear_error(tmp_path):
    with pytest.raises(UserInputError, match="genrec loadtest"):
        build_serving_report(tmp_path, "nothing", tmp_path / "x.html")
