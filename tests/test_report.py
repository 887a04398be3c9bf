"""Reports: pure table functions (config keys, seeds, Pareto front, budgets) and the standalone HTML page."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pandas as pd
import pytest
from html_tables import TableCells
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.dashboards.analysis import (
    aggregate_over_seeds,
    best_per_budget,
    config_key,
    default_budgets,
    pareto_front,
    round_up_significant,
)
from genrec.dashboards.report import build_report
from genrec.platform.tracking import write_result_row
from genrec.workloads.errors import UserInputError
from genrec.workloads.results import Environment, ResultRow
from genrec.workloads.results_store import read_results

ENV = Environment("cpu:test", 2, "2.13.0", "none", "3.11", "abc123", "host")
EXP = "rep"
DATASET = "synth<&>"  # must come out escaped
SEEDS = (0, 1, 2)
# (decoder, params, recall@10 mean, latency p50 mean); nezha stands for any later decoder with its
# own parameters (draft_width) and popular for a configuration without a beam width.
CONFIGS = [
    ("beam", {"beam_width": 1, "k": 1}, 0.10, 2.0),
    ("beam", {"beam_width": 4, "k": 4}, 0.20, 8.0),
    ("beam", {"beam_width": 8, "k": 8}, 0.30, 16.0),
    ("popular", {"k": 10}, 0.05, 0.1),
    ("nezha", {"beam_width": 4, "draft_width": 2, "k": 4}, 0.18, 1.0),
    ("nezha", {"beam_width": 4, "draft_width": 3, "k": 4}, 0.19, 3.0),
    ("nezha", {"beam_width": 8, "draft_width": 2, "k": 8}, 0.25, 2.5),
    ("nezha", {"beam_width": 8, "draft_width": 3, "k": 8}, 0.28, 5.0),
]
BUDGETS = [0.01, 0.5, 2.0, 3.0, 20.0]


def params_text(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items()))


def make_row(decoder, params, recall, lat, seed, experiment=EXP, device="cpu:test"):
    r10 = recall + 0.01 * (seed - 1) * (1 + len(params))  # seed noise, different per configuration
    quality = {"hr@5": r10 * 0.8, "hr@10": r10, "ndcg@5": r10 * 0.5, "ndcg@10": r10 * 0.6}
    quality |= {"recall@5": r10 * 0.8, "recall@10": r10, "invalid_rate": 0.0}
    p50 = lat + 0.05 * seed * seed
    env = dataclasses.replace(ENV, device=device)
    return ResultRow(
        decoder=decoder,
        decoder_params=params,
        dataset=DATASET,
        model="tiny",
        split="test",
        env=env,
        quality=quality,
        latency_ms={"mean": p50, "p50": p50, "p90": p50 * 1.2, "p99": p50 * 1.5, "std": 0.1},
        users=100,
        batch_size=16,
        seed=seed,
        experiment=experiment,
        run_id=f"{decoder}-{params_text(params).replace(', ', '-').replace('=', '')}-s{seed}",
    )


def raw_rows() -> list[ResultRow]:
    return [make_row(d, p, q, lat, s) for d, p, q, lat in CONFIGS for s in SEEDS]


def expected_means() -> dict[tuple[str, str], dict[str, float]]:
    """Per configuration, from the ResultRow objects directly (no pandas): mean/stdev over seeds."""
    groups: dict[tuple[str, str], list[ResultRow]] = {}
    for r in raw_rows():
        groups.setdefault((r.decoder, params_text(r.decoder_params)), []).append(r)
    out = {}
    for key, rows in groups.items():
        rec = [r.quality["recall@10"] for r in rows]
        lat = [r.latency_ms["p50"] for r in rows]
        out[key] = {
            "recall": statistics.mean(rec),
            "recall_std": statistics.stdev(rec),
            "lat": statistics.mean(lat),
        }
    return out


class Tables(TableCells):
    """Cell texts of every <table class=...> in a page, by class."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.current: str | None = None

    def in_table(self) -> bool:
        return self.current is not None

    def open(self, tag, attrs):
        if tag == "table":
            self.current = attrs.get("class", "")
            self.tables[self.current] = []

    def close(self, tag):
        if tag == "table":
            self.current = None

    def add_row(self, row):
        self.tables[self.current].append(row)


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    for r in raw_rows():
        write_result_row(root, r)
    write_result_row(root, make_row("beam", {"beam_width": 2, "k": 2}, 0.1, 1.0, 0, experiment="other"))
    return root


@pytest.fixture(scope="module")
def report(results_dir):
    pytest.importorskip("plotly")
    out = results_dir / "out" / "report.html"
    path = build_report(results_dir, EXP, out, title="Decoders <vs> beams", budgets_ms=BUDGETS)
    text = path.read_text()
    parser = Tables()
    parser.feed(text)
    return path, text, parser.tables


# ------------------------------------------------------------------------------------- pure functions


