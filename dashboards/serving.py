"""The serving report: load-test result rows (`kind == "loadtest"`, from `genrec loadtest`) as one
standalone HTML page.

Sections: latency percentiles (p50/p95/p99) vs offered rate, achieved throughput / goodput /
unanswered share vs offered rate, and per configuration the highest rate that meets the SLO, in the
spirit of an SLO-bounded throughput comparison: a setup is only as good as the load it sustains while
its P99 stays within the latency budget and it sheds (almost) nothing.

A configuration is the decoder plus the row's free-text label (e.g. "batching=on") plus whichever
request parameters (beam width, k, burstiness, ...) vary between rows; the x axis is the offered rate
(open loop: the target rate; closed loop: the rate the clients actually offered).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from genrec.dashboards.analysis import format_value, is_missing
from genrec.dashboards.axes import axis, log_axis, rate_axis
from genrec.dashboards.page import FigureWriter, PageContext, esc, finish_page, fmt_ms, html_table, plotly
from genrec.dashboards.rebuild import default_out_path, rebuild_command
from genrec.dashboards.style import REFERENCE_COLOUR, TraceStyle, trace_styles
from genrec.workloads.errors import UserInputError
from genrec.workloads.results_store import list_experiments, read_results
from genrec.workloads.serving.slo import DEFAULT_MAX_UNANSWERED, DEFAULT_SLO_MS, meets_slo

LOADTEST_KIND = "loadtest"
# request parameters that name a configuration when they differ between rows (the rate never does:
# it is the x axis; closed-loop concurrency is the x axis of closed-loop curves)
CONFIG_PARAMS = (
    "param_mode",
    "param_beam_width",
    "param_k",
    "param_burstiness",
    "param_constraint",
    "param_constraint_set",  # rows written before the field was renamed `constraint`
    "param_max_batch_size",
    "param_batch_wait_timeout_s",
    "param_replicas",
    "param_ingress",
    "param_handler_loop",
)
LATENCY_PANELS = ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms")
_MEAN_COLUMNS = (
    *LATENCY_PANELS,
    "latency_p90_ms",
    "latency_mean_ms",
    "throughput_rps",
    "goodput_rps",
    "offered_rate_rps",
    "unanswered_rate",
    "rejection_rate",
    "error_rate",
    "timeout_rate",
    "overhead_p50_ms",
    "overhead_p99_ms",
    "batch_size_mean",
    "send_lag_p99_ms",
    "count_sent",
)


def _text(value: object) -> str:
    return "" if is_missing(value) else format_value(value)


def configuration_names(df: pd.DataFrame) -> pd.Series:
    """'beam [batching=on] (beam_width=5)': decoder, label, and the config parameters that vary."""
    varying = [c for c in CONFIG_PARAMS if c in df.columns and df[c].map(_text).nunique() > 1]
    labels = df["label"] if "label" in df.columns else pd.Series("", index=df.index)
    names = []
    for (_, row), label in zip(df.iterrows(), labels):
        name = str(row["decoder"])
        if _text(label):
            name += f" [{_text(label)}]"
        extra = ", ".join(f"{c.removeprefix('param_')}={_text(row[c])}" for c in varying if _text(row[c]))
        names.append(f"{name} ({extra})" if extra else name)
    return pd.Series(names, index=df.index, dtype=object)


def offered_rate(df: pd.DataFrame) -> pd.Series:
    """Target rate of open-loop rows; the measured offered rate of closed-loop rows."""
    target = pd.to_numeric(df["param_rate"], errors="coerce") if "param_rate" in df.columns else None
    measured = pd.to_numeric(df.get("offered_rate_rps", pd.Series(math.nan, index=df.index)), errors="coerce")
    return measured if target is None else target.fillna(measured)


def rate_points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (configuration, offered rate): numeric columns averaged over repeats, `n` = repeats."""
    work = df.assign(config=configuration_names(df), rate=offered_rate(df))
    cols = [c for c in _MEAN_COLUMNS if c in work.columns]
    for c in cols:
        work[c] = pd.to_numeric(work[c], errors="coerce")
    grouped = work.groupby(["config", "rate"], sort=True, dropna=False)
    out = grouped[cols].mean()
    out["n"] = grouped.size()
    out["decoder"] = grouped["decoder"].first()
    out["label"] = grouped["label"].first() if "label" in work.columns else ""
    return out.reset_index().sort_values(["config", "rate"], kind="stable").reset_index(drop=True)


