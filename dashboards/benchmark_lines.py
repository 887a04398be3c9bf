"""A generic report page for benchmark rows (`benchmark` column) that have no dedicated page.

One figure per metric against one `param_*` column (x): one line per combination of the other params
that vary (e.g. one per backend), points averaged over seeds, log-log axes when the x values span more
than two decades (the y axis goes log only where every value is positive). x is the requested
parameter when the rows vary it, else the first varying numeric parameter. Rows whose metric is NaN
(e.g. a baseline point the benchmark skipped) are left out of that figure; a metric with the same value
on every row is one sentence instead of a flat figure. The report registry (registry.py) sends here
the benchmark rows that no dedicated page claims.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from genrec.dashboards.analysis import PARAM_PREFIX, constant_value, format_value
from genrec.dashboards.axes import axis, is_rate
from genrec.dashboards.figures import flat_sentences
from genrec.dashboards.page import FigureWriter, PageContext, esc, finish_page, html_table, plotly
from genrec.dashboards.style import trace_styles

LOG_SPAN = 100.0  # x values spanning more than two decades get log axes
NOT_METRICS = {"seed", "threads", "schema_version", "trial_wall_s", "trial_started_at", "skipped", "returned"}


def varying_params(df: pd.DataFrame) -> list[str]:
    """param_* columns with more than one distinct value, in column order."""
    return [c for c in df.columns if c.startswith(PARAM_PREFIX) and df[c].dropna().astype(str).nunique() > 1]


def _numeric(s: pd.Series) -> bool:
    return pd.to_numeric(s.dropna(), errors="coerce").notna().all() and s.notna().any()


def choose_x(df: pd.DataFrame, x_param: str | None) -> str | None:
    """The x column: param_<x_param> when the rows vary it numerically, else the first such param."""
    numeric = [c for c in varying_params(df) if _numeric(df[c])]
    if x_param and PARAM_PREFIX + x_param in numeric:
        return PARAM_PREFIX + x_param
    return numeric[0] if numeric else None


def benchmark_metrics(df: pd.DataFrame, name: str) -> list[str]:
    """The benchmark's registered metrics present in the rows (numeric, not all NaN); else every
    numeric column that is neither a parameter nor bookkeeping."""
    try:
        from genrec.workloads.benchmark_registry import get_benchmark

        names = list(get_benchmark(name).metrics)
    except Exception:  # noqa: BLE001 - an unknown (e.g. renamed) benchmark: fall back to the columns
        names = [
            c
            for c in df.columns
            if not c.startswith(PARAM_PREFIX) and c not in NOT_METRICS and df[c].dtype.kind in "fiu"
        ]
    return [m for m in names if m in df.columns and pd.to_numeric(df[m], errors="coerce").notna().any()]


def log_axes(xs: pd.Series) -> bool:
    values = pd.to_numeric(xs, errors="coerce").dropna()
    return bool(len(values)) and values.min() > 0 and values.max() / values.min() > LOG_SPAN


def _label(key: tuple, groups: list[str]) -> str:
    return ", ".join(f"{g[len(PARAM_PREFIX) :]}={format_value(v)}" for g, v in zip(groups, key)) or "all"


def metric_figure(df: pd.DataFrame, xcol: str, groups: list[str], metric: str):
    """One line per combination of `groups`; mean over seeds of `metric` vs x; None when no point.
    A line's colour is that of its first group's value (backend=static is STATIC's red on every
    page), the other groups change its dash."""
    go, _ = plotly()
    rows = df[[xcol, *groups]].copy()
    rows[xcol] = pd.to_numeric(rows[xcol])
    rows["y"] = pd.to_numeric(df[metric], errors="coerce")
    rows = rows.dropna(subset=["y"])
    if rows.empty:
        return None
    agg = rows.groupby([*groups, xcol], dropna=False, as_index=False)["y"].agg(["mean", "std", "count"])
    parts = list(agg.groupby(groups, dropna=False, sort=True)) if groups else [((), agg)]
    keys = [key if isinstance(key, tuple) else (key,) for key, _ in parts]
    styles = trace_styles(_style_key(key) for key in keys)
    fig = go.Figure()
    for key, (_, part) in zip(keys, parts):
        part = part.sort_values(xcol)
        style = styles[_style_key(key)]
        fig.add_trace(
            go.Scatter(
                x=part[xcol],
                y=part["mean"],
                error_y={
                    "type": "data",
                    "array": part["std"].fillna(0.0),
                    "visible": bool(part["count"].max() > 1),
                },
                mode="lines+markers",
                name=_label(key, groups),
                line={"color": style.colour, "dash": style.dash},
                marker={"color": style.colour, "symbol": style.symbol},
            )
        )
    x_log = log_axes(agg[xcol])
    y_log = x_log and bool((agg["mean"] > 0).all()) and not is_rate(metric)
    fig.update_layout(
        height=430,
        title=f"{metric} vs {xcol[len(PARAM_PREFIX) :]}",
        xaxis=axis(xcol, agg[xcol], log=x_log, discrete=True),
        yaxis=axis(metric, agg["mean"], df, log=y_log),
        margin={"t": 60},
    )
    return fig


def _style_key(key: tuple) -> tuple[str, str]:
    """(colour name, variant): the first group's value names the colour, the rest the dash."""
    if not key:
        return ("all", "")
    return (format_value(key[0]), ", ".join(format_value(v) for v in key[1:]))


