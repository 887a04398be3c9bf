"""The index page of a results folder (`genrec report` without `--experiment`): one report per
experiment, each built by its kind's page builder (registry.py), and a line per experiment linking it
with its kind, rows, decoders and dates.

Pages land beside the index (reports/<experiment>.html), so one plotly.min.js serves them all. An
experiment whose page fails to build keeps its line, with the error, and the other pages are still
written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from genrec.dashboards.page import PageContext, ReportOptions, esc, finish_page, note, values_text
from genrec.dashboards.rebuild import default_out_path, rebuild_command
from genrec.dashboards.registry import PAGES, build_page, experiment_kind
from genrec.workloads.errors import UserInputError
from genrec.workloads.results_store import list_experiments, read_results


@dataclass
class Entry:
    """One experiment's line on the index."""

    experiment: str
    kind: str
    rows: int
    decoders: str
    created: str
    page: Path | None = None
    error: str = ""


@dataclass
class IndexResult:
    path: Path
    entries: list[Entry] = field(default_factory=list)

    @property
    def failures(self) -> list[Entry]:
        return [e for e in self.entries if e.error]


def _created(df: pd.DataFrame) -> str:
    if "created_at" not in df.columns:
        return "–"
    created = df["created_at"].dropna().astype(str)
    created = created[created != ""]
    if created.empty:
        return "–"
    lo, hi = created.min()[:16].replace("T", " "), created.max()[:16].replace("T", " ")
    return lo if lo == hi else f"{lo} … {hi}"


def _what(df: pd.DataFrame) -> str:
    """The decoders of the rows, or their benchmarks (a benchmark row's decoder is 'benchmark:<name>')."""
    if "benchmark" in df.columns and df["benchmark"].notna().any():
        return values_text(df, "benchmark")
    return values_text(df, "decoder")


def build_entry(
    results_dir: Path, experiment: str, folder: Path, options: ReportOptions, embed: bool
) -> tuple[Entry, pd.DataFrame]:
    """Build one experiment's page beside the index; its line and its rows."""
    df = read_results(results_dir, experiment)
    kind = experiment_kind(df)
    entry = Entry(experiment, kind, len(df), _what(df), _created(df))
    out = folder / f"{experiment}.html"
    command = rebuild_command(results_dir, experiment, out, options, embed_plotlyjs=embed)
    context = PageContext(results_dir.resolve(), command, embed_plotlyjs=embed)
    try:
        _, entry.page = build_page(df, out, None, options, context, experiment)
    except Exception as e:  # noqa: BLE001 - one broken experiment must not hide the others' pages
        entry.error = f"{type(e).__name__}: {e}"
    return entry, df


def index_table(entries: list[Entry], folder: Path) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("experiment", "kind", "rows", "decoders / benchmarks", "when"))
    body = ""
    for e in entries:
        if e.page is not None:
            href = quote(os.path.relpath(e.page, folder))
            name = f'<a href="{esc(href)}">{esc(e.experiment)}</a>'
        else:
            name = f"{esc(e.experiment)} <em>(no page: {esc(e.error)})</em>"
        cells = [name, esc(PAGES[e.kind].label), str(e.rows), esc(e.decoders), esc(e.created)]
        body += "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
    return f'<table class="index"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def build_index(
    results_dir: str | os.PathLike,
    out_html: str | os.PathLike | None = None,
    title: str | None = None,
    options: ReportOptions = ReportOptions(),
    *,
    embed_plotlyjs: bool = False,
    headline: str = "",
) -> IndexResult:
    """Build every experiment's page and the index linking them; the index goes to `out_html`
    (default RESULTS_DIR/reports/index.html), the pages beside it."""
    results_dir = Path(results_dir)
    experiments = list_experiments(results_dir)
    if not experiments:
        raise UserInputError(
            f"no results for any experiment in {results_dir.resolve()}; run `genrec sweep "
            "experiments/<name>.yaml` (or `genrec eval ...`) first, or pick one of the known experiments: []"
        )
    out = Path(out_html) if out_html is not None else default_out_path(results_dir, None)
    built = [build_entry(results_dir, name, out.parent, options, embed_plotlyjs) for name in experiments]
    entries = [entry for entry, _ in built]
    everything = pd.concat([df for _, df in built], ignore_index=True)
    command = rebuild_command(results_dir, None, out, options, title, embed_plotlyjs=embed_plotlyjs)
    context = PageContext(results_dir.resolve(), command, headline, embed_plotlyjs)
    failed = [e for e in entries if e.error]
    body = note(
        "One report per experiment, each drawn by the page for its kind. Rebuild one with "
        "<code>genrec report --experiment NAME</code>."
    ) + index_table(entries, out.parent)
    sections = [("experiments", "Experiments", body)]
    subtitle = f"{len(experiments)} experiments, {len(everything)} result rows in {results_dir}"
    if failed:
        subtitle += f"; {len(failed)} page(s) failed to build"
    page = finish_page(out, title or "genrec reports", subtitle, sections, everything, context)
    return IndexResult(page, entries)