def meets(points: pd.DataFrame, slo_ms: float, max_unanswered: float) -> pd.Series:
    """Per point, the load generator's SLO rule (`meets_slo`): P99 within the SLO and at most
    `max_unanswered` of requests rejected, failed or timed out (a missing share fails; rows from before
    the column existed pass on latency alone)."""
    p99 = (
        points["latency_p99_ms"] if "latency_p99_ms" in points.columns else pd.Series(math.nan, points.index)
    )
    unanswered = (
        points["unanswered_rate"].fillna(1.0)
        if "unanswered_rate" in points.columns
        else pd.Series(0.0, points.index)
    )
    verdicts = [meets_slo(float(p), float(u), slo_ms, max_unanswered) for p, u in zip(p99, unanswered)]
    return pd.Series(verdicts, index=points.index, dtype=bool)


def max_rate_table(points: pd.DataFrame, slo_ms: float, max_unanswered: float) -> pd.DataFrame:
    """Per configuration: the highest offered rate meeting the SLO with every lower tried rate meeting
    it too (a pass above a failure is noise, not capacity), and the first failing rate."""
    ok = meets(points, slo_ms, max_unanswered)
    rows = []
    for config, sub in points.assign(ok=ok).groupby("config", sort=True):
        sub = sub.sort_values("rate")
        best, fail = None, None
        for _, r in sub.iterrows():
            if not r["ok"]:
                fail = r
                break
            best = r
        rows.append(
            {
                "config": config,
                "best_rate": best["rate"] if best is not None else math.nan,
                "p99_at_best": best["latency_p99_ms"] if best is not None else math.nan,
                "throughput_at_best": best.get("throughput_rps", math.nan) if best is not None else math.nan,
                "goodput_at_best": best.get("goodput_rps", math.nan) if best is not None else math.nan,
                "first_failing_rate": fail["rate"] if fail is not None else math.nan,
                "p99_at_failure": fail["latency_p99_ms"] if fail is not None else math.nan,
                "rates_tried": len(sub),
            }
        )
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------- figures


DIAGONAL_COLOUR = "#9AA5B1"


def config_styles(points: pd.DataFrame) -> dict[str, TraceStyle]:
    """config -> style: its decoder's fixed colour, a dash and marker per configuration of it."""
    pairs = points.drop_duplicates("config").sort_values("config")[["decoder", "config"]]
    styles = trace_styles((str(d), str(c)) for d, c in pairs.itertuples(index=False))
    return {c: styles[(str(d), str(c))] for d, c in pairs.itertuples(index=False)}


def _curves(fig, points, columns, styles, best: dict[str, float], *, star_on: set[str]) -> None:
    """One line per configuration in each panel; a star on the configuration's max SLO-meeting rate."""
    go, _ = plotly()
    for config in sorted(points["config"].unique()):
        sub = points[points["config"] == config]
        style = styles[config]
        for col_idx, col in enumerate(columns, start=1):
            if col not in sub.columns or sub[col].isna().all():
                continue
            fig.add_trace(
                go.Scatter(
                    x=sub["rate"].astype(float).tolist(),
                    y=sub[col].astype(float).tolist(),
                    mode="lines+markers",
                    name=config,
                    legendgroup=config,
                    showlegend=col_idx == 1,
                    line=dict(color=style.colour, dash=style.dash, width=2),
                    marker=dict(color=style.colour, symbol=style.symbol, size=8),
                    hovertemplate=f"<b>{esc(config)}</b><br>offered %{{x:.4g}} req/s<br>{col} = %{{y:.4g}}"
                    "<extra></extra>",
                ),
                row=1,
                col=col_idx,
            )
            rate = best.get(config)
            if col in star_on and rate is not None and not math.isnan(rate):
                at = sub[sub["rate"] == rate]
                fig.add_trace(
                    go.Scatter(
                        x=[float(rate)],
                        y=[float(at[col].iloc[0])],
                        mode="markers",
                        name=f"max rate meeting SLO: {config}",
                        legendgroup=config,
                        showlegend=False,
                        marker=dict(
                            symbol="star", size=18, color=style.colour, line=dict(width=1, color="black")
                        ),
                        hovertemplate=f"<b>{esc(config)}</b><br>highest rate meeting the SLO: "
                        "%{x:.4g} req/s<extra></extra>",
                    ),
                    row=1,
                    col=col_idx,
                )


