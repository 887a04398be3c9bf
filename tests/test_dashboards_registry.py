"""The report registry with an experiment whose rows are of several kinds: the page draws the kind of
most rows, and the rows it leaves out are named in a warning (stderr and the page), not dropped
silently."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from genrec.dashboards.page import PageContext, ReportOptions
from genrec.dashboards.registry import BENCHMARK, PAGES, build_page, row_kinds


def mixed_rows() -> pd.DataFrame:
    """Three benchmark rows and two `genrec eval` rows (no benchmark) in one experiment."""
    return pd.DataFrame(
        {
            "experiment": ["mix"] * 5,
            "run_id": ["mix-b1", "mix-b2", "mix-b3", "mix-e1", "mix-e2"],
            "benchmark": ["static_scaling"] * 3 + [None, None],
            "decoder": ["benchmark:static_scaling"] * 3 + ["beam", "beam"],
        }
    )


def test_the_warning_names_the_experiment_the_kinds_and_the_rows_left_out():
    from genrec.dashboards.registry import mixed_kinds_warning

    df = mixed_rows()
    text = mixed_kinds_warning("mix", df, row_kinds(df), BENCHMARK)
    assert "'mix'" in text and "benchmark: 3 rows, decoders: 2 rows" in text
    assert "leaves out 2 rows" in text and "run ids mix-e1, mix-e2" in text
    one_kind = df[df["benchmark"].notna()]
    assert mixed_kinds_warning("mix", one_kind, row_kinds(one_kind), BENCHMARK) == ""


def test_a_mixed_experiment_draws_its_main_kind_and_warns_about_the_rest(tmp_path, monkeypatch, capsys):
    drawn: dict[str, object] = {}

    def fake_build(rows, out, title, options, context) -> Path:
        drawn.update(rows=rows, headline=context.headline)
        return out

    monkeypatch.setitem(PAGES, BENCHMARK, replace(PAGES[BENCHMARK], build=fake_build))
    context = PageContext(headline='<div class="headline">h</div>')
    kind, _ = build_page(mixed_rows(), tmp_path / "mix.html", None, ReportOptions(), context, "mix")

    assert kind == BENCHMARK and drawn["rows"]["run_id"].tolist() == ["mix-b1", "mix-b2", "mix-b3"]
    err = capsys.readouterr().err
    assert err.startswith("warning: experiment 'mix' mixes result kinds") and "mix-e1, mix-e2" in err
    assert drawn["headline"].startswith('<div class="headline">h</div>')
    assert "leaves out 2 rows" in drawn["headline"]
