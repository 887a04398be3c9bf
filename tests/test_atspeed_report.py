"""Issue 16's report page (studies/atspeed/report.py) built from constructed `atspeed_arm` rows: the headline
tables hold numbers computed here independently (statistics / scipy), and the shipped AtSpeed experiment
files load and validate without Ray."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO
from html_tables import TableCells

from genrec.studies.atspeed.report import build_atspeed_report
from genrec.studies.atspeed.report_rows import is_atspeed_frame

SEEDS = (42, 43, 44)
KS = (1, 10)
MAIN = ("sft", "wordkd", "seqkd", "tvdkd", "atspeed_s", "atspeed_r")
ABLATED = {"strict": ("atspeed_s-no_dr", "atspeed_s-no_ca"), "relaxed": ("atspeed_r-no_ca", "atspeed_r-top1")}
ALL_STEPS = {"strict": ("atspeed_s-ad",), "relaxed": ("atspeed_r-ad",)}  # Table 5's w/ AD
BASE_WS = {
    "sft": 1.3,
    "wordkd": 1.4,
    "seqkd": 1.6,
    "tvdkd": 1.3,
    "atspeed_s": 1.9,
    "atspeed_r": 1.7,
    "atspeed_s-no_dr": 1.6,
    "atspeed_s-no_ca": 1.5,
    "atspeed_r-no_ca": 1.5,
    "atspeed_r-top1": 1.4,
    "atspeed_s-ad": 2.0,
    "atspeed_r-ad": 1.8,
}


def make_row(rng, objective, verification, k, seed, n=40, gamma=3, tree=True, **extra) -> dict:
    """One row shaped like a sweep's (benchmark_row): param_* columns, seed, environment and metrics."""
    ws = BASE_WS[objective] + (0.2 if verification == "relaxed" else 0.0) + rng.normal(0, 0.05)
    ref = 0.3 + rng.normal(0, 0.01)
    row = {
        "experiment": f"atspeed_{verification}",
        "run_id": f"{objective}-{verification}-{k}-{n}-{gamma}-{tree}-{seed}",
        "benchmark": "atspeed_arm",
        "decoder": "benchmark:atspeed_arm",
        "param_objective": objective,
        "param_verification": verification,
        "param_k": k,
        "param_draft_beams": n,
        "param_gamma": gamma,
        "param_tree_attention": tree,
        "param_data": "/repo/runs/data/synth",
        "param_users": 128,
        "seed": seed,
        "dataset": "",
        "ws": ws if tree else ws - 0.4,
        "accepted_steps": ws - 0.5,  # AS follows WS here; w/o TA keeps the acceptance
        "target_calls": 2.0,
        "acceptance_level_1": min(1.0, 0.5 + ws / 4),
        "acceptance_level_2": min(1.0, ws / 4),
        f"reference_recall@{k}": ref,
        f"atspeed_recall@{k}": ref - 0.01 + rng.normal(0, 0.005),
        f"reference_ndcg@{k}": ref / 2,
        f"atspeed_ndcg@{k}": ref / 2 + rng.normal(0, 0.005),
        "users": 128,
        "device": "cpu",
        "threads": 1,
        "torch_version": "t",
        "git_commit": "g",
        "created_at": "2026-01-01T00:00:00+00:00",
    }
    if verification == "strict":
        row["identical_share"] = 1.0
    return row | extra


def fake_rows(curves: bool = True) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for verification in ("strict", "relaxed"):
        for objective in (*MAIN, *ABLATED[verification], *ALL_STEPS[verification]):
            for k in KS:
                rows += [make_row(rng, objective, verification, k, s) for s in SEEDS]
        full = "atspeed_s" if verification == "strict" else "atspeed_r"
        rows += [make_row(rng, full, verification, k, s, tree=False) for k in KS for s in SEEDS]
    if curves:  # atspeed_n_gamma.yaml: N x gamma at K = 10 (N = 40, gamma = 3 repeats a Table 1 cell)
        for n in (20, 40):
            for g in (2, 3):
                rows += [
                    make_row(rng, "atspeed_s", "strict", 10, s, n=n, gamma=g, created_at="2026-01-02")
                    for s in SEEDS
                ]
    return pd.DataFrame(rows)