def _layout(fig, title: str, columns: int) -> None:
    # linear rate axis with plotly's own ticks: a bisecting search's rates crowd together, and on a
    # linear axis the served = offered diagonal is a straight line
    for c in range(1, columns + 1):
        fig.update_xaxes(title_text="offered rate (req/s)", rangemode="tozero", row=1, col=c)
    fig.update_layout(title=dict(text=title), height=440, margin=dict(l=60, r=20, t=70))


def _latency_axis(values: pd.Series, slo_ms: float) -> dict:
    """Log scale (1-2-5 ticks) once an overloaded point is 30x the SLO: on a linear axis the region
    around the SLO, where the answer is decided, would shrink to a few pixels."""
    v = values.dropna().astype(float)
    v = v[v > 0]
    if not v.empty and v.max() >= 30 * min(slo_ms, v.min()):
        return log_axis([*v, slo_ms])
    return {}


def latency_figure(points: pd.DataFrame, slo_ms: float, best: dict[str, float]):
    go, make_subplots = plotly()
    cols = [c for c in LATENCY_PANELS if c in points.columns]
    titles = [f"latency {c.split('_')[1]} (ms)" for c in cols]
    fig = make_subplots(rows=1, cols=len(cols), subplot_titles=titles, horizontal_spacing=0.07)
    _curves(fig, points, cols, config_styles(points), best, star_on={"latency_p99_ms"})
    x_hi = float(points["rate"].max()) * 1.05
    for c in range(1, len(cols) + 1):
        # a trace, not add_hline: shapes on a log axis take log10 coordinates
        fig.add_trace(
            go.Scatter(
                x=[0.0, x_hi],
                y=[slo_ms, slo_ms],
                mode="lines",
                name=f"SLO {format_value(slo_ms)} ms",
                legendgroup="slo",
                showlegend=c == 1,
                line=dict(color=REFERENCE_COLOUR, dash="dash", width=1.5),
                hoverinfo="skip",
            ),
            row=1,
            col=c,
        )
        log = _latency_axis(points[cols[c - 1]], slo_ms)
        name = cols[c - 1].split("_")[1]
        text = f"latency {name} of answered requests (ms)" + (" (log scale)" if log else "")
        fig.update_yaxes(title_text=text, row=1, col=c, **log)
    _layout(fig, "Latency percentiles vs offered rate", len(cols))
    return fig


def throughput_figure(points: pd.DataFrame, slo_ms: float, max_unanswered: float, best: dict[str, float]):
    go, make_subplots = plotly()
    cols = ["throughput_rps", "goodput_rps", "unanswered_rate"]
    titles = [
        "achieved throughput (answered req/s)",
        f"goodput (answered within {format_value(slo_ms)} ms, req/s)",
        "unanswered share (rejected + errors + timeouts)",
    ]
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles, horizontal_spacing=0.07)
    _curves(fig, points, cols, config_styles(points), best, star_on={"throughput_rps", "goodput_rps"})
    lo, hi = float(points["rate"].min()), float(points["rate"].max())
    for c in (1, 2):  # a server that keeps up answers everything it is offered: y = x
        fig.add_trace(
            go.Scatter(
                x=[lo, hi],
                y=[lo, hi],
                mode="lines",
                name="served = offered",
                legendgroup="diag",
                showlegend=c == 1,
                line=dict(color=DIAGONAL_COLOUR, dash="dot", width=1),
                hoverinfo="skip",
            ),
            row=1,
            col=c,
        )
    fig.add_hline(
        y=max_unanswered,
        line=dict(color=REFERENCE_COLOUR, dash="dash", width=1.5),
        annotation_text=f"limit {100 * max_unanswered:g}%",
        annotation_position="top left",
        row=1,
        col=3,
    )
    fig.update_yaxes(row=1, col=1, **axis("throughput_rps"))
    fig.update_yaxes(row=1, col=2, **axis("goodput_rps"))
    fig.update_yaxes(
        title_text="unanswered share of sent requests", tickformat=".0%", row=1, col=3, **rate_axis()
    )
    _layout(fig, "Throughput and goodput vs offered rate", 3)
    return fig


