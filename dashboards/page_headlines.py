"""Which axes each report page compares on, and the headline HTML built from them.

The rules of comparison live in headline.py; this module only decides, per page kind, what to
compare: the decoder page compares quality and latency and picks the best decoder per latency
budget; benchmark pages compare their benchmark's first metric (and a timing, when they have one)
at the largest value of their swept size, because comparing a configuration at |C| = 10^3 with one at
|C| = 10^7 says nothing; the load-test page compares the highest rate each configuration sustained.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pandas as pd

from genrec.dashboards.analysis import BASELINES, PARAM_PREFIX, QUALITY_RE, format_value
from genrec.dashboards.decision import Decision, decide, render_decision
from genrec.dashboards.headline import Axis, build_headline, config_estimates, render_headline
from genrec.dashboards.page import ReportOptions

HIGHER = re.compile(
    r"speedup|throughput|goodput|acceptance|accepted|^ws$|^as_|^ws_|users_per_s|valid_share|compliance|"
    r"^rate|best_rate"
)
LOWER = re.compile(
    r"invalid|missing|^time_|^latency_|_ms$|_us$|_s$|_ms_|_us_|_over_|degradation|overhead|memory|_mb"
)
SHARE = re.compile(r"(invalid|missing|error|reject\w*)_rate$|_share$|^compliance$")


def axis_for(column: str) -> Axis | None:
    """The Axis of a result column by its name (None: a column whose better direction is unknown)."""
    bare = column.split("_", 1)[1] if column.startswith(("atspeed_", "beam_")) else column
    if QUALITY_RE.match(bare):
        return Axis(column, True, "rate", column)
    if SHARE.search(column):
        return Axis(column, not LOWER.search(column), "rate", column)
    unit = "ms" if column.endswith("_ms") else "x" if ("speedup" in column or "_over_" in column) else ""
    if HIGHER.search(column):
        return Axis(column, True, "timing", column, unit)
    if LOWER.search(column):
        return Axis(column, False, "timing", column, unit)
    return None


def _numeric(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce")


def at_largest_size(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Rows at the largest value of every numeric parameter swept over 3+ values, and a phrase
    saying so ('at num_constraints=10000000, the largest')."""
    picked, parts = df, []
    for col in sorted(c for c in df.columns if c.startswith(PARAM_PREFIX) and c != "param_seed"):
        values = _numeric(picked, col)
        if values.notna().all() and values.nunique() >= 3:
            top = values.max()
            picked = picked[values == top]
            parts.append(f"{col[len(PARAM_PREFIX) :]}={format_value(top)}")
    return picked, (f"at {', '.join(parts)} (the largest)" if parts else "")


UNCONSTRAINED = ("none", "all", "")