class Sections(TableCells):
    """Cell texts of every table, by the id of the <section> holding it."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[list[str]]]] = {}
        self.section = ""

    def open(self, tag, attrs):
        if tag == "section":
            self.section = attrs["id"]
        elif tag == "table":
            self.tables.setdefault(self.section, []).append([])

    def add_row(self, row):
        self.tables[self.section][-1].append(row)


def parse(html: str) -> dict[str, list[list[list[str]]]]:
    p = Sections()
    p.feed(html)
    return p.tables


def as_dicts(table: list[list[str]]) -> list[dict[str, str]]:
    return [dict(zip(table[0], row)) for row in table[1:]]


def mean_std(values: list[float], digits: int) -> str:
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def values(df: pd.DataFrame, metric: str, **setting) -> list[float]:
    """metric per seed (seed order) for rows matching param_<name> == value."""
    rows = df
    defaults = {"draft_beams": 40, "gamma": 3, "tree_attention": True}
    for name, value in (defaults | setting).items():
        rows = rows[rows[f"param_{name}"] == value]
    rows = rows.drop_duplicates("seed", keep="last").sort_values("seed")
    assert list(rows["seed"]) == list(SEEDS)
    return rows[metric].tolist()


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[pd.DataFrame, dict, str]:
    df = fake_rows()
    html = build_atspeed_report(df, tmp_path_factory.mktemp("r") / "a.html", "AtSpeed").read_text()
    return df, parse(html), html


def test_table1_has_ws_and_as_per_objective_verification_and_k(page):
    df, tables, _ = page
    [table1] = tables["d0-table1"]
    assert table1[0] == ["verification", "objective", "seeds", "WS@1", "WS@10", "AS@1", "AS@10"]
    rows = {(r["verification"], r["objective"]): r for r in as_dicts(table1)}
    labels = ["SFT", "WordKD", "SeqKD", "TVDKD", "AtSpeed-S", "AtSpeed-R"]
    assert list(rows) == [(v, o) for v in ("strict", "relaxed") for o in labels]  # no ablations here
    for verification in ("strict", "relaxed"):
        for objective, name in zip(MAIN, labels):
            cells = rows[(verification, name)]
            assert cells["seeds"] == "42, 43, 44"
            for k in KS:
                # the N x gamma sweep's later row at (40, 3) replaces the first for atspeed_s strict K=10
                ws = values(df, "ws", objective=objective, verification=verification, k=k)
                acc = values(df, "accepted_steps", objective=objective, verification=verification, k=k)
                assert cells[f"WS@{k}"].removesuffix(" *") == mean_std(ws, 2)
                assert cells[f"AS@{k}"].removesuffix(" *") == mean_std(acc, 2)
        for k in KS:  # the best mean of each column is starred, and only it
            best = max(
                MAIN,
                key=lambda o: statistics.mean(values(df, "ws", objective=o, verification=verification, k=k)),
            )
            starred = [
                o for o, name in zip(MAIN, labels) if rows[(verification, name)][f"WS@{k}"].endswith(" *")
            ]
            assert starred == [best]


def test_acceptance_per_level(page):
    df, tables, html = page
    table = as_dicts(tables["d0-levels"][0])
    row = next(r for r in table if (r["verification"], r["objective"], r["K"]) == ("relaxed", "SeqKD", "1"))
    lv2 = values(df, "acceptance_level_2", objective="seqkd", verification="relaxed", k=1)
    assert row["level 2"] == mean_std(lv2, 3)
    from genrec.dashboards.figure_audit import figures_in_html

    levels = next(f for f in figures_in_html(html) if "drafted level j" in str(f["layout"]["xaxis"]))
    yaxis = levels["layout"]["yaxis"]
    assert yaxis["title"]["text"] == "acceptance rate at level j (share, 0–1)"
    assert yaxis["range"] == [-0.02, 1.02]


def test_ablations_are_paired_by_seed_against_the_full_objective(page):
    stats = pytest.importorskip("scipy.stats")
    df, tables, _ = page
    table = as_dicts(tables["d0-ablations"][0])
    got = {(r["verification"], r["full objective"], r["variant"], r["K"]) for r in table}
    expected = {
        ("strict", "AtSpeed-S", v, str(k)) for v in ("w/o DR", "w/o CA", "w/ AD", "w/o TA") for k in KS
    }
    relaxed = ("w/o CA", "w/o top-K", "w/ AD", "w/o TA")
    expected |= {("relaxed", "AtSpeed-R", v, str(k)) for v in relaxed for k in KS}
    assert got == expected
    for variant, setting in (
        ("w/o DR", {"objective": "atspeed_s-no_dr"}),
        ("w/ AD", {"objective": "atspeed_s-ad"}),
        ("w/o TA", {"objective": "atspeed_s", "tree_attention": False}),
    ):
        row = next(r for r in table if (r["verification"], r["variant"], r["K"]) == ("strict", variant, "10"))
        full = values(df, "ws", objective="atspeed_s", verification="strict", k=10)
        ablated = values(df, "ws", **({"verification": "strict", "k": 10} | setting))
        diffs = [a - f for a, f in zip(ablated, full)]
        assert row["paired seeds"] == "3" and row["WS@K full"] == mean_std(full, 2)
        assert row["WS@K variant"] == mean_std(ablated, 2) and row["ΔWS (variant - full)"] == mean_std(
            diffs, 2
        )
        p = stats.ttest_rel(ablated, full, alternative="less").pvalue
        assert row["p (H1: variant WS below)"] == f"{p:.3f}"


def test_table2_relaxed_against_target_sampling_with_a_one_sided_paired_t_test(page):
    stats = pytest.importorskip("scipy.stats")
    df, tables, _ = page
    table = {r["metric"]: r for r in as_dicts(tables["d0-table2"][0])}
    assert list(table) == ["Recall@1", "Recall@10", "NDCG@1", "NDCG@10"]
    for family, name in (("recall", "Recall"), ("ndcg", "NDCG")):
        row = table[f"{name}@10"]
        ref = values(df, f"reference_{family}@10", objective="atspeed_r", verification="relaxed", k=10)
        at = values(df, f"atspeed_{family}@10", objective="atspeed_r", verification="relaxed", k=10)
        greedy = values(df, f"reference_{family}@10", objective="atspeed_s", verification="strict", k=10)
        res = stats.ttest_rel(at, ref, alternative="less")
        assert row["target sampling (T=1)"] == mean_std(ref, 4) and row["AtSpeed-R relaxed"] == mean_std(
            at, 4
        )
        assert row["target beam search (T=0)"] == mean_std(greedy, 4)
        assert row["Δ (AtSpeed-R - target sampling)"] == mean_std([a - r for a, r in zip(at, ref)], 4)
        assert row["t"] == f"{res.statistic:.2f}" and row["p (H1: AtSpeed-R below)"] == f"{res.pvalue:.3f}"
        assert row["verdict"] == ("significantly below" if res.pvalue < 0.05 else "not significantly below")
        ws = values(df, "ws", objective="atspeed_r", verification="relaxed", k=10)
        assert row["WS@K vs target sampling"] == mean_std(ws, 2)


def test_strict_identical_share_is_shown_and_checked(page, tmp_path):
    _, tables, html = page
    assert "every strict row has identical_share = 1.0" in html
    rows = as_dicts(tables["d0-identical"][0])
    assert {r["min identical_share @K=10"] for r in rows} == {"1.0000"}
    assert ("AtSpeed-S", "off") in {(r["objective"], r["tree attention"]) for r in rows}
    df = fake_rows(curves=False)
    df.loc[(df["param_verification"] == "strict") & (df["seed"] == 43), "identical_share"] = 0.5
    df.loc[(df["param_objective"] != "sft") & (df["seed"] == 43), "identical_share"] = 1.0
    broken = build_atspeed_report(df, tmp_path / "b.html", "x").read_text()
    assert "NOT lossless: 2 of" in broken  # sft at K = 1 and K = 10, seed 43
    sft = next(r for r in as_dicts(parse(broken)["d0-identical"][0]) if r["objective"] == "SFT")
    assert sft["min identical_share @K=1"] == "0.5000"


def test_n_and_gamma_curves_only_when_they_vary(page, tmp_path):
    df, tables, html = page
    assert "Draft beam size N (Figure 4)" in html and "Draft length gamma (appendix Figure 6)" in html
    assert "draft beams N" in html and "draft length gamma (levels per SD step)" in html
    settings = as_dicts(tables["d0-curves"][0])
    row = next(r for r in settings if (r["N"], r["gamma"]) == ("20", "2"))
    ws = values(df, "ws", objective="atspeed_s", verification="strict", k=10, draft_beams=20, gamma=2)
    assert row["WS@K"] == mean_std(ws, 2) and row["rows"] == "3"
    flat = build_atspeed_report(fake_rows(curves=False), tmp_path / "f.html", "x").read_text()
    assert "do not vary in these rows" in flat and "Figure 4)" not in flat


def test_report_command_dispatches_atspeed_rows(tmp_path):
    import plotly.offline

    from genrec.dashboards.report import build_report
    from genrec.platform.tracking import write_result_row

    df = fake_rows(curves=False)
    assert is_atspeed_frame(df) and not is_atspeed_frame(df.assign(benchmark="nezha_arm"))
    for row in df.to_dict("records"):
        write_result_row(
            tmp_path, {k: v for k, v in row.items() if not pd.isna(v)} | {"experiment": "atspeed"}
        )
    html = Path(build_report(tmp_path, "atspeed", tmp_path / "r.html")).read_text()
    assert "synth: WS@K and AS@K (Table 1)" in html and "Provenance" in html
    # offline: plotly.js loaded once from the file beside the page; figures: levels, ablations
    assert html.count('<script src="plotly.min.js"') == 1 and plotly.offline.get_plotlyjs()[:300] not in html
    assert (tmp_path / "plotly.min.js").is_file()
    assert html.count("Plotly.newPlot(") == 2


@pytest.mark.parametrize(
    ("name", "trials", "grid"),
    [
        ("atspeed_strict", 120, {"objective": 8, "k": 5}),
        ("atspeed_relaxed", 120, {"objective": 8, "k": 5}),
        ("atspeed_strict_beauty", 120, {"objective": 8, "k": 5}),
        ("atspeed_relaxed_beauty", 120, {"objective": 8, "k": 5}),
        ("atspeed_no_ta", 60, {"verification": 2, "objective": 2, "k": 5}),
        ("atspeed_n_gamma", 48, {"draft_beams": 4, "gamma": 4}),
        ("atspeed_all_steps", 48, {"verification": 2, "objective": 4, "k": 2}),
    ],
)
def test_shipped_atspeed_experiments_validate(name, trials, grid):
    from genrec.platform.benchmarks import get_benchmark
    from genrec.platform.experiment_loading import load_experiment
    from genrec.studies.atspeed.atspeed_arms import OBJECTIVES

    cfg = load_experiment(
        REPO / "studies" / "atspeed" / "experiments" / f"{name}.yaml", base_dir=REPO, check_files=False
    )
    assert cfg.benchmark == "atspeed_arm" and cfg.metric in get_benchmark("atspeed_arm").metrics
    assert cfg.num_trials() == trials and cfg.seeds == [42, 43, 44]
    space = cfg.grid_values()
    assert {k: len(v) for k, v in space.items()} == grid
    if "k" in space:
        assert space["k"] == ([10, 20] if name == "atspeed_all_steps" else [1, 3, 5, 10, 20])
    assert set(space.get("objective", [])) <= set(OBJECTIVES)  # every arm names a known draft objective
    if "objective" in space and len(space["objective"]) == 8:  # Table 1's six + two ablations
        assert set(MAIN) <= set(space["objective"]) <= set(OBJECTIVES)
        verification = cfg.params["verification"]
        assert set(space["objective"]) - set(MAIN) == set(ABLATED[verification])
    # one results folder for every AtSpeed sweep: `genrec report --results-dir` shows them on one page
    assert Path(cfg.tracking.results_dir).name == "atspeed"
    assert Path(cfg.params["data"]).is_absolute()