# -------------------------------------------------------------------------------------------- tables


def _rate(v: object) -> str:
    return "–" if is_missing(v) else format_value(round(float(v), 3))


def _num(v: object, digits: int = 1) -> str:
    return "–" if is_missing(v) else f"{float(v):.{digits}f}"


def _pct(v: object) -> str:
    return "–" if is_missing(v) else f"{100 * float(v):.1f}%"


def max_rate_html(table: pd.DataFrame) -> str:
    headers = [
        "configuration",
        "max rate meeting SLO (req/s)",
        "p99 there (ms)",
        "throughput there (req/s)",
        "goodput there (req/s)",
        "first failing rate (req/s)",
        "p99 there (ms)",
        "rates tried",
    ]
    rows = [
        [
            r["config"],
            _rate(r["best_rate"]) if not is_missing(r["best_rate"]) else "none meets the SLO",
            fmt_ms(r["p99_at_best"]),
            _num(r["throughput_at_best"]),
            _num(r["goodput_at_best"]),
            _rate(r["first_failing_rate"]) if not is_missing(r["first_failing_rate"]) else "none failed",
            fmt_ms(r["p99_at_failure"]),
            int(r["rates_tried"]),
        ]
        for _, r in table.iterrows()
    ]
    return html_table(headers, rows, "maxrate")


def points_html(points: pd.DataFrame, ok: pd.Series) -> str:
    headers = [
        "configuration",
        "offered (req/s)",
        "runs",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "throughput",
        "goodput",
        "rejected",
        "errors",
        "timeouts",
        "overhead p50 ms",
        "overhead p99 ms",
        "mean batch",
        "SLO",
    ]
    rows = []
    for (_, r), good in zip(points.iterrows(), ok):
        rows.append(
            [
                r["config"],
                _rate(r["rate"]),
                int(r["n"]),
                *(fmt_ms(r.get(c)) for c in LATENCY_PANELS),
                _num(r.get("throughput_rps")),
                _num(r.get("goodput_rps")),
                _pct(r.get("rejection_rate")),
                _pct(r.get("error_rate")),
                _pct(r.get("timeout_rate")),
                fmt_ms(r.get("overhead_p50_ms")),
                fmt_ms(r.get("overhead_p99_ms")),
                _num(r.get("batch_size_mean"), 2),
                "ok" if good else "fail",
            ]
        )
    return html_table(headers, rows, "points")


# -------------------------------------------------------------------------------------------- report


def _slo_from_rows(df: pd.DataFrame) -> float:
    if "slo_ms" in df.columns and df["slo_ms"].notna().any():
        return float(df["slo_ms"].dropna().mode().iloc[0])
    return DEFAULT_SLO_MS


def _max_unanswered(df: pd.DataFrame) -> float:
    col = df["max_unanswered_rate"].dropna() if "max_unanswered_rate" in df.columns else pd.Series()
    return float(col.mode().iloc[0]) if not col.empty else DEFAULT_MAX_UNANSWERED


