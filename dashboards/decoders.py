"""The decoder page: rows of `genrec eval` and decoder sweeps (one row per decoder configuration and
seed), the page kind `decoders` of the report registry.

Sections: quality vs the x parameter (beam width by default; metrics equal for every configuration
collapse to a sentence), latency (p50/p99) vs the x parameter, quality vs latency with the Pareto
front, the best configuration per latency budget, every configuration, and provenance.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from genrec.dashboards.analysis import (
    QUALITY_RE,
    aggregate_over_seeds,
    best_per_budget,
    default_budgets,
    pareto_front,
    quality_columns,
)
from genrec.dashboards.figures import (
    Line,
    build_lines,
    flat_metrics,
    flat_sentences,
    metric_vs_x_figure,
    pareto_figure,
)
from genrec.dashboards.page import (
    FigureWriter,
    PageContext,
    ReportOptions,
    esc,
    finish_page,
    note,
    values_text,
)
from genrec.dashboards.tables import budget_table, configurations_table, front_table, latency_cols
from genrec.workloads.errors import UserInputError


def quality_grid(qcols: list[str]) -> list[list[str]]:
    """One row of panels per metric family (hr, ndcg, recall, ...), by K."""
    families: dict[str, list[str]] = {}
    for c in qcols:
        m = QUALITY_RE.match(c)
        assert m is not None
        families.setdefault(m["family"], []).append(c)
    return list(families.values())


def resolve_metric(qcols: list[str], metric: str | None) -> str | None:
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


def _x_note(lines: list[Line], x_param: str) -> tuple[str, str]:
    if any(not ln.reference for ln in lines):
        return f"vs {x_param}", note(
            f"x = decoder parameter <code>{esc(x_param)}</code>; one line per decoder (split by its other "
            "parameters when they vary independently); configurations without it are dotted horizontal "
            "lines. Points are means over seeds; error bars the larger of one sample standard deviation "
            "over seeds and the range over a trial's timed passes."
        )
    return "per configuration", note(
        f"No configuration has a <code>{esc(x_param)}</code> parameter: one marker per configuration. "
        "Points are means over seeds; error bars the larger of one sample standard deviation over seeds "
        "and the range over a trial's timed passes."
    )


def curve_sections(
    df: pd.DataFrame, agg: pd.DataFrame, lines: list[Line], x_param: str, figure: FigureWriter
) -> list:
    """Quality vs x (flat metrics as sentences) and latency vs x (result rows `df`, aggregated `agg`)."""
    vs, x_note = _x_note(lines, x_param)
    sections = []
    qcols = quality_columns(agg)
    if qcols:
        flat = flat_metrics(agg, qcols)
        grid = [row for row in ([c for c in r if c not in flat] for r in quality_grid(qcols)) if row]
        body = flat_sentences(flat)
        if grid:
            body += x_note + figure(metric_vs_x_figure(agg, lines, grid, x_param, f"Quality {vs}", df))
        sections.append(("quality", f"Quality {vs}", body))
    lat_cols = [c for c in latency_cols(agg) if agg[c].notna().any()]
    if lat_cols:
        fig = metric_vs_x_figure(agg, lines, [lat_cols], x_param, f"Latency {vs}", df)
        sections.append(("latency", f"Latency (p50, p99) {vs}", x_note + figure(fig)))
    return sections


def tradeoff_sections(
    df: pd.DataFrame,
    agg: pd.DataFrame,
    metric: str,
    latency: str,
    budgets_ms: tuple[float, ...] | None,
    figure: FigureWriter,
) -> list:
    """Quality vs latency with the Pareto front, and the best configuration per latency budget."""
    latency_col = f"latency_{latency}_ms"
    front = pareto_front(agg, latency_col, metric, minimize_x=True, maximize_y=True)
    body = (
        note(
            f"Each point is one configuration (mean over seeds). The Pareto front keeps the configurations "
            f"that no other configuration beats on both {esc(metric)} (higher) and latency {esc(latency)} "
            "(lower)."
        )
        + figure(pareto_figure(agg, front, metric, latency_col, latency, df))
        + f"<h3>Pareto front ({len(front)} configurations)</h3>"
        + front_table(front, metric, latency_col, latency)
    )
    budgets = list(budgets_ms) if budgets_ms else default_budgets(agg[latency_col])
    table = best_per_budget(agg, latency_col, metric, budgets)
    source = (
        "given budgets"
        if budgets_ms
        else "budgets at the 10/25/50/75/100% quantiles of the observed latencies"
    )
    budget_body = note(
        f"For each latency budget, the configuration with the best mean {esc(metric)} whose mean latency "
        f"{esc(latency)} fits the budget ({esc(source)})."
    ) + budget_table(table, metric, latency, agg)
    return [
        ("pareto", f"{metric} vs latency {latency}: Pareto front", body),
        ("budgets", "Best configuration per latency budget", budget_body),
    ]


def build_decoder_page(
    df: pd.DataFrame,
    out: str | Path,
    title: str,
    options: ReportOptions = ReportOptions(),
    context: PageContext = PageContext(),
) -> Path:
    """Write the decoder page for result rows `df` (one experiment, or several) and return its path."""
    agg = aggregate_over_seeds(df)
    qcols = quality_columns(agg)
    metric = resolve_metric(qcols, options.metric)
    latency_col = f"latency_{options.latency}_ms"
    lines = build_lines(agg, options.x_param)
    figure = FigureWriter()
    sections = curve_sections(df, agg, lines, options.x_param, figure)
    if metric and latency_col in agg.columns and agg[latency_col].notna().any():
        sections += tradeoff_sections(df, agg, metric, options.latency, options.budgets_ms, figure)
    else:
        missing = "quality metrics" if not qcols else esc(latency_col)
        sections.append(("pareto", "Quality vs latency", note(f"These rows have no {missing}.")))
    sections.append(
        (
            "configs",
            "All configurations",
            f"<details><summary>{len(agg)} configurations (mean ± std over seeds)</summary>"
            f"{configurations_table(agg, qcols)}</details>",
        )
    )
    decoders = ", ".join(sorted(agg["decoder"].astype(str).unique()))
    subtitle = (
        f"{len(df)} result rows, {len(agg)} configurations; decoders: {decoders}; "
        f"experiments: {values_text(df, 'experiment')}"
    )
    counts = f"{len(agg)} configurations, {agg['decoder'].nunique()} decoders"
    return finish_page(Path(out), title, subtitle, sections, df, context, counts)
