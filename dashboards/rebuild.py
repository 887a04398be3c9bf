"""Where `genrec report` writes a page and the command line that rebuilds it (shown on every page)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from genrec.dashboards.analysis import format_value
from genrec.dashboards.page import ReportOptions

INDEX_NAME = "index"


def default_out_path(results_dir: str | os.PathLike, experiment: str | None) -> Path:
    """RESULTS_DIR/reports/<experiment>.html; the index of every experiment without one."""
    return Path(results_dir) / "reports" / f"{experiment or INDEX_NAME}.html"


def rebuild_command(
    results_dir: str | os.PathLike,
    experiment: str | None,
    out_html: str | os.PathLike,
    options: ReportOptions = ReportOptions(),
    title: str | None = None,
    *,
    embed_plotlyjs: bool = False,
) -> str:
    """The `genrec report ...` command line that rebuilds a page (shell-quoted); options at their
    defaults are left out."""
    argv = ["genrec", "report", "--results-dir", str(results_dir)]
    if experiment:
        argv += ["--experiment", experiment]
    argv += ["--out", str(out_html)]
    if options.metric:
        argv += ["--metric", options.metric]
    if options.latency != ReportOptions.latency:
        argv += ["--latency", options.latency]
    if options.budgets_ms:
        argv += ["--budgets", ",".join(format_value(b) for b in options.budgets_ms)]
    if title:
        argv += ["--title", title]
    if embed_plotlyjs:
        argv += ["--embed-plotlyjs"]
    return shlex.join(argv)
