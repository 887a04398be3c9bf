"""The AtSpeed page's figures (studies/atspeed/report.py): acceptance rate per drafted level, WS@K and AS@K
against the draft beams N or the draft length gamma (Figures 4 and 6), and the ablations' bars (Figure 3).
Every objective keeps its colour from style.py; an ablated objective or a variant is a lighter shade.
"""

from __future__ import annotations

import pandas as pd

from genrec.dashboards.axes import rate_axis
from genrec.dashboards.page import FigureWriter
from genrec.dashboards.style import colour, tint, trace_styles
from genrec.studies.atspeed.atspeed_arms import VERIFICATIONS
from genrec.studies.atspeed.report_rows import (
    ABLATIONS,
    LABELS,
    label,
    level_columns,
    mean_std,
    ordered,
    ordered_groups,
)

# an ablation reads as a lighter shade of its full objective's colour
VARIANT_TINT = {"w/o DR": 0.3, "w/o top-K": 0.3, "w/o CA": 0.5, "w/o TA": 0.7}


def objective_colour(objective: str, variant: str = "") -> str:
    """The objective's fixed colour (style.py); an ablated objective or a variant a lighter shade of it."""
    if objective in ABLATIONS:
        objective, variant = ABLATIONS[objective]
    return tint(colour(objective), VARIANT_TINT.get(variant, 0.4)) if variant else colour(objective)


# -------------------------------------------------------------------------- (b) acceptance per level


def acceptance_figure(main: pd.DataFrame, figure: FigureWriter) -> str:
    """Acceptance rate vs drafted level at one K (10 when swept), one panel per verification."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    levels = level_columns(main)
    if not levels:
        return ""
    ks = sorted(main["k"].unique())
    k = 10 if 10 in ks else ks[-1]
    verifications = ordered(main["verification"], VERIFICATIONS)
    fig = make_subplots(
        rows=1, cols=len(verifications), subplot_titles=[f"{v}, K = {k}" for v in verifications]
    )
    objectives = ordered(main["objective"], [*LABELS, *ABLATIONS])
    shown: set[str] = set()  # one legend entry per objective, whichever panel has it first
    for col, verification in enumerate(verifications, start=1):
        part = main[(main["verification"] == verification) & (main["k"] == k)]
        for objective in objectives:
            rows = part[part["objective"] == objective]
            if rows.empty:
                continue
            stats = [mean_std(rows[c]) for c in levels]
            fig.add_trace(
                go.Scatter(
                    x=list(range(1, len(levels) + 1)),
                    y=[m for m, _ in stats],
                    error_y={"type": "data", "array": [s for _, s in stats]},
                    name=label(objective),
                    legendgroup=objective,
                    showlegend=objective not in shown,
                    mode="lines+markers",
                    line={"color": objective_colour(objective)},
                ),
                row=1,
                col=col,
            )
            shown.add(objective)
        fig.update_xaxes(title_text="drafted level j", dtick=1, row=1, col=col)
        fig.update_yaxes(title_text="acceptance rate at level j (share, 0–1)", row=1, col=col, **rate_axis())
    fig.update_layout(height=420)
    return figure(fig)


# ----------------------------------------------------------------------------------- (c) N and gamma


def curve_figure(rows: pd.DataFrame, x: str, line: str, x_title: str, figure: FigureWriter) -> str:
    """WS@K and AS@K against `x`, one line per (verification, objective, K, `line` value)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=["walltime speedup WS@K", "accepted steps AS@K"])
    keys = ("verification", "objective", "k", line)
    groups = [(key, part) for key, part in ordered_groups(rows, keys) if part[x].nunique() >= 2]
    # an objective's colour, a dash per (verification, K, other parameter) within it
    styles = trace_styles((o, f"{v} {k} {other}") for (v, o, k, other), _ in groups)
    for key, part in groups:
        verification, objective, k, other = key
        style = styles[(objective, f"{verification} {k} {other}")]
        name = f"{label(objective)} {verification} K={k}, {'N' if line == 'draft_beams' else 'gamma'}={other}"
        for col, metric in enumerate(("ws", "accepted_steps"), start=1):
            stats = part.groupby(x)[metric].agg(["mean", "std"]).fillna({"std": 0.0})
            fig.add_trace(
                go.Scatter(
                    x=list(stats.index),
                    y=list(stats["mean"]),
                    error_y={"type": "data", "array": list(stats["std"])},
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    mode="lines+markers",
                    line={"color": objective_colour(objective), "dash": style.dash},
                    marker={"symbol": style.symbol},
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text=x_title, tickvals=sorted(rows[x].unique()))
    fig.update_yaxes(title_text="WS@K (reference ms / AtSpeed ms, x)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="AS@K (accepted levels per SD step)", rangemode="tozero", row=1, col=2)
    fig.update_layout(height=440)
    return figure(fig)


# ------------------------------------------------------------------------------------- (d) ablations


def ablation_figure(records: list[dict], figure: FigureWriter) -> str:
    """Figure 3: bars of WS@K (top) and AS@K (bottom) per K for each full objective and its variants,
    one column per verification (means over the paired seeds, error bars ± std)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    verifications = ordered([r["verification"] for r in records], VERIFICATIONS)
    titles = [f"{v}: {m}" for m in ("WS@K", "AS@K") for v in verifications]
    fig = make_subplots(rows=2, cols=len(verifications), subplot_titles=titles)
    shown: set[str] = set()  # one legend entry per bar name, across panels
    for col, verification in enumerate(verifications, start=1):
        bars: dict[str, dict[int, tuple[tuple[float, float], tuple[float, float]]]] = {}
        colours: dict[str, str] = {}
        for r in (r for r in records if r["verification"] == verification):
            bars.setdefault(label(r["full"]), {}).setdefault(r["k"], (r["ws"]["full"], r["as"]["full"]))
            variant = f"{label(r['full'])} {r['variant']}"
            bars.setdefault(variant, {})[r["k"]] = (r["ws"]["variant"], r["as"]["variant"])
            colours[label(r["full"])] = objective_colour(r["full"])
            colours[variant] = objective_colour(r["full"], r["variant"])
        for name, per_k in bars.items():
            first = name not in shown
            shown.add(name)
            ks = sorted(per_k)
            for row in (1, 2):
                stats = [per_k[k][row - 1] for k in ks]
                fig.add_trace(
                    go.Bar(
                        x=[f"K={k}" for k in ks],
                        y=[m for m, _ in stats],
                        error_y={"type": "data", "array": [s for _, s in stats]},
                        name=name,
                        legendgroup=name,
                        showlegend=first and row == 1,
                        marker_color=colours[name],
                    ),
                    row=row,
                    col=col,
                )
        fig.update_yaxes(title_text="WS@K (reference ms / AtSpeed ms, x)", rangemode="tozero", row=1, col=col)
        fig.update_yaxes(title_text="AS@K (accepted levels per SD step)", rangemode="tozero", row=2, col=col)
        fig.update_xaxes(title_text="K (items recommended)", row=1, col=col)
        fig.update_xaxes(title_text="K (items recommended)", row=2, col=col)
    fig.update_layout(barmode="group", height=820)
    return figure(fig)