def test_config_key_ignores_seed_and_null_params():
    df = pd.DataFrame(
        {
            "decoder": ["beam", "popular", "nezha"],
            "param_beam_width": [10.0, float("nan"), 4.0],
            "param_k": [10, 10, 4],
            "param_seed": [1, 2, 3],
            "param_draft_width": [None, None, 2],
        }
    )
    assert config_key(df).tolist() == [
        "beam(beam_width=10, k=10)",
        "popular(k=10)",
        "nezha(beam_width=4, draft_width=2, k=4)",
    ]


def test_aggregate_over_seeds_mean_std_count(results_dir):
    df = read_results(results_dir, EXP)
    agg = aggregate_over_seeds(df).set_index("config")
    assert len(agg) == len(CONFIGS) and (agg["n"] == len(SEEDS)).all()
    assert (agg["seeds"] == "0,1,2").all() and (agg["setting"] == "").all()
    for (decoder, ptext), exp in expected_means().items():
        row = agg.loc[f"{decoder}({ptext})"]
        assert row["recall@10"] == pytest.approx(exp["recall"])
        assert row["recall@10_std"] == pytest.approx(exp["recall_std"])  # sample std, ddof=1
        assert row["latency_p50_ms"] == pytest.approx(exp["lat"])
    # a varying context column (device) separates otherwise identical configurations
    two = pd.DataFrame([make_row("beam", {"beam_width": 2}, 0.1, 1.0, 0, device=d).to_flat() for d in "ab"])
    agg2 = aggregate_over_seeds(two)
    assert agg2["setting"].tolist() == ["device=a", "device=b"] and agg2["recall@10_std"].isna().all()


def brute_front(points, minimize_x, maximize_y):
    sx, sy = (1 if minimize_x else -1), (1 if maximize_y else -1)
    ok = [i for i, (x, y) in enumerate(points) if not (math.isnan(x) or math.isnan(y))]
    front = set()
    for i in ok:
        xi, yi = sx * points[i][0], sy * points[i][1]
        dominated = any(
            sx * points[j][0] <= xi
            and sy * points[j][1] >= yi
            and (sx * points[j][0] < xi or sy * points[j][1] > yi)
            for j in ok
        )
        if not dominated:
            front.add(i)
    return front


coord = st.one_of(st.integers(0, 6).map(float), st.floats(0, 100, allow_nan=False), st.just(float("nan")))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(coord, coord), max_size=30), st.booleans(), st.booleans())
def test_pareto_front_matches_brute_force(points, minimize_x, maximize_y):
    df = pd.DataFrame(points, columns=["lat", "q"], index=[f"r{i}" for i in range(len(points))], dtype=float)
    front = pareto_front(df, "lat", "q", minimize_x=minimize_x, maximize_y=maximize_y)
    got = {int(i[1:]) for i in front.index}
    assert got == brute_front(points, minimize_x, maximize_y)
    xs = front["lat"].tolist() if minimize_x else [-x for x in front["lat"]]
    assert xs == sorted(xs)  # best x first


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 20).map(float), st.integers(0, 5).map(float)), max_size=20),
    st.lists(st.integers(-1, 22).map(float), max_size=5),
)
def test_best_per_budget_matches_brute_force(points, budgets):
    df = pd.DataFrame(points, columns=["lat", "q"], dtype=float)
    table = best_per_budget(df, "lat", "q", budgets)
    assert table["budget_ms"].tolist() == budgets
    for b, (_, row) in zip(budgets, table.iterrows()):
        fits = [(q, -lat, -i) for i, (lat, q) in enumerate(points) if lat <= b]
        if not fits:
            assert math.isnan(row["q"])
            continue
        q, neg_lat, _ = max(fits)
        assert (row["q"], row["lat"]) == (q, -neg_lat)


def test_budget_rounding():
    assert round_up_significant(12.34) == 13 and round_up_significant(0.01234) == 0.013
    assert round_up_significant(40.0) == 40
    assert default_budgets([1.0, 2.0, 3.0, 4.0, 40.0]) == [1.4, 2.0, 3.0, 4.0, 40.0]
    assert default_budgets([float("nan")]) == []


# ------------------------------------------------------------------------------------------ the page


def test_report_is_standalone_offline_html(report, results_dir, tmp_path):
    import plotly.offline

    path, text, _ = report
    bundle = plotly.offline.get_plotlyjs()
    assert path.is_file() and text.startswith("<!DOCTYPE html>")
    # offline: no CDN, no stylesheet; plotly.js from the file beside the page, referenced relatively
    assert text.count("<script src") == 1 and '<script src="plotly.min.js"' in text
    assert 'src="//' not in text and 'src="http' not in text and "<link" not in text
    assert (path.parent / "plotly.min.js").read_text() == bundle and bundle[:300] not in text
    assert len(text) < 400_000  # not 4.9 MB of embedded plotly.js
    assert text.count("Plotly.newPlot(") == 3  # quality, latency, Pareto
    assert not list(path.parent.glob(".*tmp*"))  # atomic write left no temp file
    # --embed-plotlyjs: one self-contained file, the bundle inside exactly once, nothing beside it
    single = build_report(results_dir, EXP, tmp_path / "single.html", embed_plotlyjs=True).read_text()
    assert "<script src" not in single and single.count(bundle[:300]) == 1
    assert not (tmp_path / "plotly.min.js").exists()


