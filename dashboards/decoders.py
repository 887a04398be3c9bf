"""The decoder page: rows of `genrec eval` and decoder sweeps (one row per decoder configuration and
seed), the page kind `decoders` of the report registry.

The headline is the deployment decision (dashboards/decision.py): one sentence per latency budget.
Sections: quality vs latency with the Pareto front (labelled points), what to deploy per budget (the
same Decision's table), latency (p50/p99) vs the x parameter, quality vs the x parameter folded under
them (beam width by default; metrics equal for every configuration collapse to a sentence), every
configuration, and provenance.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from genrec.dashboards.analysis import (
    BASELINES,
    QUALITY_RE,
    aggregate_over_seeds,
    config_key,
    pareto_front,
    quality_columns,
)
from genrec.dashboards.decision import decision_table, reference_name
from genrec.dashboards.figures import (
    Line,
    Reference,
    baseline_note,
    build_lines,
    flat_metrics,
    flat_sentences,
    metric_vs_x_figure,
    pareto_figure,
)
from genrec.dashboards.headline import config_label_series
from genrec.dashboards.page import (
    FigureWriter,
    PageContext,
    ReportOptions,
    esc,
    finish_page,
    note,
    values_text,
)
from genrec.dashboards.page_headlines import decoder_decision, decoder_headline
from genrec.dashboards.tables import configurations_table, front_table, latency_cols
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
    df: pd.DataFrame, agg: pd.DataFrame, lines: list[Line], x_param: str, figure: FigureWriter, decision=None
) -> list:
    """Latency vs x, then quality vs x folded (they come after the decision; flat metrics as
    sentences; result rows `df`, aggregated `agg`)."""
    vs, x_note = _x_note(lines, x_param)
    sections = []
    reference = reference_of(df, decision)
    metric = decision.quality.column if decision is not None else ""
    latency_col = decision.latency.column if decision is not None else "latency_p50_ms"
    floor = baseline_note(agg, metric, latency_col) if metric else ""
    x_note += note(f"Not drawn (baselines): {esc(floor)}.") if floor else ""
    lat_cols = [c for c in latency_cols(agg) if agg[c].notna().any()]
    if lat_cols:
        fig = metric_vs_x_figure(agg, lines, [lat_cols], x_param, f"Latency {vs}", df)
        sections.append(("latency", f"Latency (p50, p99) {vs}", x_note + figure(fig)))
    qcols = quality_columns(agg)
    if qcols:
        flat = flat_metrics(agg, qcols)
        grid = [row for row in ([c for c in r if c not in flat] for r in quality_grid(qcols)) if row]
        body = flat_sentences(flat)
        if grid:
            fig = metric_vs_x_figure(agg, lines, grid, x_param, f"Quality {vs}", df, reference)
            panels = sum(len(r) for r in grid)
            body += (
                f"<details><summary>{panels} quality panels {esc(vs)} (axes zoomed to the data; the "
                f"reference {esc(reference.name if reference else '–')} dashed)</summary>"
                f"{x_note}{figure(fig)}</details>"
            )
        sections.append(("quality", f"Quality {vs}", body))
    return sections


def short_names(df: pd.DataFrame) -> dict[str, str]:
    """Configuration key (the aggregated rows' `config`) -> the name the decision gives it."""
    return dict(zip(config_key(df), config_label_series(df)))


def reference_of(df: pd.DataFrame, decision) -> Reference | None:
    """The decision's reference as the figures find it in the aggregated rows."""
    if decision is None or decision.reference is None:
        return None
    key = next((k for k, v in short_names(df).items() if v == decision.reference), None)
    return Reference(key, reference_name(decision.reference)) if key is not None else None


def tradeoff_sections(
    df: pd.DataFrame, agg: pd.DataFrame, metric: str, latency: str, decision, figure: FigureWriter
) -> list:
    """Quality vs latency with the Pareto front (labelled points), and the decision per budget: the
    SAME `Decision` object the headline renders (its table is built once, from it)."""
    latency_col = f"latency_{latency}_ms"
    front = pareto_front(agg, latency_col, metric, minimize_x=True, maximize_y=True)
    reference = reference_of(df, decision)
    body = (
        note(
            f"Each point is one configuration (mean over seeds), labelled. The Pareto front keeps the "
            f"configurations that no other configuration beats on both {esc(metric)} (higher) and latency "
            f"{esc(latency)} (lower); axes are zoomed to the decoders compared (baselines are annotated, "
            "not plotted to scale)."
        )
        + figure(pareto_figure(agg, front, metric, latency_col, latency, df, reference, short_names(df)))
        + f"<h3>Pareto front ({len(front)} configurations)</h3>"
        + front_table(front, metric, latency_col, latency)
    )
    sections = [("pareto", f"{metric} vs latency {latency}: Pareto front", body)]
    if decision is not None:
        budget_body = note(
            "One row per point of the Pareto front (its latency is the budget): the configuration to "
            "deploy is the cheapest whose quality is not significantly below the best within the budget."
        ) + decision_table(decision)
        sections.append(("budgets", "What to deploy per latency budget", budget_body))
    return sections


def plan_decision(df: pd.DataFrame, options: ReportOptions, context: PageContext):
    """(decision, headline HTML): the one Decision both the headline and the budget section show."""
    decision = decoder_decision(df, options, context.results_dir)
    return decision, decoder_headline(df, options, decision) + context.headline


def build_decoder_page(
    df: pd.DataFrame,
    out: str | Path,
    title: str,
    options: ReportOptions = ReportOptions(),
    context: PageContext = PageContext(),
) -> Path:
    """Write the decoder page for result rows `df` (one experiment, or several) and return its path:
    the decision first, then the Pareto plot, the budget table, latency, and the per-width quality
    panels folded under them."""
    agg = aggregate_over_seeds(df)
    qcols = quality_columns(agg)
    metric = resolve_metric(qcols, options.metric)
    latency_col = f"latency_{options.latency}_ms"
    # baselines (the popular floor) are annotated, not drawn: a 0.15 ms line would set the axes
    lines = [ln for ln in build_lines(agg, options.x_param) if ln.decoder not in BASELINES]
    figure = FigureWriter()
    decision, headline = plan_decision(df, replace(options, metric=metric), context)
    context = replace(context, headline=headline)
    sections = []
    if metric and latency_col in agg.columns and agg[latency_col].notna().any():
        sections += tradeoff_sections(df, agg, metric, options.latency, decision, figure)
    else:
        missing = "quality metrics" if not qcols else esc(latency_col)
        sections.append(("pareto", "Quality vs latency", note(f"These rows have no {missing}.")))
    sections += curve_sections(df, agg, lines, options.x_param, figure, decision)
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
