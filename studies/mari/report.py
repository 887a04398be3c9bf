"""Report pages for MaRI benchmark rows (`benchmark` column = mari_matmul / mari_fragmented / mari_model).

    mari_matmul      heatmaps of measured time speedup and theoretical FLOPs speedup over (B, D_user),
                     one pair per (D_item, D_hidden); time speedup vs B lines; every point in a table
    mari_fragmented  fragmented MaRI over neat MaRI and over the vanilla MatMul vs chunk size, with the
                     paper's Table 3 figures as dotted lines
    mari_model       VanI / UOI / MaRI latency bars per B and the speedups
The report registry sends MaRI benchmark rows here. Every speed-up heatmap on the page
shares one colour axis: a diverging scale centred at 1.0x with the same ends in every panel.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from genrec.dashboards.analysis import format_value
from genrec.dashboards.axes import axis, ratio_coloraxis, ratio_z
from genrec.dashboards.page import FigureWriter, PageContext, finish_page, html_table
from genrec.dashboards.style import DASHES, colour, tint

MARI_BENCHMARKS = ("mari_matmul", "mari_fragmented", "mari_model")
# Table 3 of the paper: chunk -> (fragmented vs vanilla %, fragmented vs neat MaRI %)
PAPER_TABLE3 = {50: (69.4, 96.3), 100: (27.2, 47.4), 200: (13.6, 31.7), 400: (3.1, 19.5), 800: (-0.7, 15.1)}


def is_mari_frame(df: pd.DataFrame) -> bool:
    return "benchmark" in df.columns and df["benchmark"].isin(MARI_BENCHMARKS).all()


def _param(df: pd.DataFrame, name: str) -> pd.Series:
    """The parameter's column: param_<name> when swept or fixed, else the metric the benchmark echoes."""
    col = f"param_{name}" if f"param_{name}" in df.columns else name
    return df[col]


def _mean_by(df: pd.DataFrame, keys: list[str], values: list[str]) -> pd.DataFrame:
    frame = pd.DataFrame({k: _param(df, k) for k in keys})
    for v in values:
        frame[v] = pd.to_numeric(df[v], errors="coerce")
    return frame.groupby(keys, as_index=False).mean(numeric_only=True)


