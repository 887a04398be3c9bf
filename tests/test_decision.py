"""The deployment decision (dashboards/decision.py): paired per-user tests, the cheapest among ties,
budgets from the Pareto front, and one Decision object behind the headline and the body."""

from __future__ import annotations

import numpy as np
import pytest

from genrec.dashboards.decision import decide, render_decision
from genrec.dashboards.headline import Axis
from genrec.platform.tracking import write_result_row
from genrec.workloads.per_user import per_user_table, write_per_user
from genrec.workloads.results import Environment, ResultRow
from genrec.workloads.results_store import read_results

USERS = 2000
EXP = "paired"
RECALL = Axis("recall@10", True, "rate", "recall@10")
LATENCY = Axis("latency_p50_ms", False, "timing", "latency p50", "ms")


def store(root, decoder: str, width: int, hits: np.ndarray, p50: float) -> None:
    """One trial: its row (recall = share of hits) and its per-user outcomes (a hit at rank 1);
    width 0: a decoder without a beam width (the popular baseline)."""
    env = Environment("cpu:test", 1, "2.13", "none", "3.11", "abc", "host", load_1m=0.5)
    run_id = f"{decoder}-{width}"
    params = {"beam_width": width, "k": 10} if width else {"k": 10}
    recall = float(hits.mean())
    row = ResultRow(
        decoder=decoder,
        decoder_params=params,
        dataset="synth",
        model="tiny",
        split="test",
        env=env,
        quality={"recall@10": recall, "hr@10": recall},
        latency_ms={"p50": p50, "p50_lo": p50 * 0.95, "p50_hi": p50 * 1.05, "p99": p50 * 1.3},
        users=USERS,
        batch_size=100,
        repeats=3,
        experiment=EXP,
        run_id=run_id,
    )
    write_result_row(root, row)
    ranked = [[u] if h else [-1] for u, h in enumerate(hits)]
    batches = [p50] * (USERS // 100)
    table = per_user_table(list(range(USERS)), ranked, [[u] for u in range(USERS)], 100, batches)
    write_per_user(root, EXP, run_id, table)


def paired_but_not_unpaired(root) -> None:
    """beam-10 hits 550 users; nezha hits 520 of the same (a subset): -0.015 is far outside the paired
    interval but inside the unpaired one (± 0.027 on 2000 users)."""
    rng = np.random.default_rng(0)
    beam = np.zeros(USERS, bool)
    beam[rng.choice(USERS, 550, replace=False)] = True
    nezha = beam.copy()
    nezha[np.flatnonzero(beam)[:30]] = False
    store(root, "beam", 10, beam, 10.0)
    store(root, "nezha", 10, nezha, 5.0)


def test_a_difference_significant_only_paired_is_reported_as_significant(tmp_path):
    paired_but_not_unpaired(tmp_path)
    df = read_results(tmp_path, EXP)
    dec = decide(df, RECALL, LATENCY, tmp_path)
    assert dec.paired and dec.reference == "beam"  # beam at its default width (10)
    fast, full = dec.choices  # one row per Pareto point: nezha at 5 ms, beam at 10 ms
    assert fast.deploy == "nezha" and fast.vs_reference.paired and fast.vs_reference.significant
    assert fast.vs_reference.value == pytest.approx(-0.015)
    assert full.deploy.startswith("beam") and not full.tie  # nezha is significantly below: no tie
    text = render_decision(dec)
    assert "deploy nezha: 2.00x faster than beam-10" in text
    assert "recall@10 -0.0150" in text and "(paired), significant" in text
    # without the per-user outcomes the same rows compare unpaired: not significant, and nezha ties
    unpaired = decide(df, RECALL, LATENCY, None)
    assert not unpaired.paired and unpaired.best.deploy == "nezha" and unpaired.best.tie
    assert "(unpaired), not significant" in render_decision(unpaired)


def test_among_ties_best_is_the_cheaper_everywhere(tmp_path):
    from genrec.platform.sweep.results import best_configuration

    rng = np.random.default_rng(1)
    beam = np.zeros(USERS, bool)
    beam[rng.choice(USERS, 550, replace=False)] = True
    nezha = beam.copy()
    nezha[np.flatnonzero(beam)[:2]] = False  # two users: not significant even paired
    store(tmp_path, "beam", 10, beam, 10.0)
    store(tmp_path, "nezha", 10, nezha, 5.0)
    df = read_results(tmp_path, EXP)
    dec = decide(df, RECALL, LATENCY, tmp_path)
    assert dec.best.deploy == "nezha" and dec.best.tie and dec.best.best.startswith("beam")
    best = best_configuration(df.to_dict("records"), "recall@10", "max", tmp_path)
    assert best["decoder"] == "nezha" and "tie" in best and not best["significant"]
    assert best["decision"].startswith("Within 10.0 ms: deploy nezha: 2.00x faster than beam-10")


def test_headline_and_body_show_the_same_decision_object(tmp_path, monkeypatch):
    pytest.importorskip("plotly")
    import genrec.dashboards.decision as decision
    import genrec.dashboards.decoders as decoders
    from genrec.dashboards.report import build_report

    paired_but_not_unpaired(tmp_path)
    seen: list[int] = []
    real = decision.decision_table

    def spy(dec):
        seen.append(id(dec))
        return real(dec)

    monkeypatch.setattr(decision, "decision_table", spy)
    monkeypatch.setattr(decoders, "decision_table", spy)
    page = build_report(tmp_path, EXP, tmp_path / "r.html")
    assert len(seen) == 2 and seen[0] == seen[1]  # the headline's table and the body's: one object
    text = page.read_text()
    first = text.index('<ul class="decision-sentences"><li>')
    assert first < text.index('class="sub"')  # the decision comes before anything else but the title


def test_rows_of_two_datasets_are_never_paired(tmp_path):
    paired_but_not_unpaired(tmp_path)
    df = read_results(tmp_path, EXP)
    df.loc[df["decoder"] == "nezha", "dataset"] = "other"  # same user ids, other users
    assert not decide(df, RECALL, LATENCY, tmp_path).paired
