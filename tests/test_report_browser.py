"""Every report kind opened in headless Chromium, as a user would (issue 19's acceptance).

The pages come from a small real sweep (a multi-decoder experiment on Ray: beam at two widths and the
popular baseline, timed passes) plus constructed rows of every other kind (NEZHA arms, AtSpeed, MaRI,
STATIC benchmark lines, load tests) and one decoder experiment with a clear winner. In the browser:
no console errors, no network request, a headline on every page, every drawn axis titled, and the
headline's winner equal to the one computed here, independently, from the Parquet rows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import run_cli

pytest.importorskip("playwright", reason="playwright is not installed (pip install playwright)")

from genrec.dashboards.browser import audit_page, find_chromium  # noqa: E402
from genrec.platform.tracking import write_result_row  # noqa: E402
from genrec.workloads.results_store import read_results

if find_chromium() is None:
    pytest.skip("no Chromium on this machine (apt-get install chromium)", allow_module_level=True)

from test_report_style import EXPERIMENTS  # noqa: E402
from test_report_style import results as style_results  # noqa: E402,F401 (a fixture)

from genrec.workloads.results import Environment, ResultRow  # noqa: E402

USERS = 2000


def clear_winner_rows() -> list[ResultRow]:
    """beam at width 40 is far better than width 10 and than nezha; nezha is far faster."""
    env = Environment("cpu:test", 1, "2.13", "none", "3.11", "abc", "host", load_1m=0.5)
    configs = [("beam", 10, 0.20, 10.0), ("beam", 40, 0.30, 40.0), ("nezha", 10, 0.19, 3.0)]
    rows = []
    for decoder, width, recall, p50 in configs:
        rows.append(
            ResultRow(
                decoder=decoder,
                decoder_params={"beam_width": width, "k": 10},
                dataset="synth",
                model="tiny",
                split="test",
                env=env,
                quality={"recall@10": recall, "hr@10": recall},
                latency_ms={"p50": p50, "p50_lo": p50 * 0.95, "p50_hi": p50 * 1.05, "p99": p50 * 1.3},
                users=USERS,
                batch_size=64,
                repeats=3,
                experiment="clear_winner",
                run_id=f"{decoder}-{width}",
            )
        )
    return rows


@pytest.fixture(scope="module")
def swept(ray_session, synth_dir, tiny_model_dir, tmp_path_factory) -> Path:
    """A real multi-decoder sweep through `genrec sweep` (Ray Tune, Parquet, MLflow, the report)."""
    root = tmp_path_factory.mktemp("browser")
    experiment = {
        "name": "small_demo",
        "description": "browser test: beam at two widths and popular, timed passes",
        "dataset": {"path": str(synth_dir)},
        "model": {"checkpoint": str(tiny_model_dir)},
        "arms": [
            {"decoder": "beam", "params": {"k": 10}, "search_space": {"beam_width": {"grid": [10, 20]}}},
            {"decoder": "popular", "params": {"k": 10}},
        ],
        "eval": {"ks": [10], "max_users": 32, "batch_size": 16, "repeats": 2, "threads": 1},
        "resources": {"cpu": 0.5, "gpu": 0},
        "tracking": {"results_dir": str(root / "results")},
    }
    path = root / "small_demo.yaml"
    path.write_text(yaml.safe_dump(experiment))
    assert run_cli(["sweep", str(path), "--quiet"]) == 0
    return root / "results"


def independent_best(df: pd.DataFrame, metric: str) -> tuple[str, float, float]:
    """(best configuration as 'decoder(beam_width=W)', its value, the runner-up's) from plain pandas:
    median over rows of each (decoder, decoder_params); the baseline `popular` is not ranked."""
    df = df[df["decoder"] != "popular"]
    keys = df["decoder"] + "|" + df["decoder_params"]
    medians = df.groupby(keys)[metric].median().sort_values(ascending=False)
    decoder, params = medians.index[0].split("|", 1)
    same = [k for k in medians.index if k.startswith(decoder + "|")]
    widths = {json.loads(k.split("|", 1)[1]).get("beam_width") for k in same}
    label = decoder if len(widths) == 1 else f"{decoder}(beam_width={json.loads(params)['beam_width']})"
    return label, float(medians.iloc[0]), float(medians.iloc[1])


def check_page(page: Path) -> str:
    audit = audit_page(page)
    assert audit.console_errors == [], (page.name, audit.console_errors)
    assert audit.blocked_requests == [], (page.name, audit.blocked_requests)
    assert audit.untitled_axes() == [], (page.name, audit.untitled_axes())
    assert audit.headline.startswith("Compared:") or "Compared:" in audit.headline, page.name
    return audit.headline


def test_every_report_kind_in_a_browser(style_results):  # noqa: F811
    for row in clear_winner_rows():
        write_result_row(style_results, row)
    assert run_cli(["report", "--results-dir", str(style_results)]) == 0  # every page + the index
    reports = style_results / "reports"
    index = audit_page(reports / "index.html")
    assert index.console_errors == [] and index.blocked_requests == []
    for experiment in [*EXPERIMENTS, "clear_winner"]:
        check_page(reports / f"{experiment}.html")

    headline = check_page(reports / "clear_winner.html")
    df = read_results(style_results, "clear_winner")
    label, best, runner = independent_best(df, "recall@10")
    # the normal-approximation test on 2000 users each: 0.30 vs 0.20 is far outside the noise
    half = 1.96 * math.sqrt(best * (1 - best) / USERS + runner * (1 - runner) / USERS)
    assert best - runner > half
    assert f"winner {label}" in headline, headline
    assert "winner nezha" in headline  # and the fastest, 3 ms vs 10 ms, with non-overlapping repeats


def test_the_small_sweeps_page_in_a_browser(swept):
    page = swept / "reports" / "small_demo.html"
    headline = check_page(page)
    df = read_results(swept, "small_demo")
    assert set(df["decoder"]) == {"beam", "popular"} and (df["repeats"] == 2).all()
    # the sweep stored per-user outcomes: quality is compared paired, in the decision that opens the page
    assert headline.startswith("Within ") and "deploy" in headline.split("\n")[0], headline
    assert "paired bootstrap over users" in headline, headline
    assert "popular (baseline)" in headline  # shown, never ranked


def test_the_decision_is_the_first_text_and_the_axes_fit_the_decoders(tmp_path):
    """Issue 34: the first text under the title is the decision sentence; the Pareto plot's quality
    axis spans the compared decoders' values (error bars included) plus margins, and the popular
    baseline (recall 0.01 at 0.15 ms) changes neither axis."""
    import numpy as np
    from test_decision import EXP, paired_but_not_unpaired, store

    from genrec.dashboards.report import build_report

    root = tmp_path / "results"
    paired_but_not_unpaired(root)  # beam-10 (0.275 at 10 ms) and nezha (0.26 at 5 ms)
    popular = np.zeros(USERS, bool)
    popular[:20] = True
    store(root, "popular", 0, popular, 0.15)
    audit = audit_page(build_report(root, EXP, root / "reports" / "paired.html"))
    assert audit.console_errors == [] and audit.blocked_requests == []
    assert audit.first_text.startswith("Within 10.0 ms: deploy beam"), audit.first_text
    assert "deploy nezha: 2.00x faster than beam-10" in audit.headline
    pareto = next(f for f in audit.figures if f["title"].startswith("recall@10 vs latency"))
    axes = {a["name"]: a for a in pareto["axes"]}
    lo, hi = axes["yaxis"]["range"]
    data_lo, data_hi = 0.26 - 0.02, 0.275 + 0.02  # the values and their binomial error bars at most
    assert data_lo - 0.01 <= lo < 0.26 and 0.275 < hi <= data_hi + 0.01, (lo, hi)
    x_lo, x_hi = axes["xaxis"]["range"]
    if axes["xaxis"]["type"] == "log":
        x_lo, x_hi = 10**x_lo, 10**x_hi
    assert 0.15 < x_lo < 5.0 and 10.0 < x_hi < 20.0, (x_lo, x_hi)  # popular's 0.15 ms sets nothing
