"""`genrec report`: one standalone HTML page built from the Parquet result rows only.

Sections: quality vs beam width, latency (p50/p99) vs beam width, quality vs latency with the Pareto
front, the best configuration per latency budget, every configuration, and provenance. The page works
offline: plotly.js is embedded once (in the first figure), nothing is loaded from a CDN.

Nothing here names a decoder: configurations come from the `param_*` columns (see `analysis.py`), a
decoder's lines are split by those of its other parameters that vary independently of the beam
width, and configurations without a beam width (e.g. the `popular` baseline) are reference lines.
"""

from __future__ import annotations

import html
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from genrec.dashboards.analysis import (
    PARAM_PREFIX,
    QUALITY_RE,
    aggregate_over_seeds,
    best_per_budget,
    default_budgets,
    format_value,
    is_missing,
    param_columns,
    pareto_front,
    quality_columns,
)
from genrec.workloads.errors import UserInputError
from genrec.workloads.io import atomic_write_text
from genrec.workloads.results_store import DEFAULT_RESULTS_DIR, list_experiments, read_results

if TYPE_CHECKING:
    import plotly.graph_objects as go

PALETTE = (
    "#1F77B4",
    "#FF7F0E",
    "#2CA02C",
    "#D62728",
    "#9467BD",
    "#8C564B",
    "#E377C2",
    "#7F7F7F",
    "#BCBD22",
    "#17BECF",
)
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "x", "star", "pentagon")
LATENCY_CHOICES = ("p50", "p90", "p99", "mean")
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def default_out_path(results_dir: str | os.PathLike, experiment: str | None) -> Path:
    return Path(results_dir) / "reports" / f"{experiment or 'all'}.html"


def rebuild_command(
    results_dir: str | os.PathLike,
    experiment: str | None,
    out_html: str | os.PathLike,
    metric: str | None,
    latency: str,
    budgets_ms: Sequence[float] | None,
    title: str | None = None,
) -> str:
    """The `genrec report ...` command line that rebuilds a report (shell-quoted)."""
    argv = ["genrec", "report", "--results-dir", str(results_dir)]
    if experiment:
        argv += ["--experiment", experiment]
    argv += ["--out", str(out_html)]
    if metric:
        argv += ["--metric", metric]
    argv += ["--latency", latency]
    if budgets_ms:
        argv += ["--budgets", ",".join(format_value(b) for b in budgets_ms)]
    if title:
        argv += ["--title", title]
    return shlex.join(argv)


# --------------------------------------------------------------------------------------------- lines


@dataclass
class Line:
    """One trace group: a decoder's configurations along the x parameter (or one reference config)."""

    name: str
    decoder: str
    rows: pd.DataFrame  # aggregated rows, sorted by x
    color: str
    dash: str
    symbol: str
    reference: bool  # no x value: drawn as a horizontal line across the x range


def decoder_colors(decoders: Sequence[str]) -> dict[str, str]:
    return {d: PALETTE[i % len(PALETTE)] for i, d in enumerate(sorted(set(map(str, decoders))))}


def _determined_by(rows: pd.DataFrame, xcol: str, col: str) -> bool:
    """True when every x value has a single value of `col` (e.g. k = min(10, beam_width))."""
    labels = rows[col].map(format_value_or_dash)
    return bool((labels.groupby(rows[xcol]).nunique() <= 1).all())


def format_value_or_dash(value: object) -> str:
    return "–" if is_missing(value) else format_value(value)