def test_report_names_every_decoder_and_escapes_strings(report):
    _, text, tables = report
    for name in ("beam", "popular", "nezha (draft_width=2)", "nezha (draft_width=3)"):
        assert name in text
    assert "popular(k=10) (baseline)" in text  # a baseline is annotated, not drawn as a line
    assert "Decoders &lt;vs&gt; beams" in text and "Decoders <vs> beams" not in text
    assert "synth&lt;&amp;&gt;" in text and DATASET not in text
    prov = {row[0]: row[1] for row in tables["prov"]}
    assert prov["experiments"] == EXP and prov["datasets"] == DATASET and prov["git commits"] == "abc123"
    assert prov["result rows"].startswith(f"{len(CONFIGS) * len(SEEDS)} ")
    assert "genrec report --results-dir" in text and f"--experiment {EXP}" in text


def test_report_pareto_front_and_budgets_are_right(report):
    _, _, tables = report
    means = expected_means()
    keys = list(means)
    points = [(means[k]["lat"], means[k]["recall"]) for k in keys]
    expected_front = {keys[i] for i in brute_front(points, True, True)}
    assert expected_front == {  # sanity of the fixture itself
        ("popular", "k=10"),
        ("nezha", "beam_width=4, draft_width=2, k=4"),
        ("nezha", "beam_width=8, draft_width=2, k=8"),
        ("nezha", "beam_width=8, draft_width=3, k=8"),
        ("beam", "beam_width=8, k=8"),
    }
    front_rows = tables["front"][1:]
    assert {(r[0], r[1]) for r in front_rows} == expected_front
    assert [float(r[3].split(" ")[0]) for r in front_rows] == sorted(
        float(r[3].split(" ")[0]) for r in front_rows
    )

    # the decision table: one row per given budget that a compared decoder fits (the baseline is not
    # ranked); the deployed configuration fits its budget
    budget_rows = tables["decision-table"][1:]
    compared = [k for k in keys if k[0] != "popular"]
    fitting = [b for b in BUDGETS if any(means[k]["lat"] <= b for k in compared)]
    assert len(budget_rows) == len(fitting)
    for b, row in zip(fitting, budget_rows):
        assert row[0].startswith(f"≤ {b:g}".rstrip("0").rstrip(".")) or float(row[0].split()[1]) == b
        assert float(row[3].split()[0]) <= b


def test_report_configuration_table_has_std_over_seeds(report):
    _, _, tables = report
    rows = tables["configs"]
    col = rows[0].index("recall@10")
    by_key = {(r[0], r[1]): r for r in rows[1:]}
    assert len(by_key) == len(CONFIGS)
    for key, exp in expected_means().items():
        assert by_key[key][col] == f"{exp['recall']:.4f} ± {exp['recall_std']:.4f}"
        assert by_key[key][2] == "3 (0,1,2)"


def test_empty_and_unknown_experiment_errors(results_dir, tmp_path):
    with pytest.raises(
        UserInputError, match=r"no results for experiment 'nope'.*genrec sweep.*\['other', 'rep'\]"
    ):
        build_report(results_dir, "nope", tmp_path / "x.html")
    with pytest.raises(UserInputError, match=r"no results for any experiment.*\[\]"):
        build_report(tmp_path / "empty", None, tmp_path / "x.html")
    with pytest.raises(UserInputError, match="available quality metrics"):
        build_report(results_dir, EXP, tmp_path / "x.html", metric="mrr@3")
    with pytest.raises(UserInputError, match="--latency"):
        build_report(results_dir, EXP, tmp_path / "x.html", latency="p42")
    assert not (tmp_path / "x.html").exists()


def test_cli_report_command(results_dir):
    pytest.importorskip("plotly")
    import typer
    from typer.testing import CliRunner

    from genrec.platform.commands.report import parse_budgets, register

    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    res = CliRunner().invoke(app, ["report", "--results-dir", str(results_dir), "--latency", "p99"])
    assert res.exit_code == 0, res.output
    out = results_dir / "reports" / "index.html"  # no --experiment: the index and one page per experiment
    assert out.is_file() and str(out.resolve()) in res.output and out.resolve().as_uri() in res.output
    for name in ("other", "rep"):
        page = results_dir / "reports" / f"{name}.html"
        assert page.is_file() and str(page.resolve()) in res.output
        assert f"--experiment {name}" in page.read_text() and "--latency p99" in page.read_text()
    res = CliRunner().invoke(
        app, ["report", "--results-dir", str(results_dir), "--experiment", EXP, "--embed-plotlyjs"]
    )
    assert res.exit_code == 0, res.output
    assert "<script src" not in (results_dir / "reports" / f"{EXP}.html").read_text()
    assert parse_budgets("50,10") == [10.0, 50.0] and parse_budgets(None) is None
    with pytest.raises(UserInputError, match="--budgets"):
        parse_budgets("10,fast")