def serving_sections(df: pd.DataFrame, slo: float, max_unanswered: float) -> tuple[list, pd.DataFrame]:
    """The page's sections and its (configuration, rate) points."""
    points = rate_points(df)
    ok = meets(points, slo, max_unanswered)
    table = max_rate_table(points, slo, max_unanswered)
    best = {r["config"]: float(r["best_rate"]) for _, r in table.iterrows() if not is_missing(r["best_rate"])}
    figure = FigureWriter()
    rule = f"P99 ≤ {format_value(slo)} ms and at most {100 * max_unanswered:g}% of requests unanswered"
    sections = [
        (
            "maxrate",
            "Highest rate meeting the SLO",
            f'<p class="note">SLO: {esc(rule)}. The highest offered rate per configuration at which it '
            "holds, with every lower tried rate holding too; the first failing rate bounds the true limit "
            "from above.</p>" + max_rate_html(table),
        ),
        (
            "latency",
            "Latency vs offered rate",
            '<p class="note">Latency percentiles of answered requests, measured by the client from send '
            "to full response, warm-up excluded. Dashed: the SLO; star: the configuration's highest "
            "rate meeting it.</p>" + figure(latency_figure(points, slo, best)),
        ),
        (
            "throughput",
            "Throughput and goodput vs offered rate",
            '<p class="note">Throughput counts every answered request per second of the measured '
            "window; goodput only those answered within the SLO. Dotted grey: served = offered. A "
            "server past its capacity falls below the diagonal, then sheds load (unanswered share).</p>"
            + figure(throughput_figure(points, slo, max_unanswered, best)),
        ),
        (
            "points",
            "Every configuration and rate",
            f"<details><summary>{len(points)} points (means over {len(df)} runs)</summary>"
            f"{points_html(points, ok)}</details>",
        ),
    ]
    return sections, points


def serving_page(
    df: pd.DataFrame,
    out: str | os.PathLike,
    title: str,
    slo_ms: float | None = None,
    *,
    max_unanswered: float | None = None,
    context: PageContext = PageContext(),
) -> Path:
    """Write the serving page for load-test rows `df` and return its path.

    slo_ms: the P99 budget (default: the SLO the load tests ran with, else 200 ms).
    max_unanswered: the largest share of rejected/failed/timed-out requests that still meets the SLO
    (default: the one the runs used, else 1%).
    """
    if slo_ms is not None and slo_ms <= 0:
        raise UserInputError(f"slo_ms {slo_ms}: must be > 0 milliseconds")
    slo = float(slo_ms) if slo_ms is not None else _slo_from_rows(df)
    limit = _max_unanswered(df) if max_unanswered is None else max_unanswered
    sections, points = serving_sections(df, slo, limit)
    rule = f"P99 ≤ {format_value(slo)} ms and at most {100 * limit:g}% of requests unanswered"
    subtitle = (
        f"{len(df)} load-test runs, {points['config'].nunique()} configurations, "
        f"offered rates {_rate(points['rate'].min())}–{_rate(points['rate'].max())} req/s; SLO {rule}"
    )
    configs = f"{points['config'].nunique()} configurations"  # provenance counts configurations, not points
    return finish_page(Path(out), title, subtitle, sections, df, context, configs)


def build_serving_report(
    results_dir: str | os.PathLike,
    experiment: str | None,
    out_html: str | os.PathLike | None = None,
    slo_ms: float | None = None,
    *,
    max_unanswered: float | None = None,
    title: str | None = None,
    embed_plotlyjs: bool = False,
) -> Path:
    """Read the load-test rows of one experiment (or all) and write their serving page (`serving_page`)."""
    results_dir = Path(results_dir)
    df = read_results(results_dir, experiment)
    if "kind" in df.columns:
        df = df[df["kind"] == LOADTEST_KIND].reset_index(drop=True)
    if df.empty:
        what = f"experiment {experiment!r}" if experiment else "any experiment"
        raise UserInputError(
            f"no load-test rows for {what} in {results_dir.resolve()}; run `genrec loadtest --url ... "
            f"--experiment NAME` first, or pick one of the known experiments: {list_experiments(results_dir)}"
        )
    out = Path(out_html) if out_html is not None else default_out_path(results_dir, experiment)
    command = rebuild_command(results_dir, experiment, out, embed_plotlyjs=embed_plotlyjs)
    context = PageContext(results_dir.resolve(), command, embed_plotlyjs=embed_plotlyjs)
    title = title or f"genrec serving report: {experiment or 'all experiments'}"
    return serving_page(df, out, title, slo_ms, max_unanswered=max_unanswered, context=context)