def build_lines(agg: pd.DataFrame, x_param: str, colors: dict[str, str]) -> list[Line]:
    """Trace groups of the aggregated table, generic over decoders and their parameters."""
    xcol = PARAM_PREFIX + x_param
    xs = (
        pd.to_numeric(agg[xcol], errors="coerce")
        if xcol in agg.columns
        else pd.Series(float("nan"), agg.index)
    )
    params = [c for c in param_columns(agg) if c != xcol]
    lines: list[Line] = []
    for decoder in sorted(agg["decoder"].astype(str).unique()):
        mask = (agg["decoder"].astype(str) == decoder) & xs.notna()
        sub = agg[mask].assign(_x=xs[mask].to_numpy())  # (assigning a Series to an empty frame reindexes it)
        style = 0
        if not sub.empty:
            varying = [c for c in params if sub[c].map(format_value_or_dash).nunique() > 1]
            split_by = [c for c in varying if not _determined_by(sub, "_x", c)]
            labels = [
                ", ".join(f"{c[len(PARAM_PREFIX) :]}={format_value_or_dash(r[c])}" for c in split_by)
                for r in sub[split_by].to_dict("records")
            ]
            keys = pd.Series(
                [(lbl, setting) for lbl, setting in zip(labels, sub["setting"].astype(str))], index=sub.index
            )
            for key in sorted(keys.unique()):
                rows = sub[keys.map(lambda k, key=key: k == key)].sort_values("_x", kind="stable")
                name = decoder + (f" ({key[0]})" if key[0] else "") + (f" [{key[1]}]" if key[1] else "")
                lines.append(
                    Line(
                        name,
                        decoder,
                        rows,
                        colors[decoder],
                        DASHES[style % len(DASHES)],
                        SYMBOLS[style % len(SYMBOLS)],
                        reference=False,
                    )
                )
                style += 1
        for _, row in agg[(agg["decoder"].astype(str) == decoder) & xs.isna()].iterrows():
            lines.append(
                Line(
                    f"{row['label']} (no {x_param})",
                    decoder,
                    row.to_frame().T.assign(_x=float("nan")),
                    colors[decoder],
                    "dot",
                    SYMBOLS[style % len(SYMBOLS)],
                    reference=True,
                )
            )
            style += 1
    return lines


# ------------------------------------------------------------------------------------------- figures


def _plotly():
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError as e:  # pragma: no cover - plotly is a report dependency
        raise UserInputError("genrec report needs plotly: pip install 'plotly>=6'") from e
    return go, make_subplots


def _hover(metric: str, x_param: str | None) -> str:
    head = "<b>%{customdata[0]}</b><br>"
    xpart = f"{x_param}=%{{x}}<br>" if x_param else ""
    return (
        head
        + xpart
        + f"{metric} = %{{y:.4g}} ± %{{customdata[1]:.2g}}<br>seeds: %{{customdata[2]}}<extra></extra>"
    )


def _customdata(rows: pd.DataFrame, metric: str) -> list[list[object]]:
    std = rows[f"{metric}_std"] if f"{metric}_std" in rows.columns else pd.Series(float("nan"), rows.index)
    return [
        [str(label), 0.0 if is_missing(s) else float(s), f"{n} ({seeds})" if seeds else str(n)]
        for label, s, n, seeds in zip(rows["label"], std, rows["n"], rows["seeds"])
    ]


def _std_array(rows: pd.DataFrame, metric: str) -> list[float]:
    col = f"{metric}_std"
    if col not in rows.columns:
        return [0.0] * len(rows)
    return [0.0 if is_missing(v) else float(v) for v in rows[col]]


def _x_axis(xs: pd.Series) -> dict:
    values = sorted(set(float(v) for v in xs.dropna()))
    axis: dict = {}
    if values and values[0] > 0 and values[-1] / values[0] >= 10:
        axis["type"] = "log"
    if 0 < len(values) <= 12:
        axis["tickmode"] = "array"
        axis["tickvals"] = values
        axis["ticktext"] = [format_value(v) for v in values]
    return axis


