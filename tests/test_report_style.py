"""One style across the report pages (issue 19, item 4): fixed colours per decoder / backend, labelled
axes on every figure of every page kind, readable log ticks, one shared diverging colour axis per heatmap
figure, flat panels as sentences, the report registry and the index page, plotly.js once per folder."""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from test_atspeed_report import fake_rows as atspeed_rows
from test_report import make_row
from test_serving_report import P99, loadtest_row

from genrec.dashboards import axes, style
from genrec.dashboards.figure_audit import axis_titles, figures_in_html, missing_axis_titles
from genrec.dashboards.registry import PAGES, experiment_kind, row_kinds
from genrec.dashboards.report import build_report
from genrec.platform.tracking import write_result_row

pytest.importorskip("plotly")

ENV = {"device": "cpu:x", "threads": 2, "torch_version": "t", "git_commit": "g", "schema_version": 1}


# ------------------------------------------------------------------------------------------ rows


def benchmark_row(experiment: str, run_id: str, benchmark: str, **fields) -> dict:
    return {
        "experiment": experiment,
        "run_id": run_id,
        "benchmark": benchmark,
        "decoder": f"benchmark:{benchmark}",
        "seed": 0,
        "created_at": "2026-01-01T00:00:00+00:00",
        **ENV,
        **fields,
    }


def mari_rows() -> list[dict]:
    rows = []
    for di in (16, 32):  # two heatmap figures: their colour axes must agree
        for b in (4, 64):
            for du in (8, 64):
                speed = 0.5 if (b, du) == (4, 8) else b * du / 100  # one slow-down, speed-ups to 40.96x
                rows.append(
                    benchmark_row(
                        "mari",
                        f"m{di}-{b}-{du}",
                        "mari_matmul",
                        param_b=b,
                        param_d_user=du,
                        param_d_item=di,
                        param_d_hidden=8,
                        param_d_cross=0,
                        time_speedup=speed,
                        flops_speedup=speed * 2,
                        time_vanilla_ms=1.0,
                        time_mari_ms=1.0 / speed,
                    )
                )
    for chunk in (50, 100, 200):
        rows.append(
            benchmark_row(
                "mari",
                f"f{chunk}",
                "mari_fragmented",
                param_chunk=chunk,
                degradation_vs_neat_pct=100.0 / chunk,
                degradation_vs_vanilla_pct=10.0 / chunk,
                time_mari_neat_ms=1.0,
                time_mari_fragmented_ms=1.5,
                time_vanilla_ms=2.0,
            )
        )
    for b in (4, 8):
        times = {"time_vani_ms": 3.0, "time_uoi_ms": 2.0, "time_mari_ms": 1.0}
        speedups = {"speedup_uoi_vs_vani": 1.5, "speedup_mari_vs_uoi": 2.0, "speedup_mari_vs_vani": 3.0}
        rows.append(
            benchmark_row(
                "mari", f"model{b}", "mari_model", param_b=b, **times, **speedups, max_abs_diff_mari=0.0
            )
        )
    return rows


def static_rows() -> list[dict]:
    """static_branch-like rows: kernel time per beam vs the branch factor over three decades, per kernel."""
    return [
        benchmark_row(
            "static",
            f"{kernel}-{n}",
            "static_branch",
            param_kernel=kernel,
            param_max_branch=n,
            param_batch=4,
            kernel_us_per_beam=scale * n**0.5,
            kernel_ms=scale * n / 1000,
            max_branch_factor=float(n),
        )
        for kernel, scale in (("torch", 3.0), ("triton", 1.0))
        for n in (2, 9, 100, 2048)
    ]


def nezha_rows() -> list[dict]:
    rows = []
    for arm, q in (("beam", 0.30), ("nezha", 0.31), ("mtp", 0.10)):
        for seed in (1, 2):
            metrics = {m: q + seed / 1000 for m in ("hr@5", "hr@10", "ndcg@5", "ndcg@10")}
            rows.append(
                benchmark_row(
                    "arms",
                    f"{arm}-{seed}",
                    "nezha_arm",
                    param_arm=arm,
                    seed=seed,
                    dataset_name="synth",
                    valid_share=1.0,
                    drafts_valid_share=0.9,
                    latency_p50_ms=10.0,
                    prefill_ms=6.0,
                    decode_ms=4.0,
                    train_seconds=1.0,
                    train_steps=10,
                    **metrics,
                )
            )
    return rows


def decoder_rows(experiment: str, configs: list[tuple[str, dict, float, float]]) -> list:
    return [make_row(d, p, q, lat, s, experiment=experiment) for d, p, q, lat in configs for s in (0, 1)]