def heatmap_figure(part: pd.DataFrame, title: str, coloraxis: dict):
    """Measured time speed-up and theoretical FLOPs speed-up over (B, D_user), side by side on the
    page's one colour axis (log2 of the ratio, so 0.5x and 2x sit equally far from white 1.0x)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(1, 2, subplot_titles=("time speed-up (measured)", "FLOPs speed-up (theory)"))
    for col, metric in ((1, "time_speedup"), (2, "flops_speedup")):
        grid = part.pivot(index="d_user", columns="b", values=metric).sort_index()
        fig.add_trace(
            go.Heatmap(
                z=[ratio_z(row) for row in grid.values],
                x=[format_value(c) for c in grid.columns],
                y=[format_value(i) for i in grid.index],
                text=[[f"{v:.2f}x" for v in row] for row in grid.values],
                texttemplate="%{text}",
                coloraxis="coloraxis",
                hovertemplate="B=%{x}<br>D_user=%{y}<br>" + metric + "=%{text}<extra></extra>",
            ),
            1,
            col,
        )
        fig.update_xaxes(title_text="B (candidates)", type="category", row=1, col=col)
        fig.update_yaxes(title_text="D_user", type="category", row=1, col=col)
    fig.update_layout(height=400, title=title, margin={"t": 70}, coloraxis=coloraxis)
    return fig


MATMUL_KEYS = ["b", "d_user", "d_item", "d_hidden", "d_cross"]
SHAPE_KEYS = ["d_item", "d_hidden", "d_cross"]  # a heatmap pair, and a line dash, per shape
SIZE_LABELS = {"b": "B", "d_user": "D_user", "d_item": "D_item", "d_cross": "D_cross", "d_hidden": "D_hidden"}
MATMUL_NOTE = (
    '<p class="note">Cells: median vanilla time / median MaRI time (interleaved reps, same inputs), and '
    "the theoretical FLOPs ratio of appendix B (eq. 8 / eq. 9). "
    "One pair per (D_item, D_hidden, D_cross); one colour scale for every panel: white = 1.0x, blue = "
    "MaRI faster, red = slower. Paper (GPU): time 0.97-1.61x, FLOPs 1.4-10.95x.</p>"
)
# the points tables: (header, column, its cells' str.format template or a function of the value)
MATMUL_TABLE = (
    *((label, size, "{}") for size, label in SIZE_LABELS.items()),
    ("FLOPs x", "flops_speedup", "{:.2f}"),
    ("time x", "time_speedup", "{:.2f}"),
    ("vanilla ms", "time_vanilla_ms", "{:.2f}"),
    ("MaRI ms", "time_mari_ms", "{:.2f}"),
)
FRAGMENTED_TABLE = (
    ("chunk", "chunk", int),
    ("vanilla ms", "time_vanilla_ms", "{:.2f}"),
    ("neat MaRI ms", "time_mari_neat_ms", "{:.2f}"),
    ("fragmented MaRI ms", "time_mari_fragmented_ms", "{:.2f}"),
    ("vs neat", "degradation_vs_neat_pct", "{:+.1f}%"),
    ("vs vanilla", "degradation_vs_vanilla_pct", "{:+.1f}%"),
)
MODEL_MODES = [("vani", "VanI"), ("uoi", "UOI"), ("mari", "MaRI")]
MODEL_TABLE = (
    ("B", "b", int),
    *((f"{label} ms", f"time_{m}_ms", "{:.2f}") for m, label in MODEL_MODES),
    ("UOI/VanI x", "speedup_uoi_vs_vani", "{:.2f}"),
    ("MaRI/UOI x", "speedup_mari_vs_uoi", "{:.2f}"),
    ("MaRI/VanI x", "speedup_mari_vs_vani", "{:.2f}"),
    ("max |MaRI - VanI|", "max_abs_diff_mari", "{:.1e}"),
)


def _sizes_text(sizes: Sequence[str], values: Sequence[object], sep: str) -> str:
    """'D_item=1000, D_hidden=512' for sizes ["d_item", "d_hidden"], values (1000, 512) and sep ", "."""
    return sep.join(f"{SIZE_LABELS[size]}={format_value(v)}" for size, v in zip(sizes, values))


def _cell(value: object, fmt: str | Callable[[object], object]) -> object:
    return fmt.format(value) if isinstance(fmt, str) else fmt(value)


def points_table(frame: pd.DataFrame, columns: Sequence[tuple[str, str, str | Callable]]) -> str:
    """A table with a row per row of `frame`, its cells formatted as `columns` say."""
    rows = [[_cell(getattr(r, column), fmt) for _, column, fmt in columns] for r in frame.itertuples()]
    return html_table([header for header, _, _ in columns], rows)


def _table_means(df: pd.DataFrame, columns: Sequence[tuple[str, str, str | Callable]]) -> pd.DataFrame:
    """A points table's value columns averaged per its first (key) column, sorted by that key."""
    key = columns[0][1]
    return _mean_by(df, [key], [column for _, column, _ in columns[1:]]).sort_values(key)


def heatmaps_html(agg: pd.DataFrame, figure: FigureWriter) -> str:
    """The note and a heatmap pair per (D_item, D_hidden, D_cross), all on one colour axis."""
    body = MATMUL_NOTE
    coloraxis = ratio_coloraxis([*agg["time_speedup"], *agg["flops_speedup"]])
    for (di, dh, dc), part in agg.groupby(SHAPE_KEYS):
        title = _sizes_text(SHAPE_KEYS, (di, dh, dc), ", ")
        body += figure(heatmap_figure(part, title, coloraxis))
    return body