def metric_vs_x_figure(
    agg: pd.DataFrame,
    lines: list[Line],
    grid: list[list[str]],
    x_param: str,
    title: str,
    y_titles: dict[str, str] | None = None,
) -> go.Figure:
    """Small multiples (one cell per metric in `grid`): metric vs the x parameter, one trace per Line,
    error bars = std over seeds; reference configurations are horizontal dotted lines."""
    go, make_subplots = _plotly()
    nrows, ncols = len(grid), max(len(r) for r in grid)
    names = y_titles or {}
    titles = [
        names.get(grid[r][c], grid[r][c]) if c < len(grid[r]) else ""
        for r in range(nrows)
        for c in range(ncols)
    ]
    fig = make_subplots(
        rows=nrows,
        cols=ncols,
        subplot_titles=titles,
        horizontal_spacing=0.08,
        vertical_spacing=0.22 / max(1, nrows - 1) if nrows > 1 else 0.1,
    )
    curves = [ln for ln in lines if not ln.reference]
    all_x = pd.concat([ln.rows["_x"] for ln in curves]) if curves else pd.Series(dtype=float)
    categorical = all_x.empty
    x_lo, x_hi = (float(all_x.min()), float(all_x.max())) if not categorical else (0.0, 0.0)
    for r, metrics in enumerate(grid, start=1):
        for c, metric in enumerate(metrics, start=1):
            first = r == 1 and c == 1
            for ln in lines:
                rows = ln.rows[ln.rows[metric].notna()] if metric in ln.rows.columns else ln.rows.iloc[:0]
                if rows.empty:
                    continue
                common = dict(
                    name=ln.name,
                    legendgroup=ln.name,
                    showlegend=first,
                    customdata=_customdata(rows, metric),
                    hovertemplate=_hover(metric, None if categorical else x_param),
                )
                if categorical:  # no configuration has the x parameter: one marker per configuration
                    trace = go.Scatter(
                        x=[str(v) for v in rows["label"]],
                        y=rows[metric].astype(float).tolist(),
                        mode="markers",
                        marker=dict(color=ln.color, symbol=ln.symbol, size=10),
                        error_y=dict(type="data", array=_std_array(rows, metric), visible=True),
                        **common,
                    )
                elif ln.reference:
                    y = float(rows[metric].iloc[0])
                    trace = go.Scatter(
                        x=[x_lo, x_hi],
                        y=[y, y],
                        mode="lines",
                        line=dict(color=ln.color, dash="dot", width=1.5),
                        customdata=_customdata(rows, metric) * 2,
                        **{k: v for k, v in common.items() if k != "customdata"},
                    )
                else:
                    trace = go.Scatter(
                        x=rows["_x"].astype(float).tolist(),
                        y=rows[metric].astype(float).tolist(),
                        mode="lines+markers",
                        line=dict(color=ln.color, dash=ln.dash, width=2),
                        marker=dict(color=ln.color, symbol=ln.symbol, size=8),
                        error_y=dict(
                            type="data", array=_std_array(rows, metric), visible=True, thickness=1.2
                        ),
                        **common,
                    )
                fig.add_trace(trace, row=r, col=c)
            if categorical:  # long labels would squash the plot; the legend and hover name each point
                xaxis = dict(title_text="configuration (see legend)", showticklabels=False)
            else:
                xaxis = dict(title_text=x_param, **_x_axis(all_x))
            fig.update_xaxes(row=r, col=c, **xaxis)
            fig.update_yaxes(title_text=(y_titles or {}).get(metric, metric), row=r, col=c)
    legend_px = legend_height([ln.name for ln in lines])
    fig.update_layout(
        title=dict(text=title, x=0.01),
        height=max(380, 300 * nrows + 80) + legend_px,
        legend=BOTTOM_LEGEND,
        margin=dict(l=60, r=20, t=70, b=70 + legend_px),
        template="plotly_white",
    )
    return fig


