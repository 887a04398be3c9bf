"""The report headline's rules on constructed rows: a clear winner, a tie within noise, a flat metric,
a timing measured once, and the best pick per latency budget with its quality cost."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.dashboards.headline import (
    Axis,
    build_headline,
    distinguishable,
    estimate,
    render_headline,
    verdict,
    verdict_sentence,
)

RECALL = Axis("recall@10", True, "rate", "recall@10")
P50 = Axis("latency_p50_ms", False, "timing", "latency p50", "ms")


def row(decoder, width, recall, p50, lo=None, hi=None, users=2000, seed=0, repeats=3):
    params = {"beam_width": width, "k": 10}
    out = {
        "decoder": decoder,
        "decoder_params": json.dumps(params),
        "param_beam_width": width,
        "param_k": 10,
        "recall@10": recall,
        "latency_p50_ms": p50,
        "users": users,
        "seed": seed,
        "dataset": "synth",
        "model": "tiny",
    }
    if lo is not None:
        out.update(latency_p50_lo_ms=lo, latency_p50_hi_ms=hi, repeats=repeats)
    return out


def test_clear_winner_on_both_axes():
    df = pd.DataFrame(
        [
            row("beam", 10, 0.30, 10.0, 9.5, 10.5),
            row("beam", 40, 0.45, 40.0, 38.0, 42.0),
            row("nezha", 10, 0.29, 4.0, 3.8, 4.2),
        ]
    )
    q, t = verdict(df, RECALL), verdict(df, P50)
    assert q.winner == "beam(beam_width=40)" and q.significant
    assert math.isclose(q.margin.value, 0.15)
    assert t.winner == "nezha"
    assert math.isclose(t.margin.value, 2.5)  # beam 10 (the runner-up) / nezha
    assert t.margin.lo == pytest.approx(9.5 / 4.2) and t.margin.hi == pytest.approx(10.5 / 3.8)
    assert "winner nezha" in verdict_sentence(t) and "faster" in verdict_sentence(t)


def test_tie_within_noise_crowns_nobody():
    # 0.300 vs 0.305 on 2000 users: the binomial half-widths are ~0.02 each
    df = pd.DataFrame([row("beam", 10, 0.300, 10.0, 9.0, 12.0), row("beam", 12, 0.305, 10.5, 9.5, 11.0)])
    q, t = verdict(df, RECALL), verdict(df, P50)
    assert q.winner is None and not q.significant
    assert set(q.within_noise) == {"beam(beam_width=10)", "beam(beam_width=12)"}
    assert "no significant difference" in verdict_sentence(q)
    assert t.winner is None  # intervals [9, 12] and [9.5, 11] overlap


def test_flat_metric_is_one_sentence():
    df = pd.DataFrame([row("beam", w, 0.6965, 1.0 + w, w, w + 2) for w in (10, 20, 40)])
    q = verdict(df, RECALL)
    assert q.flat and q.winner is None
    assert verdict_sentence(q) == "recall@10: 0.6965 for every configuration (no difference)."


def test_a_timing_measured_once_is_never_crowned():
    df = pd.DataFrame([row("beam", 10, 0.3, 10.0), row("beam", 12, 0.3, 12.0)])
    t = verdict(df, P50)
    assert t.winner is None and "measured once" in t.reason
    assert "measured once" in verdict_sentence(t)


def test_seeds_are_measurements_too():
    """Three seeds of one configuration: its value is their median, its interval their range."""
    rows = [row("beam", 10, 0.3, v, seed=s) for s, v in enumerate((10.0, 30.0, 11.0))]
    est = estimate(pd.DataFrame(rows), P50)
    assert (est.value, est.lo, est.hi, est.n) == (11.0, 10.0, 30.0, 3)


def test_budget_picks_name_the_cost_in_quality():
    df = pd.DataFrame(
        [
            row("beam", 10, 0.30, 10.0, 9.5, 10.5),
            row("beam", 40, 0.45, 40.0, 38.0, 42.0),
            row("nezha", 10, 0.44, 4.0, 3.8, 4.2),
        ]
    )
    h = build_headline(df, [RECALL, P50], (RECALL, P50), budgets=[3.0, 5.0, 50.0])
    picks = {p.budget: p for p in h.budgets}
    assert picks[3.0].config is None
    assert picks[5.0].config == "nezha" and not picks[5.0].cost_significant
    assert picks[50.0].config == "beam(beam_width=40)" and picks[50.0].cost.value == 0
    page = render_headline(h)
    assert "nothing fits" in page and "within noise" in page and "none (best overall)" in page


def test_noisy_configurations_are_flagged():
    df = pd.DataFrame([row("beam", 10, 0.3, 10.0, 5.0, 20.0), row("beam", 20, 0.3, 10.0, 9.9, 10.1)])
    h = build_headline(df, [RECALL, P50])
    assert h.noisy == ["beam(beam_width=10)"]


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(0.01, 0.99), min_size=2, max_size=6, unique=True),
    users=st.integers(50, 5000),
)
def test_the_crowned_rate_winner_is_the_best_median_and_clear_of_everyone(values, users):
    df = pd.DataFrame([row("beam", 10 + i, v, 1.0, users=users) for i, v in enumerate(values)])
    v = verdict(df, RECALL)
    best = max(range(len(values)), key=lambda i: values[i])
    assert v.ranked[0][0] == f"beam(beam_width={10 + best})"
    if v.winner is not None:
        ests = [e for _, e in v.ranked]
        assert all(distinguishable(RECALL, ests[0], e) for e in ests[1:])


def test_the_sweep_summary_crowns_by_the_same_rule():
    from genrec.platform.sweep.results import best_configuration

    clear = [row("beam", 10, 0.30, 10.0), row("beam", 40, 0.45, 40.0), row("nezha", 10, 0.29, 4.0)]
    best = best_configuration(clear, "recall@10", "max")
    assert best["decoder"] == "beam" and best["beam_width"] == 40 and best["significant"]
    # a tie within noise: the cheaper configuration is the best, marked as a tie (the report's rule)
    tied = [row("beam", 10, 0.300, 5.0, 4.9, 5.1), row("beam", 12, 0.305, 10.0, 9.9, 10.1)]
    best = best_configuration(tied, "recall@10", "max")
    assert best["beam_width"] == 10 and not best["significant"] and "tie" in best
    assert "(unpaired), not significant" in best["decision"]  # these rows have no per-user outcomes
    same_cost = [row("beam", 10, 0.300, 10.0), row("beam", 12, 0.305, 10.0)]
    assert best_configuration(same_cost, "recall@10", "max")["beam_width"] == 12


@pytest.mark.parametrize(
    "column, higher, kind",
    [
        ("recall@10", True, "rate"),
        ("invalid_rate", False, "rate"),
        ("latency_p50_ms", False, "timing"),
        ("kernel_ms_p99", False, "timing"),
        ("time_speedup", True, "timing"),
        ("ws", True, "timing"),
        ("best_rate", True, "timing"),  # requests per second, not a share
        ("throughput_users_per_s", True, "timing"),
    ],
)
def test_benchmark_columns_get_their_direction_by_name(column, higher, kind):
    from genrec.dashboards.page_headlines import axis_for

    a = axis_for(column)
    assert (a.higher_is_better, a.kind) == (higher, kind)


def test_benchmarks_are_compared_at_their_largest_swept_size():
    from genrec.dashboards.page_headlines import at_largest_size

    df = pd.DataFrame(
        {"param_n": [10, 100, 1000, 10, 100, 1000], "param_backend": ["a", "a", "a", "b", "b", "b"]}
    )
    picked, where = at_largest_size(df)
    assert set(picked["param_n"]) == {1000} and len(picked) == 2 and where == "at n=1000 (the largest)"


def test_error_bars_show_the_range_over_repeats_when_seeds_give_none():
    from genrec.dashboards.figures import error_bars

    rows = pd.DataFrame(
        {
            "latency_p50_ms": [10.0, 20.0],
            "latency_p50_ms_std": [float("nan"), 5.0],  # one seed; three seeds
            "latency_p50_lo_ms": [8.0, 19.0],
            "latency_p50_hi_ms": [13.0, 21.0],
        }
    )
    bars = error_bars(rows, "latency_p50_ms")
    assert bars["array"] == [3.0, 5.0] and bars["arrayminus"] == [2.0, 5.0] and not bars["symmetric"]


def test_compared_sentence_names_the_decoders_a_benchmark_varies():
    """A benchmark row's `decoder` is the benchmark; the decoders it compares are its param_decoder."""
    from genrec.dashboards.headline import compared_sentence

    df = pd.DataFrame(
        {
            "decoder": ["benchmark:xgr_serving"] * 4,
            "param_decoder": ["xgr", "xgr", "hf_beam", "hf_beam"],
            "param_policy": ["slo", "fixed", "slo", "fixed"],
            "best_rate": [400.0, 320.0, 40.0, 30.0],
        }
    )
    sentence = compared_sentence(df)
    assert sentence.startswith("4 configurations of 2 decoder(s) (hf_beam, xgr) in benchmark:xgr_serving")
    plain = compared_sentence(
        df.drop(columns="param_decoder").assign(decoder=["beam", "beam", "nezha", "nezha"])
    )
    assert plain.split(";")[0] == "4 configurations of 2 decoder(s) (beam, nezha)"