def split_decoder_rows(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(the decoders compared, the baselines, the rows under a narrower constraint): a decoder that may
    only recommend cold-start items solves another task, so it is reported beside, not ranked."""
    baseline = df["decoder"].astype(str).isin(BASELINES)
    constraint = df["param_constraint"] if "param_constraint" in df else pd.Series(None, index=df.index)
    narrowed = constraint.map(lambda v: isinstance(v, str) and v not in UNCONSTRAINED)
    return df[~baseline & ~narrowed], df[baseline], df[narrowed & ~baseline]


def side_notes(baselines: pd.DataFrame, narrowed: pd.DataFrame, quality: Axis | None) -> list[str]:
    notes = []
    if quality is None:
        return notes
    for label, est in config_estimates(baselines, quality) if not baselines.empty else []:
        notes.append(f"{label} (baseline): {quality.label} {est.value:.4f}")
    groups = narrowed.groupby(narrowed["param_constraint"].astype(str)) if len(narrowed) else []
    for constraint, rows in groups:
        for label, est in config_estimates(rows, quality):
            notes.append(
                f"{label} under constraint {constraint} (another task): {quality.label} {est.value:.4f}"
            )
    return notes


def decoder_axes(df: pd.DataFrame, options: ReportOptions) -> tuple[Axis | None, Axis]:
    """(quality, latency) of the decoder page: the metric asked for, else the deepest recall@K."""
    from genrec.dashboards.analysis import quality_columns

    qcols = quality_columns(df)
    by_k = sorted(qcols, key=lambda c: int(QUALITY_RE.match(c)["k"]), reverse=True)
    metric = options.metric or next((c for c in by_k if c.startswith("recall")), by_k[0] if by_k else None)
    sizes = sorted({int(b) for b in pd.to_numeric(df.get("batch_size", pd.Series(dtype=float))).dropna()})
    per = f"per batch of {sizes[0]} users" if len(sizes) == 1 else "per batch"
    latency = Axis(f"latency_{options.latency}_ms", False, "timing", f"latency {options.latency} {per}", "ms")
    return (Axis(metric, True, "rate", metric) if metric else None), latency


def compared_rows(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    compared, baselines, narrowed = split_decoder_rows(df)
    if compared.empty:
        return df, df.iloc[:0], df.iloc[:0]
    return compared, baselines, narrowed


def decoder_decision(df: pd.DataFrame, options: ReportOptions, results_dir=None) -> Decision | None:
    """The decision (dashboards/decision.py) the decoder page's headline and body both show."""
    quality, latency = decoder_axes(df, options)
    if quality is None or latency.column not in df or df.empty:
        return None
    return decide(compared_rows(df)[0], quality, latency, results_dir, options.budgets_ms)


def decoder_headline(df: pd.DataFrame, options: ReportOptions, decision: Decision | None = None) -> str:
    """The decision's sentences first, then the per-axis verdicts and the baselines (not ranked)."""
    quality, latency = decoder_axes(df, options)
    # a paired decision already says how quality compares; the unpaired per-axis verdict would
    # contradict it (a difference significant paired is often within the unpaired noise)
    axes = [quality] if quality and not (decision is not None and decision.paired) else []
    axes += [latency] if latency.column in df else []
    if "invalid_rate" in df:
        axes.append(Axis("invalid_rate", False, "rate", "invalid_rate"))
    compared, baselines, narrowed = compared_rows(df)
    head = replace(build_headline(compared, axes), notes=side_notes(baselines, narrowed, quality))
    lead = render_decision(decision) if decision is not None else ""
    axes_html = render_headline(head).replace('<div class="headline">', '<div class="axes">', 1)
    return '<div class="headline">' + lead + axes_html + "</div>"


def benchmark_headline(df: pd.DataFrame, options: ReportOptions) -> str:
    from genrec.workloads.benchmark_registry import BENCHMARKS

    parts = []
    for name, rows in df.groupby(df["benchmark"].astype(str), sort=True):
        bench = BENCHMARKS.get(name)
        declared = list(bench.metrics) if bench is not None else []
        wanted = [options.metric] if options.metric and options.metric in rows else []
        wanted += [c for c in declared if c in rows and c not in wanted]
        axes = [a for a in (axis_for(c) for c in wanted) if a is not None]
        timing = next((a for a in axes if a.kind == "timing"), None)
        chosen = axes[:1] + ([timing] if timing is not None and timing not in axes[:1] else [])
        if not chosen:
            continue
        rows = rows.assign(decoder=rows["decoder"] if "decoder" in rows else name)
        picked, where = at_largest_size(rows)
        head = build_headline(picked, chosen)
        if where:
            head = replace(head, compared=f"{head.compared} {where}")
        parts.append(render_headline(head))
    return "".join(parts)


def loadtest_headline(df: pd.DataFrame, options: ReportOptions) -> str:
    """Load tests: configurations compared on their answered-request p99 and their goodput."""
    axes = [a for a in (axis_for(c) for c in ("latency_p99_ms", "goodput_rps", "throughput_rps")) if a]
    axes = [a for a in axes if a.column in df]
    if not axes or "decoder" not in df:
        return ""
    return render_headline(build_headline(df, axes))


def page_headline_html(kind: str, df: pd.DataFrame, options: ReportOptions) -> str:
    """The headline of a page of `kind` (registry.py's kinds); '' when it has nothing to compare."""
    if df.empty:
        return ""
    if kind == "decoders":
        return decoder_headline(df, options)
    if kind == "loadtest":
        return loadtest_headline(df, options)
    if "benchmark" in df:
        return benchmark_headline(df, options)
    return ""