def pareto_figure(
    agg: pd.DataFrame,
    front: pd.DataFrame,
    metric: str,
    latency_col: str,
    latency_name: str,
    colors: dict[str, str],
) -> go.Figure:
    """Quality vs latency for every configuration (colored by decoder) with the Pareto front."""
    go, _ = _plotly()
    fig = go.Figure()
    usable = agg[agg[metric].notna() & agg[latency_col].notna()]
    for decoder in sorted(usable["decoder"].astype(str).unique()):
        rows = usable[usable["decoder"].astype(str) == decoder]
        custom = [
            [
                str(lbl),
                float(q),
                0.0 if is_missing(qs) else float(qs),
                0.0 if is_missing(ls) else float(ls),
                int(n),
            ]
            for lbl, q, qs, ls, n in zip(
                rows["label"], rows[metric], rows[f"{metric}_std"], rows[f"{latency_col}_std"], rows["n"]
            )
        ]
        fig.add_trace(
            go.Scatter(
                x=rows[latency_col].astype(float).tolist(),
                y=rows[metric].astype(float).tolist(),
                mode="markers",
                name=decoder,
                customdata=custom,
                marker=dict(color=colors[decoder], size=10, line=dict(width=0.5, color="white")),
                error_x=dict(type="data", array=_std_array(rows, latency_col), visible=True, thickness=1),
                error_y=dict(type="data", array=_std_array(rows, metric), visible=True, thickness=1),
                hovertemplate=(
                    "<b>%{customdata[0]}</b><br>"
                    + f"{metric} = %{{y:.4g}} ± %{{customdata[2]:.2g}}<br>"
                    + f"latency {latency_name} = %{{x:.4g}} ± %{{customdata[3]:.2g}} ms<br>"
                    + "seeds: %{customdata[4]}<extra></extra>"
                ),
            )
        )
    if not front.empty:
        fig.add_trace(
            go.Scatter(
                x=front[latency_col].astype(float).tolist(),
                y=front[metric].astype(float).tolist(),
                mode="lines+markers",
                name="Pareto front",
                line=dict(color="black", width=1.5, shape="hv"),
                marker=dict(symbol="circle-open", size=16, color="black", line=dict(width=2)),
                customdata=[[str(v)] for v in front["label"]],
                hovertemplate="<b>Pareto: %{customdata[0]}</b><br>%{y:.4g} at %{x:.4g} ms<extra></extra>",
            )
        )
    lat = usable[latency_col].astype(float)
    legend_px = legend_height([*usable["decoder"].astype(str).unique(), "Pareto front"])
    xaxis: dict = {"title": dict(text=f"latency {latency_name} per batch (ms)")}
    if not lat.empty and lat.min() > 0 and lat.max() / lat.min() >= 20:
        xaxis["type"] = "log"
    fig.update_layout(
        title=dict(
            text=f"{metric} vs latency {latency_name}: every configuration and the Pareto front", x=0.01
        ),
        xaxis=xaxis,
        yaxis=dict(title=dict(text=metric)),
        height=520 + legend_px,
        legend=BOTTOM_LEGEND,
        margin=dict(l=60, r=20, t=70, b=70 + legend_px),
        template="plotly_white",
    )
    return fig


# A horizontal legend under the plots, anchored to the figure's bottom edge (below the axis titles).
BOTTOM_LEGEND = dict(orientation="h", yref="container", y=0.0, yanchor="bottom", x=0, xanchor="left")