def benchmark_sections(
    df: pd.DataFrame, name: str, figure: FigureWriter, x_param: str | None, metric: str | None
) -> list[tuple[str, str, str]]:
    xcol = choose_x(df, x_param)
    metrics = benchmark_metrics(df, name)
    if metric in metrics:  # the experiment's metric first
        metrics.remove(metric)
        metrics.insert(0, metric)
    params = [c for c in df.columns if c.startswith(PARAM_PREFIX)]
    sections = []
    if xcol is None:
        body = '<p class="note">No numeric parameter varies across these rows: see the table.</p>'
    else:
        groups = [c for c in varying_params(df) if c != xcol]
        split = ", ".join(g[len(PARAM_PREFIX) :] for g in groups) or "nothing (one line)"
        x_name = xcol[len(PARAM_PREFIX) :]
        body = (
            f'<p class="note">x = <code>{esc(x_name)}</code>; one line per {esc(split)}; '
            "points are means over seeds (error bars one standard deviation when there are several); "
            f"log-log axes when x spans more than {LOG_SPAN:g}x. Missing points were skipped by the "
            "benchmark (NaN).</p>"
        )
        flat = {m: v for m in metrics if (v := constant_value(df[m])) is not None}
        body = flat_sentences(flat, "row") + body
        for m in metrics:
            fig = None if m in flat else metric_figure(df, xcol, groups, m)
            if fig is not None:
                body += figure(fig)
    sections.append((f"{name}-lines", f"{name}: metrics vs parameters", body))
    cols = [*params, *metrics]
    table_rows = [
        [format_value(v) if isinstance(v, float) else v for v in r]
        for r in df.sort_values(params or cols).loc[:, cols].itertuples(index=False)
    ]
    table = html_table([c.removeprefix(PARAM_PREFIX) for c in cols], table_rows)
    sections.append(
        (
            f"{name}-table",
            f"{name}: every row",
            f"<details><summary>{len(df)} rows</summary>{table}</details>",
        )
    )
    return sections


def build_benchmark_lines_report(
    df: pd.DataFrame,
    out: str | os.PathLike,
    title: str,
    x_param: str | None = None,
    metric: str | None = None,
    *,
    context: PageContext = PageContext(),
) -> Path:
    figure = FigureWriter()
    sections: list[tuple[str, str, str]] = []
    for name in sorted(df["benchmark"].astype(str).unique()):
        part = df[df["benchmark"].astype(str) == name].dropna(axis=1, how="all")
        sections += benchmark_sections(part, name, figure, x_param, metric)
    subtitle = f"{len(df)} result rows; benchmarks: {', '.join(sorted(df['benchmark'].astype(str).unique()))}"
    return finish_page(Path(out), title, subtitle, sections, df, context)