DECODERS_A = [  # beam over a decade of widths, nezha, and popular (no beam width)
    ("beam", {"beam_width": 10}, 0.20, 2.0),
    ("beam", {"beam_width": 20}, 0.25, 4.0),
    ("beam", {"beam_width": 100}, 0.30, 20.0),
    ("nezha", {"beam_width": 10, "draft_width": 2}, 0.18, 1.0),
    ("nezha", {"beam_width": 100, "draft_width": 2}, 0.28, 6.0),
    ("popular", {"k": 10}, 0.05, 0.1),
]
DECODERS_B = [  # other decoders first in sort order: a positional palette would recolour nezha
    ("atspeed_strict", {"beam_width": 4}, 0.2, 3.0),
    ("nezha", {"beam_width": 4, "draft_width": 3}, 0.19, 3.0),
    ("static", {"beam_width": 4}, 0.17, 2.0),
    ("static", {"beam_width": 8}, 0.21, 4.0),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("results")
    rows = [*decoder_rows("decoders_a", DECODERS_A), *decoder_rows("decoders_b", DECODERS_B)]
    rows += [*mari_rows(), *static_rows(), *nezha_rows()]
    rows += [loadtest_row(label, rate, p99) for label, curve in P99.items() for rate, p99 in curve.items()]
    atspeed = atspeed_rows(curves=True).assign(experiment="atspeed")
    rows += [{k: v for k, v in r.items() if not pd.isna(v)} | ENV for r in atspeed.to_dict("records")]
    for row in rows:
        write_result_row(root, row)
    return root


EXPERIMENTS = {  # experiment -> page kind
    "arms": "nezha",
    "atspeed": "atspeed",
    "decoders_a": "decoders",
    "decoders_b": "decoders",
    "mari": "mari",
    "serving": "loadtest",
    "static": "benchmark",
}


@pytest.fixture(scope="module")
def index(results) -> Path:
    return build_report(results)


def page(results: Path, experiment: str) -> str:
    return (results / "reports" / f"{experiment}.html").read_text()


def trace_colours(html: str) -> dict[str, set[str]]:
    """Trace name -> the colours its traces are drawn in, over every figure of a page."""
    out: dict[str, set[str]] = {}
    for fig in figures_in_html(html):
        for t in fig["data"]:
            c = (t.get("line") or {}).get("color") or (t.get("marker") or {}).get("color")
            if t.get("name") and isinstance(c, str):
                out.setdefault(t["name"], set()).add(c.upper())
    return out


# ----------------------------------------------------------------------------------------- colours


def test_fixed_colours_are_distinct_and_unknown_names_hash_away_from_them():
    fixed = list(style.FIXED_COLOURS.values())
    assert len(set(fixed)) == len(fixed)
    for name in ("beam", "beam_sample", "nezha", "nezha-4", "nezha-every", "mtp", "static", "xgr", "popular"):
        assert name in style.DECODER_COLOURS
    for name in ("torch", "triton", "official", "dense", "sparse"):
        assert name in style.BACKEND_COLOURS
    assert style.colour("VanI") == style.colour("vani") and style.colour(" Nezha ") == style.colour("nezha")
    for name in ("my_new_decoder", "beam2", "AtSpeed-S w/o DR", "x"):
        c = style.colour(name)
        assert c == style.hashed_colour(name.strip().lower()) == style.colour(name)  # deterministic
        assert c not in fixed
        assert min(math.dist(style._rgb(c), style._rgb(f)) for f in fixed) >= style.MIN_DISTANCE
    assert style.colour("a") != style.colour("b")


def test_a_decoder_keeps_its_colour_across_pages(results, index):
    a, b = trace_colours(page(results, "decoders_a")), trace_colours(page(results, "decoders_b"))
    nezha = style.colour("nezha").upper()
    assert a["nezha"] == {nezha} == b["nezha"]  # the same orange on both pages
    assert b["static"] == {style.colour("static").upper()} and a["beam"] == {style.colour("beam").upper()}
    arms = trace_colours(page(results, "arms"))
    assert arms["nezha"] == {nezha} and arms["mtp"] == {style.colour("mtp").upper()}
    serving = trace_colours(page(results, "serving"))  # both setups are beam: beam's blue, two dashes
    assert serving["beam [batching=on]"] == serving["beam [batching=off]"] == {style.colour("beam").upper()}
    static = trace_colours(page(results, "static"))
    assert static["kernel=torch"] == {style.colour("torch").upper()}
    assert static["kernel=triton"] == {style.colour("triton").upper()}


# ---------------------------------------------------------------------------------------- axes


def test_every_figure_of_every_page_kind_has_axis_titles(results, index):
    for experiment in EXPERIMENTS:
        figures = figures_in_html(page(results, experiment))
        assert figures, experiment
        for fig in figures:
            assert axis_titles(fig), (experiment, fig["layout"].get("title"))
            assert missing_axis_titles(fig, declared=True) == [], (
                experiment,
                axis_titles(fig, declared=True),
            )
            for name, text in axis_titles(fig).items():
                assert not re.fullmatch(r"[a-z0-9]+(_[a-z0-9@]+)+", text), (
                    experiment,
                    name,
                    text,
                )  # raw columns


def test_axis_walker_flags_an_untitled_axis():
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(1, 3)
    fig.add_trace(go.Scatter(x=[1], y=[1]), 1, 1)
    fig.add_trace(go.Bar(x=[1], y=[1]), 1, 2)
    fig.update_xaxes(title_text="x", row=1, col=1)
    fig.update_yaxes(title_text="y", row=1, col=1)
    fig.update_xaxes(title_text="x2", row=1, col=2)
    assert missing_axis_titles(fig) == ["yaxis2"]  # the third cell has no trace: no title needed
    assert missing_axis_titles(fig.to_plotly_json()) == ["yaxis2"]
    assert missing_axis_titles(fig, declared=True) == ["xaxis3", "yaxis2", "yaxis3"]  # what a browser draws
    fig.update_xaxes(visible=False, row=1, col=3)
    fig.update_yaxes(visible=False, row=1, col=3)
    assert missing_axis_titles(fig, declared=True) == ["yaxis2"]


def test_axis_titles_carry_units_batch_size_and_rate_ranges(results, index):
    assert axes.axis_title("kernel_us_per_beam") == "kernel time per beam (µs)"
    rows = pd.DataFrame({"batch_size": [16, 16]})
    assert axes.axis_title("latency_p50_ms", rows) == "latency p50 per batch of 16 users (ms)"
    for rate in ("hr@10", "recall@20", "ndcg@5", "invalid_rate", "acceptance", "acceptance_level_3"):
        assert axes.describe(rate).rate and axes.axis(rate)["range"] == [-0.02, 1.02]
    assert not axes.describe("latency_p99_ms").rate
    # request rates are req/s, not shares (the serving benchmark's best_rate drew on a 0-1 axis)
    for column in ("best_rate", "rate", "param_rate", "offered_rate_rps"):
        assert not axes.describe(column).rate and "req/s" in axes.axis_title(column)
    figs = figures_in_html(page(results, "decoders_a"))
    titles = [t for f in figs for t in axis_titles(f).values()]
    assert "latency p50 per batch of 16 users (ms) (log scale)" in titles  # make_row's batch_size
    quality = next(f for f in figs if f["layout"]["title"]["text"].startswith("Quality"))
    for name, text in axis_titles(quality).items():
        if name.startswith("yaxis"):  # zoomed to the drawn values (error bars included) plus margins
            lo, hi = quality["layout"][name]["range"]
            axis_id = "y" + name.removeprefix("yaxis")
            ys = [
                y + sign * e
                for t in quality["data"]
                if t.get("yaxis", "y") == axis_id and t.get("y")
                for y, e in zip(t["y"], (t.get("error_y") or {}).get("array") or [0.0] * len(t["y"]))
                for sign in (-1, 0, 1)
            ]
            span = max(ys) - min(ys)
            assert (
                min(ys) - 0.2 * span - 0.01 <= lo <= min(ys) and max(ys) <= hi <= max(ys) + 0.2 * span + 0.01
            ), text


def test_log_ticks_are_1_2_5_and_say_log_scale(results, index):
    assert axes.log_ticks(9, 100) == [10, 20, 50, 100]
    assert [axes.tick_text(t) for t in axes.log_ticks(9, 100)] == ["10", "20", "50", "100"]
    assert [axes.tick_text(t) for t in axes.log_ticks(1000, 1e6)] == [
        "1000", "2000", "5000", "10k", "20k", "50k", "100k", "200k", "500k", "1M",
    ]  # fmt: skip
    assert axes.log_ticks(1, 1e7) == [10.0**e for e in range(8)]  # only powers of ten over 7 decades
    assert axes.log_ticks(12, 18) == [10, 20]  # too narrow for two ticks: the neighbours
    assert axes.log_ticks(0.01, 0.05) == [0.01, 0.02, 0.05]
    # on the pages: beam widths 10..100 and branch factors 2..2048
    quality = next(
        f for f in figures_in_html(page(results, "decoders_a")) if "Latency" in str(f["layout"]["title"])
    )
    x = quality["layout"]["xaxis"]
    assert x["type"] == "log" and x["title"]["text"] == "beam width (log scale)"
    assert x["ticktext"] == ["10", "20", "50", "100"]
    lines = figures_in_html(page(results, "static"))
    per_beam = next(f for f in lines if f["layout"]["title"]["text"] == "kernel_us_per_beam vs max_branch")
    x = per_beam["layout"]["xaxis"]
    assert x["title"]["text"] == "max branch factor (log scale)" and x["ticktext"][:3] == ["2", "5", "10"]
    assert per_beam["layout"]["yaxis"]["title"]["text"] == "kernel time per beam (µs) (log scale)"


def test_linear_axes_do_not_claim_log_scale():
    ax = axes.axis("beam_width", [1, 4, 8], discrete=True)
    assert "type" not in ax and ax["title"]["text"] == "beam width" and ax["tickvals"] == [1, 4, 8]
    assert axes.axis("recall@10", [0.001, 0.5])["title"]["text"] == "Recall@10 (share, 0–1)"  # never log


# ------------------------------------------------------------------------------------- heatmaps


def test_heatmaps_share_one_colour_axis_centred_at_one(results, index):
    heatmaps = [
        f for f in figures_in_html(page(results, "mari")) if any(t["type"] == "heatmap" for t in f["data"])
    ]
    assert len(heatmaps) == 2  # one per D_item
    axes = []
    for fig in heatmaps:
        assert [k for k in fig["layout"] if k.startswith("coloraxis")] == ["coloraxis"]  # one colour bar
        for t in fig["data"]:
            assert t.get("coloraxis") == "coloraxis" and "colorscale" not in t and "zmin" not in t
        ca = fig["layout"]["coloraxis"]
        bar = ca["colorbar"]
        assert ca["cmid"] == bar["tickvals"][bar["ticktext"].index("1x")]  # white at 1.0x
        assert ca["cmin"] == -ca["cmax"]
        axes.append((ca["cmin"], ca["cmax"], str(ca["colorscale"])))
    assert len(set(axes)) == 1  # the same scale in every panel of the page
    all_ratios = [r["time_speedup"] for r in mari_rows() if "time_speedup" in r]
    all_ratios += [r["flops_speedup"] for r in mari_rows() if "flops_speedup" in r]
    assert axes[0][1] == pytest.approx(max(abs(math.log2(v)) for v in all_ratios))
    z = heatmaps[0]["data"][0]["z"]
    text = heatmaps[0]["data"][0]["text"]
    assert text[0][0] == "0.50x" and z[0][0] == pytest.approx(-1.0)  # the cell shows the ratio, z its log2


def test_mari_legend_names_match_the_heatmaps(results, index):
    html = page(results, "mari")
    names = trace_colours(html)
    assert "D_user=8 D_item=16 D_hidden=8 D_cross=0" in names
    assert not any(n.startswith("Du=") for n in names)


# --------------------------------------------------------------------------------------- flat


def test_flat_quality_panels_collapse_to_a_sentence(tmp_path):
    flat = [("beam", {"beam_width": w}, 0.6965, float(w)) for w in (10, 20, 50, 100)]
    for row in decoder_rows("flat", flat):
        width = row.decoder_params["beam_width"]
        row.quality = {"recall@10": 0.6965, "hr@10": 0.5 + width / 1000, "hr@20": 0.6 + width / 1000}
        row.quality["ndcg@10"] = 0.3 + width / 1000
        write_result_row(tmp_path, row)
    html = build_report(tmp_path, "flat").read_text()
    assert "recall@10 = 0.6965</strong> for every configuration" in html
    quality = next(f for f in figures_in_html(html) if f["layout"]["title"]["text"].startswith("Quality"))
    assert {t.get("yaxis", "y") for t in quality["data"]} == {"y", "y2", "y3"}  # recall@10 is not drawn
    titles = [a["text"] for a in quality["layout"]["annotations"] if not a["text"].startswith("reference")]
    assert titles == ["HR@10", "HR@20", "NDCG@10"]
    assert missing_axis_titles(quality, declared=True) == []  # the empty cell next to NDCG@10 is hidden
    # every quality metric flat: no quality figure at all
    for row in decoder_rows("flatter", flat):
        row.quality = {"recall@10": 0.6965, "hr@10": 0.5}
        write_result_row(tmp_path, row)
    html = build_report(tmp_path, "flatter").read_text()
    assert "hr@10 = 0.5</strong>" in html and "recall@10 = 0.6965</strong>" in html
    assert not any(str(f["layout"]["title"]["text"]).startswith("Quality") for f in figures_in_html(html))


# ----------------------------------------------------------------------- registry and index


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.rows: list[list[str]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a" and dict(attrs).get("href", "").endswith(".html"):
            self.links.append(dict(attrs)["href"])
        if tag == "tr":
            self.rows.append([])
        if tag == "td":
            self.cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self.cell is not None:
            self.rows[-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def test_registry_reads_the_kind_from_the_rows(results):
    from genrec.workloads.results_store import read_results

    for experiment, kind in EXPERIMENTS.items():
        assert experiment_kind(read_results(results, experiment)) == kind
    mixed = pd.DataFrame(
        {"benchmark": ["nezha_arm", None, "static_scaling"], "kind": [None, "loadtest", None]}
    )
    assert row_kinds(mixed).tolist() == ["nezha", "loadtest", "benchmark"]
    assert set(EXPERIMENTS.values()) <= set(PAGES)


def test_index_links_one_page_per_experiment(results, index):
    assert index == results / "reports" / "index.html"
    parser = Links()
    parser.feed(index.read_text())
    assert sorted(parser.links) == sorted(f"{e}.html" for e in EXPERIMENTS)
    lines = {r[0]: r for r in parser.rows if r}
    from genrec.workloads.results_store import read_results

    for experiment, kind in EXPERIMENTS.items():
        assert (results / "reports" / f"{experiment}.html").is_file()
        assert lines[experiment][1] == PAGES[kind].label
        assert lines[experiment][2] == str(len(read_results(results, experiment)))
    assert lines["decoders_b"][3] == "atspeed_strict, nezha, static" and lines["mari"][3].startswith("mari_")
    # each page is drawn by its kind's builder, not the decoder page
    assert "speedup heatmaps" in page(results, "mari") and 'class="maxrate"' in page(results, "serving")
    assert "H1: NEZHA below beam" in page(results, "arms") and "Table 1" in page(results, "atspeed")
    assert "static_branch: metrics vs parameters" in page(results, "static")


def test_every_page_has_the_provenance_and_rebuild_block(results, index):
    for experiment in [*EXPERIMENTS, "index"]:
        html = page(results, experiment)
        assert 'id="provenance"' in html and 'class="prov"' in html, experiment
        assert f"genrec report --results-dir {results}" in html, experiment
        if experiment != "index":
            assert f"--experiment {experiment} --out {results / 'reports' / experiment}.html" in html
    assert "machine load" not in page(results, "static")


def test_provenance_reports_machine_load(tmp_path):
    for i, load in enumerate((0.5, 1.5, 3.5)):
        write_result_row(
            tmp_path, static_rows()[i] | {"experiment": "loaded", "load_1m": load, "run_id": f"r{i}"}
        )
    html = build_report(tmp_path, "loaded").read_text()
    assert "median 1.50 (0.50 … 3.50) over 3 rows" in html


def test_plotlyjs_is_written_once_per_folder_and_referenced_relatively(results, index):
    folder = results / "reports"
    assert [p.name for p in folder.glob("*.js")] == ["plotly.min.js"]
    before = (folder / "plotly.min.js").stat().st_mtime_ns
    for experiment in [*EXPERIMENTS, "index"]:
        html = page(results, experiment)
        scripts = re.findall(r'<script src="([^"]+)"', html)
        assert scripts == (["plotly.min.js"] if "plotly-graph-div" in html else []), experiment
        assert len(html) < 600_000, experiment
    build_report(results, "static")  # a rebuild leaves the copy alone
    assert (folder / "plotly.min.js").stat().st_mtime_ns == before


def test_headline_slot_sits_under_the_title(tmp_path):
    from genrec.dashboards.page import write_page

    out = write_page(tmp_path / "p.html", "T", "sub", [("a", "A", "<p>x</p>")], headline="<b>beam wins</b>")
    html = out.read_text()
    assert '<div class="headline"><b>beam wins</b></div>' in html and ".headline" in html
    assert html.index("<h1>") < html.index('class="headline"') < html.index("<nav>")
    assert 'class="headline"' not in write_page(tmp_path / "q.html", "T", "s", []).read_text()
    wrapped = '<div class="headline"><p>x</p></div>'  # headline.py's own wrapper is not doubled
    assert (
        write_page(tmp_path / "r.html", "T", "s", [], headline=wrapped).read_text().count('class="headline"')
        == 1
    )