def legend_height(names: Sequence[str], width_px: int = 1150) -> int:
    """Rough pixel height of a wrapped horizontal legend, reserved in the bottom margin."""
    total = sum(60 + 7 * len(n) for n in names)
    return 26 * max(1, -(-total // width_px))


class _FigureWriter:
    """plotly.js goes into the first figure's div only; later figures reuse it."""

    def __init__(self) -> None:
        self.included = False

    def __call__(self, fig: go.Figure) -> str:
        import plotly.io as pio

        out = pio.to_html(
            fig,
            include_plotlyjs=not self.included,
            full_html=False,
            config=PLOT_CONFIG,
            default_width="100%",
            default_height=f"{int(fig.layout.height or 450)}px",
        )
        self.included = True
        return f'<div class="figure">{out}</div>'


# -------------------------------------------------------------------------------------------- tables


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def html_table(headers: Sequence[str], rows: Sequence[Sequence[object]], css: str = "") -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_esc(v)}</td>" for v in row) + "</tr>" for row in rows)
    cls = f' class="{_esc(css)}"' if css else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def fmt_mean_std(mean: object, std: object, digits: int = 4) -> str:
    if is_missing(mean):
        return "–"
    text = f"{float(mean):.{digits}f}"
    return text if is_missing(std) else f"{text} ± {float(std):.{digits}f}"


def fmt_ms(value: object) -> str:
    if is_missing(value):
        return "–"
    v = float(value)
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 else f"{v:.3f}"


def params_text(row: pd.Series) -> str:
    cols = [c for c in row.index if c.startswith(PARAM_PREFIX) and not is_missing(row[c])]
    text = ", ".join(f"{c[len(PARAM_PREFIX) :]}={format_value(row[c])}" for c in sorted(cols))
    if row.get("setting"):
        text = f"{text} [{row['setting']}]" if text else f"[{row['setting']}]"
    return text or "(none)"


def _latency_cols(agg: pd.DataFrame) -> list[str]:
    return [f"latency_{p}_ms" for p in ("p50", "p99") if f"latency_{p}_ms" in agg.columns]


def budget_table(
    table: pd.DataFrame, metric: str, latency_col: str, latency_name: str, agg: pd.DataFrame
) -> str:
    lat_cols = _latency_cols(agg)
    headers = (
        [f"budget: {latency_name} ≤ (ms)", "decoder", "parameters", metric]
        + [f"latency {c.split('_')[1]} (ms)" for c in lat_cols]
        + ["seeds"]
    )
    rows = []
    for _, r in table.iterrows():
        if is_missing(r.get("decoder")):
            rows.append(
                [format_value(r["budget_ms"]), "no configuration within budget", "", "–"]
                + ["–"] * len(lat_cols)
                + [""]
            )
            continue
        rows.append(
            [
                format_value(r["budget_ms"]),
                r["decoder"],
                params_text(r),
                fmt_mean_std(r[metric], r[f"{metric}_std"]),
            ]
            + [fmt_mean_std(r[c], r[f"{c}_std"], 2) for c in lat_cols]
            + [int(r["n"])]
        )
    return html_table(headers, rows, "budget")


def front_table(front: pd.DataFrame, metric: str, latency_col: str, latency_name: str) -> str:
    headers = ["decoder", "parameters", metric, f"latency {latency_name} (ms)", "seeds"]
    rows = [
        [
            r["decoder"],
            params_text(r),
            fmt_mean_std(r[metric], r[f"{metric}_std"]),
            fmt_mean_std(r[latency_col], r[f"{latency_col}_std"], 2),
            int(r["n"]),
        ]
        for _, r in front.iterrows()
    ]
    return html_table(headers, rows, "front")


def configurations_table(agg: pd.DataFrame, qcols: list[str]) -> str:
    rates = ("invalid_rate", "missing_rate")
    extra = [c for c in (*rates, *_latency_cols(agg), "throughput_users_per_s") if c in agg.columns]
    headers = ["decoder", "parameters", "seeds", *qcols, *extra]
    rows = []
    for _, r in agg.iterrows():
        cells: list[object] = [
            r["decoder"],
            params_text(r),
            f"{int(r['n'])} ({r['seeds']})" if r["seeds"] else int(r["n"]),
        ]
        cells += [fmt_mean_std(r[c], r[f"{c}_std"]) for c in qcols]
        for c in extra:
            digits = 4 if c in rates else 2 if c.startswith("latency_") else 1
            cells.append(fmt_mean_std(r[c], r[f"{c}_std"], digits))
        rows.append(cells)
    return html_table(headers, rows, "configs")


def _values(df: pd.DataFrame, col: str) -> str:
    if col not in df.columns:
        return "–"
    vals = sorted({format_value(v) for v in df[col] if not is_missing(v)})
    return ", ".join(vals) if vals else "–"


def provenance_block(df: pd.DataFrame, agg: pd.DataFrame, results_dir: Path, command: str) -> str:
    created = df["created_at"].dropna().astype(str) if "created_at" in df.columns else pd.Series(dtype=str)
    items = [
        ("experiments", _values(df, "experiment")),
        ("result rows", f"{len(df)} ({len(agg)} configurations, {agg['decoder'].nunique()} decoders)"),
        ("decoders", _values(df, "decoder")),
        ("datasets", _values(df, "dataset")),
        ("models", _values(df, "model")),
        ("splits", _values(df, "split")),
        ("devices", _values(df, "device")),
        ("CPU threads", _values(df, "threads")),
        ("torch versions", _values(df, "torch_version")),
        ("triton versions", _values(df, "triton_version")),
        ("git commits", _values(df, "git_commit")),
        ("hosts", _values(df, "host")),
        ("created_at", f"{created.min()} … {created.max()}" if not created.empty else "–"),
        ("results folder", str(results_dir)),
        ("report generated", datetime.now(UTC).isoformat(timespec="seconds")),
    ]
    rows = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in items)
    return (
        f'<table class="prov"><tbody>{rows}</tbody></table>'
        f"<p>Rebuild this report:</p><pre><code>{_esc(command)}</code></pre>"
    )