def speedup_lines_figure(agg: pd.DataFrame):
    """Time speed-up vs B, a line per (D_user, D_item, D_hidden, D_cross)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    d_users = sorted(agg["d_user"].unique())
    shapes = sorted({tuple(k) for k in agg[SHAPE_KEYS].itertuples(index=False)})
    for key, part in agg.groupby(["d_user", *SHAPE_KEYS]):
        part = part.sort_values("b")
        name = _sizes_text(["d_user", *SHAPE_KEYS], key, " ")
        # MaRI's colour, lighter for a smaller D_user; a dash per (D_item, D_hidden, D_cross)
        shade = tint(
            colour("mari"), 0.6 * (len(d_users) - 1 - d_users.index(key[0])) / max(1, len(d_users) - 1)
        )
        dash = DASHES[shapes.index(tuple(key[1:])) % len(DASHES)]
        fig.add_trace(
            go.Scatter(
                x=part["b"],
                y=part["time_speedup"],
                mode="lines+markers",
                name=name,
                line={"color": shade, "dash": dash},
            )
        )
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888")
    fig.update_layout(
        height=450, xaxis=axis("b", agg["b"], log=len(set(agg["b"])) > 1), yaxis=axis("time_speedup")
    )
    return fig


def matmul_sections(df: pd.DataFrame, figure: FigureWriter) -> list[tuple[str, str, str]]:
    agg = _mean_by(df, MATMUL_KEYS, ["time_speedup", "flops_speedup", "time_vanilla_ms", "time_mari_ms"])
    table = points_table(agg.sort_values(MATMUL_KEYS), MATMUL_TABLE)
    return [
        ("mari-heatmaps", "MaRI vs vanilla MatMul: speedup heatmaps", heatmaps_html(agg, figure)),
        ("mari-lines", "Time speedup vs B", figure(speedup_lines_figure(agg))),
        ("mari-table", "Every point", f"<details><summary>{len(agg)} points</summary>{table}</details>"),
    ]


def fragmented_sections(df: pd.DataFrame, figure: FigureWriter) -> list[tuple[str, str, str]]:
    agg = _table_means(df, FRAGMENTED_TABLE)
    note = (
        '<p class="note">Fragmented MaRI runs one MatMul per feature chunk; neat MaRI runs three after the '
        "columns and weight rows are reorganised into [user | item | cross].</p>"
    )
    body = note + figure(fragmented_figure(agg)) + points_table(agg, FRAGMENTED_TABLE)
    return [("mari-fragmented", "Fragmented vs neat layout", body)]


def fragmented_figure(agg: pd.DataFrame):
    """Latency increase of fragmented MaRI vs chunk size, measured (solid) and the paper's (dotted)."""
    import plotly.graph_objects as go

    chunks = sorted(PAPER_TABLE3)
    # (x, y, name, baseline whose colour the line takes, dash): measured solid, the paper's dotted
    lines = (
        (agg["chunk"], agg["degradation_vs_neat_pct"], "fragmented vs neat MaRI (measured)", "mari", "solid"),
        (
            agg["chunk"],
            agg["degradation_vs_vanilla_pct"],
            "fragmented vs vanilla (measured)",
            "vani",
            "solid",
        ),
        (chunks, [PAPER_TABLE3[c][1] for c in chunks], "vs neat MaRI (paper, GPU)", "mari", "dot"),
        (chunks, [PAPER_TABLE3[c][0] for c in chunks], "vs vanilla (paper, GPU)", "vani", "dot"),
    )
    fig = go.Figure()
    for x, y, name, baseline, dash in lines:
        line = {"color": colour(baseline), "dash": dash}
        fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=name, line=line))
    fig.add_hline(y=0.0, line_dash="dot", line_color="#888")
    fig.update_layout(
        height=450,
        xaxis=axis("chunk", [*agg["chunk"], *chunks], log=True),
        yaxis=axis("degradation_vs_neat_pct", title="latency increase of fragmented MaRI (%)"),
    )
    return fig


def model_sections(df: pd.DataFrame, figure: FigureWriter) -> list[tuple[str, str, str]]:
    agg = _table_means(df, MODEL_TABLE)
    body = figure(model_figure(agg)) + points_table(agg, MODEL_TABLE)
    return [("mari-model", "Whole model: VanI / UOI / MaRI", body)]


def model_figure(agg: pd.DataFrame):
    """Model latency per B, a bar per mode."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for m, label in MODEL_MODES:
        fig.add_trace(
            go.Bar(
                x=[format_value(b) for b in agg["b"]],
                y=agg[f"time_{m}_ms"],
                name=label,
                marker_color=colour(m),
            )
        )
    fig.update_layout(
        barmode="group",
        height=450,
        xaxis={**axis("b"), "type": "category"},
        yaxis=axis("time_mari_ms", title="model latency per call, median over reps (ms)"),
    )
    return fig


def build_mari_report(
    df: pd.DataFrame, out: str | os.PathLike, title: str, *, context: PageContext = PageContext()
) -> Path:
    figure = FigureWriter()
    sections: list[tuple[str, str, str]] = []
    builders = {
        "mari_matmul": matmul_sections,
        "mari_fragmented": fragmented_sections,
        "mari_model": model_sections,
    }
    for name, build in builders.items():
        part = df[df["benchmark"] == name]
        if not part.empty:
            sections += build(part, figure)
    subtitle = f"{len(df)} result rows; benchmarks: {', '.join(sorted(df['benchmark'].unique()))}"
    return finish_page(Path(out), title, subtitle, sections, df, context)
