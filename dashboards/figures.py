"""Figures of the decoder page (rows of `genrec eval` / decoder sweeps): metric vs a decoder parameter
as small multiples, and quality vs latency with the Pareto front.

Nothing here names a decoder: configurations come from the `param_*` columns (see `analysis.py`), a
decoder's lines are split by those of its other parameters that vary independently of the x
parameter, and configurations without it (e.g. the `popular` baseline) are reference lines. Colours,
axes and ticks come from `axes.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from genrec.dashboards.analysis import (
    BASELINES,
    PARAM_PREFIX,
    constant_value,
    format_value,
    is_missing,
    param_columns,
)
from genrec.dashboards.axes import axis, describe
from genrec.dashboards.page import esc, plotly
from genrec.dashboards.style import REFERENCE_COLOUR, colour, trace_styles
from genrec.workloads.results import spread_columns

if TYPE_CHECKING:
    import plotly.graph_objects as go


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


def format_value_or_dash(value: object) -> str:
    return "–" if is_missing(value) else format_value(value)


def _determined_by(rows: pd.DataFrame, xcol: str, col: str) -> bool:
    """True when every x value has a single value of `col` (e.g. k = min(10, beam_width))."""
    labels = rows[col].map(format_value_or_dash)
    return bool((labels.groupby(rows[xcol]).nunique() <= 1).all())


def _curve_groups(sub: pd.DataFrame, params: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """(label, rows) per curve of one decoder: split by the parameters that vary independently of x,
    and by the setting (dataset, device, ... when those vary)."""
    varying = [c for c in params if sub[c].map(format_value_or_dash).nunique() > 1]
    split_by = [c for c in varying if not _determined_by(sub, "_x", c)]
    labels = [
        ", ".join(f"{c[len(PARAM_PREFIX) :]}={format_value_or_dash(r[c])}" for c in split_by)
        for r in sub[split_by].to_dict("records")
    ]
    keys = pd.Series(list(zip(labels, sub["setting"].astype(str))), index=sub.index)
    out = []
    for key in sorted(keys.unique()):
        rows = sub[keys.map(lambda k, key=key: k == key)].sort_values("_x", kind="stable")
        name = (f" ({key[0]})" if key[0] else "") + (f" [{key[1]}]" if key[1] else "")
        out.append((name, rows))
    return out


def build_lines(agg: pd.DataFrame, x_param: str) -> list[Line]:
    """Trace groups of the aggregated table, generic over decoders and their parameters; a decoder's
    colour is fixed (style.colour), its curves differ by dash and marker."""
    xcol = PARAM_PREFIX + x_param
    xs = (
        pd.to_numeric(agg[xcol], errors="coerce")
        if xcol in agg.columns
        else pd.Series(float("nan"), agg.index)
    )
    params = [c for c in param_columns(agg) if c != xcol]
    groups: list[tuple[str, str, str, pd.DataFrame, bool]] = []  # (decoder, variant, label, rows, ref)
    for decoder in sorted(agg["decoder"].astype(str).unique()):
        mask = (agg["decoder"].astype(str) == decoder) & xs.notna()
        sub = agg[mask].assign(_x=xs[mask].to_numpy())  # (assigning a Series to an empty frame reindexes it)
        if not sub.empty:
            groups += [(decoder, v, decoder + v, rows, False) for v, rows in _curve_groups(sub, params)]
        for _, row in agg[(agg["decoder"].astype(str) == decoder) & xs.isna()].iterrows():
            ref = row.to_frame().T.assign(_x=float("nan"))
            groups.append((decoder, f"ref {row['label']}", f"{row['label']} (no {x_param})", ref, True))
    styles = trace_styles((decoder, variant) for decoder, variant, *_ in groups)
    lines = []
    for decoder, variant, label, rows, reference in groups:
        s = styles[(decoder, variant)]
        lines.append(
            Line(label, decoder, rows, s.colour, "dot" if reference else s.dash, s.symbol, reference)
        )
    return lines


# ------------------------------------------------------------------------------------------- figures


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


def std_array(rows: pd.DataFrame, metric: str) -> list[float]:
    col = f"{metric}_std"
    if col not in rows.columns:
        return [0.0] * len(rows)
    return [0.0 if is_missing(v) else float(v) for v in rows[col]]


def error_bars(rows: pd.DataFrame, metric: str, **style: object) -> dict:
    """Plotly error bars of `metric`: per point the larger of the std over seeds and the range over a
    trial's repeated passes (`spread_columns`: the fastest and slowest pass), so a single seed timed
    three times still shows its run-to-run spread."""
    std = std_array(rows, metric)
    lo_col, hi_col = spread_columns(metric)
    up, down = list(std), list(std)
    if lo_col in rows.columns and hi_col in rows.columns:
        for i, (v, lo, hi) in enumerate(zip(rows[metric], rows[lo_col], rows[hi_col])):
            if not (is_missing(v) or is_missing(lo) or is_missing(hi)):
                up[i], down[i] = max(up[i], float(hi) - float(v)), max(down[i], float(v) - float(lo))
    return dict(type="data", symmetric=False, array=up, arrayminus=down, visible=True, **style)


def flat_metrics(agg: pd.DataFrame, metrics: Sequence[str]) -> dict[str, float]:
    """{metric: value} of the metrics whose mean is the same for every configuration."""
    out = {}
    for m in metrics:
        if m in agg.columns:
            value = constant_value(agg[m])
            if value is not None:
                out[m] = value
    return out


def flat_sentences(flat: dict[str, float], what: str = "configuration") -> str:
    """'recall@10 = 0.6965 for every configuration', one line per flat metric."""
    return "".join(
        f'<p class="flat"><strong>{esc(m)} = {v:.4g}</strong> for every {esc(what)} '
        f"(no figure: the line would be flat).</p>"
        for m, v in flat.items()
    )


def _trace(go, ln: Line, rows: pd.DataFrame, metric: str, common: dict, span: tuple[float, float] | None):
    """One trace of a Line in one panel: markers per configuration (span None: no x parameter), a
    dotted horizontal line for a reference configuration, else a curve with error bars."""
    if span is None:
        return go.Scatter(
            x=[str(v) for v in rows["label"]],
            y=rows[metric].astype(float).tolist(),
            mode="markers",
            marker=dict(color=ln.color, symbol=ln.symbol, size=10),
            error_y=error_bars(rows, metric),
            **common,
        )
    if ln.reference:
        y = float(rows[metric].iloc[0])
        common = {**common, "customdata": common["customdata"] * 2}
        return go.Scatter(
            x=list(span), y=[y, y], mode="lines", line=dict(color=ln.color, dash="dot", width=1.5), **common
        )
    return go.Scatter(
        x=rows["_x"].astype(float).tolist(),
        y=rows[metric].astype(float).tolist(),
        mode="lines+markers",
        line=dict(color=ln.color, dash=ln.dash, width=2),
        marker=dict(color=ln.color, symbol=ln.symbol, size=8),
        error_y=error_bars(rows, metric, thickness=1.2),
        **common,
    )


def metric_vs_x_figure(
    agg: pd.DataFrame,
    lines: list[Line],
    grid: list[list[str]],
    x_param: str,
    title: str,
    results: pd.DataFrame | None = None,
    reference: Reference | None = None,
) -> go.Figure:
    """Small multiples (one cell per metric in `grid`): metric vs the x parameter, one trace per Line,
    error bars = std over seeds; configurations without the x parameter are horizontal dotted lines.
    Axis titles carry units (latency: the batch size of the result rows `results`), quality axes are
    zoomed to the drawn data (error bars included) with the `reference` configuration dashed, a decade
    of x gets a log axis. Baselines (analysis.BASELINES) are left to the caller's annotation."""
    go, make_subplots = plotly()
    nrows, ncols = len(grid), max(len(r) for r in grid)
    titles = [
        describe(grid[r][c]).title.replace("{per_batch}", "").strip() if c < len(grid[r]) else ""
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
    span = None if all_x.empty else (float(all_x.min()), float(all_x.max()))
    for r, metrics in enumerate(grid, start=1):
        for c, metric in enumerate(metrics, start=1):
            for ln in lines:
                rows = ln.rows[ln.rows[metric].notna()] if metric in ln.rows.columns else ln.rows.iloc[:0]
                if rows.empty:
                    continue
                common = dict(
                    name=ln.name,
                    legendgroup=ln.name,
                    showlegend=r == 1 and c == 1,
                    customdata=_customdata(rows, metric),
                    hovertemplate=_hover(metric, None if span is None else x_param),
                )
                fig.add_trace(_trace(go, ln, rows, metric, common, span), row=r, col=c)
            if span is None:  # long labels would squash the plot; the legend and hover name each point
                xaxis = dict(title_text="configuration (see legend)", showticklabels=False)
            else:
                xaxis = axis(x_param, all_x, discrete=True)
            fig.update_xaxes(row=r, col=c, **xaxis)
            drawn = pd.concat([ln.rows for ln in lines]) if lines else agg.iloc[:0]
            yaxis = axis(metric, drawn_extent(drawn, metric), results, zoom=True)
            fig.update_yaxes(row=r, col=c, **yaxis)
            mark_reference(fig, agg, reference, metric, row=r, col=c)
        for c in range(len(metrics) + 1, ncols + 1):  # a shorter row's empty cells: no bare axes
            fig.update_xaxes(visible=False, row=r, col=c)
            fig.update_yaxes(visible=False, row=r, col=c)
    fig.update_layout(title=dict(text=title), height=320 * nrows + 120, margin=dict(l=60, r=20, t=70))
    return fig


@dataclass(frozen=True)
class Reference:
    """The configuration the decision compares against: its key in the aggregated rows (`config`)
    and the name the decision's sentences give it."""

    config: str
    name: str


def drawn_extent(rows: pd.DataFrame, metric: str) -> list[float]:
    """The values of `metric` with their error-bar ends: what a zoomed axis must show."""
    if metric not in rows.columns or rows.empty:
        return []
    bars = error_bars(rows, metric)
    vals = pd.to_numeric(rows[metric], errors="coerce").astype(float).tolist()
    ends = [v + u for v, u in zip(vals, bars["array"])] + [v - d for v, d in zip(vals, bars["arrayminus"])]
    return [v for v in vals + ends if v == v]


def mark_reference(fig, agg: pd.DataFrame, reference: Reference | None, metric: str, **cell: int) -> None:
    """A dashed horizontal line at the reference configuration's value, labelled."""
    if reference is None or metric not in agg.columns:
        return
    hit = agg[agg["config"].astype(str) == reference.config]
    if hit.empty or is_missing(hit[metric].iloc[0]):
        return
    fig.add_hline(
        y=float(hit[metric].iloc[0]),
        line=dict(color=REFERENCE_COLOUR, dash="dash", width=1),
        annotation_text=f"reference {reference.name}",
        annotation_position="bottom right",
        annotation_font_size=10,
        **cell,
    )


def baseline_note(agg: pd.DataFrame, metric: str, latency_col: str) -> str:
    """'popular (baseline): recall@10 0.0123 at 0.15 ms' for the baselines left off the axes."""
    rows = agg[agg["decoder"].astype(str).isin(BASELINES)]
    parts = []
    for _, r in rows.iterrows():
        at = "" if is_missing(r.get(latency_col)) else f" at {float(r[latency_col]):.3g} ms"
        value = "–" if is_missing(r.get(metric)) else f"{float(r[metric]):.4f}"
        parts.append(f"{r['label']} (baseline): {metric} {value}{at}")
    return "; ".join(parts)


def _points_trace(
    go, rows: pd.DataFrame, decoder: str, metric: str, latency_col: str, latency_name: str, names: dict
):
    """One decoder's configurations as markers in its colour, error bars both ways (std over seeds)."""
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
    return go.Scatter(
        x=rows[latency_col].astype(float).tolist(),
        y=rows[metric].astype(float).tolist(),
        mode="markers+text",
        name=decoder,
        text=[names.get(str(c), str(v)) for c, v in zip(rows["config"], rows["label"])],  # as the decision
        textposition="top center",
        textfont=dict(size=10),
        customdata=custom,
        marker=dict(color=colour(decoder), size=10, line=dict(width=0.5, color="white")),
        error_x=error_bars(rows, latency_col, thickness=1),
        error_y=error_bars(rows, metric, thickness=1),
        hovertemplate=(
            "<b>%{customdata[0]}</b><br>"
            + f"{metric} = %{{y:.4g}} ± %{{customdata[2]:.2g}}<br>"
            + f"latency {latency_name} = %{{x:.4g}} ± %{{customdata[3]:.2g}} ms<br>"
            + "seeds: %{customdata[4]}<extra></extra>"
        ),
    )


def pareto_figure(
    agg: pd.DataFrame,
    front: pd.DataFrame,
    metric: str,
    latency_col: str,
    latency_name: str,
    results: pd.DataFrame | None = None,
    reference: Reference | None = None,
    names: dict[str, str] | None = None,
) -> go.Figure:
    """Quality vs latency for every configuration (coloured by decoder, labelled by `names`: config
    key -> the decision's name) with the Pareto
    front; axes zoomed to the decoders compared, the reference dashed, baselines (analysis.BASELINES)
    an annotation that sets no axis range."""
    go, _ = plotly()
    fig = go.Figure()
    usable = agg[agg[metric].notna() & agg[latency_col].notna()]
    baselines = baseline_note(usable, metric, latency_col)
    compared = usable[~usable["decoder"].astype(str).isin(BASELINES)]
    usable = compared if not compared.empty else usable
    front = front[front["label"].isin(usable["label"])]
    for decoder in sorted(usable["decoder"].astype(str).unique()):
        rows = usable[usable["decoder"].astype(str) == decoder]
        fig.add_trace(_points_trace(go, rows, decoder, metric, latency_col, latency_name, names or {}))
    if not front.empty:
        fig.add_trace(
            go.Scatter(
                x=front[latency_col].astype(float).tolist(),
                y=front[metric].astype(float).tolist(),
                mode="lines+markers",
                name="Pareto front",
                line=dict(color=REFERENCE_COLOUR, width=1.5, shape="hv"),
                marker=dict(symbol="circle-open", size=16, color=REFERENCE_COLOUR, line=dict(width=2)),
                customdata=[[str(v)] for v in front["label"]],
                hovertemplate="<b>Pareto: %{customdata[0]}</b><br>%{y:.4g} at %{x:.4g} ms<extra></extra>",
            )
        )
    fig.update_layout(
        title=dict(text=f"{metric} vs latency {latency_name}: every configuration and the Pareto front"),
        xaxis=axis(latency_col, drawn_extent(usable, latency_col), results),
        yaxis=axis(metric, drawn_extent(usable, metric), zoom=True),
        height=560,
        margin=dict(l=60, r=20, t=70, b=90 if baselines else 60),
    )
    mark_reference(fig, usable, reference, metric)
    if baselines:
        fig.add_annotation(
            text=f"not drawn to scale: {baselines}",
            xref="paper",
            yref="paper",
            x=0,
            y=-0.16,
            showarrow=False,
            align="left",
            font=dict(size=11),
        )
    return fig
