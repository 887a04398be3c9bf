"""`genrec report`: standalone HTML pages built from the Parquet result rows only.

With an experiment: that experiment's page, drawn by the page builder of its kind (registry.py: the
decoder page, NEZHA arms, AtSpeed, MaRI, generic benchmark lines, load tests). Without one: every
experiment's page and an index linking them (index.py). Pages work offline: plotly.js is loaded from
`plotly.min.js` beside them (or embedded, `embed_plotlyjs=True`), nothing comes from a CDN.

The modules behind it: style.py (colours, template), axes.py (axis titles, units, log ticks), page.py
(page writer, provenance), figures.py / tables.py / decoders.py (the decoder page), one module per other
page kind.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from genrec.dashboards.page import PageContext, ReportOptions
from genrec.dashboards.rebuild import default_out_path, rebuild_command
from genrec.dashboards.registry import build_page
from genrec.workloads.errors import UserInputError
from genrec.workloads.results_store import DEFAULT_RESULTS_DIR, list_experiments, read_results

__all__ = ["build_report"]


def build_report(
    results_dir: str | os.PathLike = DEFAULT_RESULTS_DIR,
    experiment: str | None = None,
    out_html: str | os.PathLike | None = None,
    title: str | None = None,
    *,
    metric: str | None = None,
    latency: str = "p50",
    budgets_ms: Sequence[float] | None = None,
    x_param: str = "beam_width",
    embed_plotlyjs: bool = False,
) -> Path:
    """Write the report page of one experiment (or, without one, every experiment's page and the
    index linking them) and return its path.

    metric: quality column for the Pareto front and the budget table (default: recall@<largest K>).
    latency: which latency statistic (p50, p90, p99, mean) is the cost axis and the budget's measure.
    budgets_ms: latency budgets for the table (default: quantiles of the observed latencies).
    embed_plotlyjs: put plotly.js inside the page (one self-contained file) instead of loading
    plotly.min.js from beside it.
    """
    results_dir = Path(results_dir)
    options = ReportOptions(metric, latency, tuple(budgets_ms) if budgets_ms else None, x_param)
    if experiment is None:
        from genrec.dashboards.index import build_index

        return build_index(results_dir, out_html, title, options, embed_plotlyjs=embed_plotlyjs).path
    df = read_results(results_dir, experiment)
    if df.empty:
        raise UserInputError(
            f"no results for experiment {experiment!r} in {results_dir.resolve()}; run `genrec sweep "
            "experiments/<name>.yaml` (or `genrec eval ...`) first, or pick one of the known experiments: "
            f"{list_experiments(results_dir)}"
        )
    out = Path(out_html) if out_html is not None else default_out_path(results_dir, experiment)
    command = rebuild_command(results_dir, experiment, out, options, title, embed_plotlyjs=embed_plotlyjs)
    context = PageContext(results_dir.resolve(), command, embed_plotlyjs=embed_plotlyjs)
    return build_page(df, out, title, options, context, experiment)[1]
