"""`genrec report`: standalone HTML reports (they work offline) from the Parquet result rows.

With --experiment: that experiment's page. Without: every experiment's page and an index linking them
(RESULTS_DIR/reports/index.html). plotly and the dashboards are imported inside the command so
`genrec --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from genrec.workloads.errors import UserInputError

# same default as genrec.workloads.results_store, not imported from there so `genrec --help` stays fast
DEFAULT_RESULTS_DIR = "runs/results"


def parse_budgets(text: str | None) -> list[float] | None:
    """'10,50,100' -> [10.0, 50.0, 100.0] (milliseconds, sorted); None or '' -> None."""
    if not text:
        return None
    try:
        budgets = sorted({float(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise UserInputError(
            f"--budgets {text!r}: expected comma-separated milliseconds, e.g. --budgets 10,50,100"
        ) from None
    if not budgets or any(b <= 0 for b in budgets):
        raise UserInputError(f"--budgets {text!r}: budgets must be positive milliseconds, e.g. 10,50,100")
    return budgets


def report_command(
    experiment: Annotated[
        str | None,
        typer.Option(help="Experiment to report (default: every experiment's page and an index of them)."),
    ] = None,
    results_dir: Annotated[
        Path, typer.Option(help="Results folder holding parquet/experiment=<name>/ rows.")
    ] = Path(DEFAULT_RESULTS_DIR),
    out: Annotated[
        Path | None,
        typer.Option(
            help="HTML file to write (default: RESULTS_DIR/reports/<experiment>.html, or reports/index.html "
            "without --experiment; the experiments' pages go beside the index)."
        ),
    ] = None,
    metric: Annotated[
        str | None,
        typer.Option(
            help="Quality metric for the Pareto front and budget table (default: largest recall@K)."
        ),
    ] = None,
    latency: Annotated[
        str,
        typer.Option(help="Latency statistic for the cost axis and budgets: p50 or p99 (also p90, mean)."),
    ] = "p50",
    budgets: Annotated[
        str | None,
        typer.Option(
            help="Latency budgets in ms, e.g. 10,50,100 (default: quantiles of observed latencies)."
        ),
    ] = None,
    title: Annotated[str | None, typer.Option(help="Page title.")] = None,
    embed_plotlyjs: Annotated[
        bool,
        typer.Option(
            "--embed-plotlyjs",
            help="Put plotly.js (4.8 MB) inside every page: one self-contained file. Default: pages load "
            "plotly.min.js from beside them (written once per folder; offline too).",
        ),
    ] = False,
) -> None:
    """Build standalone HTML reports: one experiment's page, or every experiment's and an index."""
    from genrec.dashboards.page import ReportOptions
    from genrec.platform.benchmarks import load_report_pages

    load_report_pages()  # the studies' pages (NEZHA, AtSpeed, MaRI) register themselves

    budgets_ms = parse_budgets(budgets)
    options = ReportOptions(metric, latency, tuple(budgets_ms) if budgets_ms else None)
    if experiment is None:
        from genrec.dashboards.index import build_index

        print_index(build_index(results_dir, out, title, options, embed_plotlyjs=embed_plotlyjs))
        return
    from genrec.dashboards.report import build_report

    path = build_report(
        results_dir,
        experiment,
        out,
        title,
        metric=options.metric,
        latency=options.latency,
        budgets_ms=options.budgets_ms,
        embed_plotlyjs=embed_plotlyjs,
    ).resolve()
    typer.echo(f"report -> {path}")
    typer.echo(path.as_uri())


def print_index(result) -> None:
    """Each experiment's page (or why it was not built) and the index; exit 1 when a page failed."""
    for entry in result.entries:
        where = entry.page.resolve() if entry.page else f"not built: {entry.error}"
        typer.echo(f"  {entry.experiment} ({entry.kind}, {entry.rows} rows) -> {where}")
    path = result.path.resolve()
    typer.echo(f"index -> {path}")
    typer.echo(path.as_uri())
    if result.failures:
        typer.echo(f"{len(result.failures)} experiment page(s) failed to build (see above)", err=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("report")(report_command)
