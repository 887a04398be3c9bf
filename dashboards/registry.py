"""The report registry: experiment kind -> page builder.

A row's kind is read from the rows themselves, in this order: a `kind` column naming a registered page
kind (load tests write `kind = loadtest`), else the `benchmark` column (the page that claims that
benchmark, or the generic benchmark-lines page), else `decoders` (rows of `genrec eval` and decoder
sweeps). An experiment's kind is the kind of most of its rows; its page draws only those, and rows of
other kinds are named in a warning (stderr and the page's headline), not dropped silently. A new page
registers a `PageKind` with `register_page`; `build_report` and the index page look kinds up here and
nowhere else.

This module holds the toolkit's own kinds (decoder comparison, load test, generic benchmark lines); the
paper pages (NEZHA, AtSpeed, MaRI) live in their studies (genrec.studies.<topic>.registration) and
register themselves when the platform loads the studies. Builders import their modules lazily.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from genrec.dashboards.page import PageContext, ReportOptions, esc, note

DECODERS = "decoders"
BENCHMARK = "benchmark"
SHOWN_RUN_IDS = 5  # left-out rows a warning names by run id; the rest are counted
# builder(rows, out, title, options, context) -> the written page
Builder = Callable[[pd.DataFrame, Path, str, ReportOptions, PageContext], Path]


@dataclass(frozen=True)
class PageKind:
    name: str
    label: str  # what the index page calls it
    build: Builder
    claims: tuple[str, ...] = ()  # benchmark names whose rows this page draws
    heading: str = "genrec report"  # default title: '<heading>: <experiment>'

    def title(self, experiment: str | None) -> str:
        return f"{self.heading}: {experiment or self.label}"


def _decoders(df, out, title, options, context):
    from genrec.dashboards.decoders import build_decoder_page

    return build_decoder_page(df, out, title, options, context)


def _loadtest(df, out, title, options, context):
    from genrec.dashboards.serving import serving_page

    return serving_page(df, out, title, context=context)


def _benchmark_lines(df, out, title, options, context):
    from genrec.dashboards.benchmark_lines import build_benchmark_lines_report

    return build_benchmark_lines_report(
        df, out, title, x_param=options.x_param, metric=options.metric, context=context
    )


PAGES: dict[str, PageKind] = {}


def register_page(kind: PageKind) -> PageKind:
    if kind.name in PAGES:
        raise ValueError(f"report page kind {kind.name!r} registered twice")
    PAGES[kind.name] = kind
    return kind


for _kind in (
    PageKind(DECODERS, "decoder comparison", _decoders),
    PageKind("loadtest", "load test (serving)", _loadtest, heading="genrec serving report"),
    PageKind(BENCHMARK, "benchmarks", _benchmark_lines),
):
    register_page(_kind)


def page_for_benchmark(name: str) -> str:
    for kind in PAGES.values():
        if name in kind.claims:
            return kind.name
    return BENCHMARK


def row_kinds(df: pd.DataFrame) -> pd.Series:
    """The page kind of every row (see the module docstring for the order)."""
    kinds = pd.Series(DECODERS, index=df.index, dtype=object)
    if "benchmark" in df.columns:
        bench = df["benchmark"].astype(object)
        named = bench.notna() & (bench.astype(str) != "")
        kinds[named] = bench[named].astype(str).map(page_for_benchmark)
    if "kind" in df.columns:
        declared = df["kind"].astype(object)
        known = declared.isin(list(PAGES))
        kinds[known] = declared[known]
    return kinds


def experiment_kind(df: pd.DataFrame) -> str:
    """The kind of most of the rows (ties: the first by name)."""
    counts = row_kinds(df).value_counts()
    return sorted(counts[counts == counts.max()].index)[0]


def page_headline(kind: str, df: pd.DataFrame, options: ReportOptions) -> str:
    """The HTML shown under a page's title (the `.headline` slot): page_headlines.py picks what each
    kind compares, headline.py the rules; this is the one place pages get it from."""
    from genrec.dashboards.page_headlines import page_headline_html

    return page_headline_html(kind, df, options)


def build_page(
    df: pd.DataFrame,
    out: Path,
    title: str | None,
    options: ReportOptions,
    context: PageContext,
    experiment: str | None = None,
) -> tuple[str, Path]:
    """Build the page of the rows' kind from the rows of that kind; (kind, path). Rows of other
    kinds are left out with a warning on stderr and on the page."""
    name = experiment_kind(df)
    kind = PAGES[name]
    kinds = row_kinds(df)
    rows = df[kinds == name].reset_index(drop=True)
    if not context.headline and name != "decoders":  # the decoder page builds its own from its decision
        context = replace(context, headline=page_headline(name, rows, options))
    warning = mixed_kinds_warning(experiment, df, kinds, name)
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
        context = replace(
            context, headline=context.headline + note(f"<strong>Warning:</strong> {esc(warning)}")
        )
    return name, kind.build(rows, Path(out), title or kind.title(experiment), options, context)


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def mixed_kinds_warning(experiment: str | None, df: pd.DataFrame, kinds: pd.Series, drawn: str) -> str:
    """'' when every row is of the `drawn` kind; else one line naming the experiment, each kind's row
    count, the rows the page leaves out (by run id) and how to report them."""
    left_out = df[kinds != drawn]
    if left_out.empty:
        return ""
    counts = kinds.value_counts()
    mix = ", ".join(f"{k}: {_rows(n)}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    which = ""
    if "run_id" in left_out.columns:
        ids = left_out["run_id"].astype(str).tolist()
        more = f" and {len(ids) - SHOWN_RUN_IDS} more" if len(ids) > SHOWN_RUN_IDS else ""
        which = f" (run ids {', '.join(ids[:SHOWN_RUN_IDS])}{more})"
    return (
        f"experiment {experiment or '(unnamed)'!r} mixes result kinds ({mix}); its {PAGES[drawn].label} "
        f"page draws its {_rows(counts[drawn])} of kind {drawn} and leaves out "
        f"{_rows(len(left_out))} of other kinds{which}. Write each kind of result under its own "
        "experiment name to report them all."
    )