# -------------------------------------------------------------------------------------------- report

CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0;
       color: #1f2933; background: #fafbfc; }
main { max-width: 1320px; margin: 0 auto; padding: 24px 32px 64px; }
h1 { font-size: 26px; margin: 8px 0 4px; }
h2 { font-size: 20px; margin: 36px 0 6px; border-bottom: 1px solid #d9dee3; padding-bottom: 4px; }
p.sub { color: #52606d; margin: 0 0 12px; }
p.note { color: #52606d; font-size: 14px; margin: 4px 0 10px; }
nav a { margin-right: 14px; color: #1f77b4; text-decoration: none; font-size: 14px; }
.figure { background: white; border: 1px solid #e4e7eb; border-radius: 6px; padding: 6px; margin: 8px 0; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; background: white; }
th, td { border: 1px solid #e4e7eb; padding: 4px 8px; text-align: left; vertical-align: top; }
thead th { background: #f0f4f8; }
table.prov th { background: #f0f4f8; font-weight: 600; width: 160px; }
td { font-variant-numeric: tabular-nums; }
pre { background: #f0f4f8; padding: 8px 12px; border-radius: 4px; overflow-x: auto; }
details summary { cursor: pointer; color: #1f77b4; margin: 8px 0; }
"""


def _quality_grid(qcols: list[str]) -> list[list[str]]:
    families: dict[str, list[str]] = {}
    for c in qcols:
        m = QUALITY_RE.match(c)
        assert m is not None
        families.setdefault(m["family"], []).append(c)
    return list(families.values())


def _resolve_metric(qcols: list[str], metric: str | None) -> str | None:
    if metric:
        if metric not in qcols:
            raise UserInputError(
                f"--metric {metric!r}: not in these results; available quality metrics: {qcols or 'none'}"
            )
        return metric
    if not qcols:
        return None
    recalls = [c for c in qcols if c.lower().startswith("recall@")]
    pool = recalls or qcols
    return max(pool, key=lambda c: int(QUALITY_RE.match(c)["k"]))  # type: ignore[index]


def environment_section(df: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The Provenance section of a benchmark page: rows per (device, threads, torch, git commit)."""
    env_cols = [c for c in ("device", "threads", "torch_version", "git_commit") if c in df.columns]
    if not env_cols:
        return []
    envs = df.groupby(env_cols, dropna=False).size().reset_index(name="rows")
    return [("provenance", "Provenance", html_table([*env_cols, "rows"], envs.itertuples(index=False)))]


def write_page(out: Path, title: str, subtitle: str, sections: Sequence[tuple[str, str, str]]) -> Path:
    """One standalone HTML page: a title, a navigation bar and one <section> per (anchor, heading,
    body HTML); written atomically. Every report page of the dashboards goes through here."""
    nav = "".join(f'<a href="#{a}">{_esc(h)}</a>' for a, h, _ in sections)
    body = "".join(f'<section id="{a}"><h2>{_esc(h)}</h2>{b}</section>' for a, h, b in sections)
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(title)}</title><style>{CSS}</style></head><body><main>"
        f'<h1>{_esc(title)}</h1><p class="sub">{_esc(subtitle)}</p><nav>{nav}</nav>{body}'
        "</main></body></html>\n"
    )
    return atomic_write_text(out, page)


def build_report(
    results_dir: str | os.PathLike = DEFAULT_RESULTS_DIR,
    experiment: str | None = None,
    out_html: str | os.PathLike | None = None,
    title: str | None = None,
    *,
    metric: str | None = None,
    latency: str = "p50",
    budgets_ms: Sequence[float] | None = None,
    x_param: str = "beam_width",
) -> Path:
    """Write the HTML report for one experiment (or all) and return its path.

    metric: quality column for the Pareto front and the budget table (default: recall@<largest K>).
    latency: which latency statistic (p50, p90, p99, mean) is the cost axis and the budget's measure.
    budgets_ms: latency budgets for the table (default: quantiles of the observed latencies).
    """
    results_dir = Path(results_dir)
    df = read_results(results_dir, experiment)
    if df.empty:
        known = list_experiments(results_dir)
        what = f"experiment {experiment!r}" if experiment else "any experiment"
        raise UserInputError(
            f"no results for {what} in {results_dir.resolve()}; run `genrec sweep experiments/<name>.yaml` "
            f"(or `genrec eval ...`) first, or pick one of the known experiments: {known}"
        )
    if "benchmark" in df.columns:  # benchmark rows: NEZHA arms (issue 6), MaRI (issue 7), generic lines
        from genrec.dashboards.atspeed import build_atspeed_report, is_atspeed_frame
        from genrec.dashboards.mari import build_mari_report, is_mari_frame
        from genrec.dashboards.nezha import build_nezha_report, is_nezha_frame

        if is_nezha_frame(df):  # issue 6's arms: per-arm table, quality / latency bars, paired t-tests
            out = Path(out_html) if out_html is not None else default_out_path(results_dir, experiment)
            return build_nezha_report(df, out, title or f"genrec report: {experiment or 'NEZHA arms'}")
        if is_atspeed_frame(df):  # issue 16: Table 1, acceptance, N / gamma, ablations, Table 2
            out = Path(out_html) if out_html is not None else default_out_path(results_dir, experiment)
            return build_atspeed_report(df, out, title or f"genrec report: {experiment or 'AtSpeed'}")
        if is_mari_frame(df):
            out = Path(out_html) if out_html is not None else default_out_path(results_dir, experiment)
            return build_mari_report(df, out, title or f"genrec report: {experiment or 'MaRI benchmarks'}")
        if df["benchmark"].notna().all():  # other benchmarks (e.g. STATIC, issue 5): metric-vs-param lines
            from genrec.dashboards.benchmark_lines import build_benchmark_lines_report

            out = Path(out_html) if out_html is not None else default_out_path(results_dir, experiment)
            page_title = title or f"genrec report: {experiment or 'benchmarks'}"
            return build_benchmark_lines_report(df, out, page_title, x_param=x_param, metric=metric)
    if "kind" in df.columns and df["kind"].eq("loadtest").all():  # `genrec loadtest` rows: serving page
        from genrec.dashboards.serving import build_serving_report

        return build_serving_report(results_dir, experiment, out_html, title=title)
    if latency not in LATENCY_CHOICES:
        raise UserInputError(f"--latency {latency!r}: use one of {', '.join(LATENCY_CHOICES)}")
    out = Path(out_html) if out_html is not None else default_out_path(results_dir, experiment)
    given_title, title = title, title or f"genrec report: {experiment or 'all experiments'}"

    agg = aggregate_over_seeds(df)
    qcols = quality_columns(agg)
    metric = _resolve_metric(qcols, metric)
    latency_col = f"latency_{latency}_ms"
    has_latency = latency_col in agg.columns and agg[latency_col].notna().any()
    colors = decoder_colors(agg["decoder"])
    lines = build_lines(agg, x_param, colors)
    figure = _FigureWriter()
    command = rebuild_command(results_dir, experiment, out, metric, latency, budgets_ms, given_title)
    sections: list[tuple[str, str, str]] = []  # (anchor, heading, body)
    if any(not ln.reference for ln in lines):
        x_note = (
            f"x = decoder parameter <code>{_esc(x_param)}</code>; one line per decoder (split by its other "
            "parameters when they vary independently); configurations without it are dotted horizontal "
            "lines. Points are means over seeds, error bars one sample standard deviation."
        )
        vs = f"vs {x_param}"
    else:
        x_note = (
            f"No configuration has a <code>{_esc(x_param)}</code> parameter: one marker per configuration. "
            "Points are means over seeds, error bars one sample standard deviation."
        )
        vs = "per configuration"
    if qcols:
        fig = metric_vs_x_figure(agg, lines, _quality_grid(qcols), x_param, f"Quality {vs}")
        sections.append(("quality", f"Quality {vs}", f'<p class="note">{x_note}</p>' + figure(fig)))
    lat_cols = [c for c in _latency_cols(agg) if agg[c].notna().any()]
    if lat_cols:
        names = {c: f"latency {c.split('_')[1]} per batch (ms)" for c in lat_cols}
        fig = metric_vs_x_figure(agg, lines, [lat_cols], x_param, f"Latency {vs}", names)
        sections.append(
            ("latency", f"Latency (p50, p99) {vs}", f'<p class="note">{x_note}</p>' + figure(fig))
        )
    if metric and has_latency:
        front = pareto_front(agg, latency_col, metric, minimize_x=True, maximize_y=True)
        fig = pareto_figure(agg, front, metric, latency_col, latency, colors)
        body = (
            f'<p class="note">Each point is one configuration (mean over seeds). The Pareto front keeps the '
            f"configurations that no other configuration beats on both {_esc(metric)} (higher) and latency "
            f"{_esc(latency)} (lower).</p>"
            + figure(fig)
            + f"<h3>Pareto front ({len(front)} configurations)</h3>"
            + front_table(front, metric, latency_col, latency)
        )
        sections.append(("pareto", f"{metric} vs latency {latency}: Pareto front", body))
        budgets = list(budgets_ms) if budgets_ms else default_budgets(agg[latency_col])
        table = best_per_budget(agg, latency_col, metric, budgets)
        source = (
            "given budgets"
            if budgets_ms
            else "budgets at the 10/25/50/75/100% quantiles of the observed latencies"
        )
        body = (
            f'<p class="note">For each latency budget, the configuration with the best mean {_esc(metric)} '
            f"whose mean latency {_esc(latency)} fits the budget ({_esc(source)}).</p>"
            + budget_table(table, metric, latency_col, latency, agg)
        )
        sections.append(("budgets", "Best configuration per latency budget", body))
    elif not qcols:
        sections.append(
            ("pareto", "Quality vs latency", '<p class="note">These rows have no quality metrics.</p>')
        )
    else:
        sections.append(
            ("pareto", "Quality vs latency", f'<p class="note">These rows have no {_esc(latency_col)}.</p>')
        )
    sections.append(
        (
            "configs",
            "All configurations",
            f"<details><summary>{len(agg)} configurations (mean ± std over seeds)</summary>"
            f"{configurations_table(agg, qcols)}</details>",
        )
    )
    sections.append(("provenance", "Provenance", provenance_block(df, agg, results_dir.resolve(), command)))

    decoders = ", ".join(sorted(agg["decoder"].astype(str).unique()))
    subtitle = (
        f"{len(df)} result rows, {len(agg)} configurations; decoders: {decoders}; "
        f"experiments: {_values(df, 'experiment')}"
    )
    return write_page(out, title, subtitle, sections)
