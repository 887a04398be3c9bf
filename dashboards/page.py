"""The page every report goes through: HTML helpers, the figure writer, the provenance and rebuild
block, and `write_page` (title, headline slot, navigation, sections).

plotly.js is loaded once per page from `plotly.min.js` beside it (written from plotly's bundled copy,
once per folder), so pages stay small and still work offline; `embed_plotlyjs` puts the bundle inside
the page instead, for a single self-contained file.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from genrec.dashboards.analysis import PARAM_PREFIX, format_value, is_missing
from genrec.dashboards.style import FONT, PLOT_CONFIG, style_figure
from genrec.workloads.errors import UserInputError
from genrec.workloads.io import atomic_write_text

if TYPE_CHECKING:
    import plotly.graph_objects as go

PLOTLY_JS = "plotly.min.js"
LATENCY_CHOICES = ("p50", "p90", "p99", "mean")


@dataclass(frozen=True)
class PageContext:
    """Where a page's rows came from and how it is written; a builder called from Python with a bare
    DataFrame gets the default (no results folder, no rebuild command)."""

    results_dir: Path | None = None
    command: str = ""  # the `genrec report ...` line that rebuilds the page
    headline: str = ""  # HTML under the title (dashboards/headline.py)
    embed_plotlyjs: bool = False


@dataclass(frozen=True)
class ReportOptions:
    """`genrec report`'s page options; each page kind reads the ones it has a use for."""

    metric: str | None = None  # quality column for the Pareto front / budgets, or the metric drawn first
    latency: str = "p50"  # latency statistic of the cost axis (decoder pages)
    budgets_ms: tuple[float, ...] | None = None
    x_param: str = "beam_width"

    def __post_init__(self) -> None:
        if self.latency not in LATENCY_CHOICES:
            raise UserInputError(f"--latency {self.latency!r}: use one of {', '.join(LATENCY_CHOICES)}")


def plotly():
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError as e:  # pragma: no cover - plotly is a report dependency
        raise UserInputError("genrec report needs plotly: pip install 'plotly>=6'") from e
    return go, make_subplots


# ------------------------------------------------------------------------------------------ helpers


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def html_table(headers: Sequence[str], rows: Sequence[Sequence[object]], css: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>" for row in rows)
    cls = f' class="{esc(css)}"' if css else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def fmt_mean_std(mean: object, std: object, digits: int = 4) -> str:
    if is_missing(mean):
        return "–"
    text = f"{float(mean):.{digits}f}"
    return text if is_missing(std) else f"{text} ± {float(std):.{digits}f}"


def fmt_ms(value: object) -> str:
    if is_missing(value):
        return "–"
    v = float(value)
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 else f"{v:.3f}"


def params_text(row: pd.Series, shown: Sequence[str] | None = None) -> str:
    """'beam_width=10, k=10': the row's parameters, only those in `shown` when given (a table's
    varying parameters: the rest is the same on every row and said once under the table)."""
    names = row.index if shown is None else shown
    cols = [c for c in names if c.startswith(PARAM_PREFIX) and not is_missing(row[c])]
    text = ", ".join(f"{c[len(PARAM_PREFIX) :]}={format_value(row[c])}" for c in sorted(cols))
    if row.get("setting"):
        text = f"{text} [{row['setting']}]" if text else f"[{row['setting']}]"
    return text or "(none)"


def values_text(df: pd.DataFrame, col: str) -> str:
    """The distinct non-missing values of a column, sorted and comma-separated; '–' when none."""
    if col not in df.columns:
        return "–"
    vals = sorted({format_value(v) for v in df[col] if not is_missing(v) and str(v) != ""})
    return ", ".join(vals) if vals else "–"


def note(text_html: str) -> str:
    return f'<p class="note">{text_html}</p>'


class FigureWriter:
    """A figure's <div> and its Plotly.newPlot script, styled with the shared template; plotly.js
    itself is loaded once by `write_page`."""

    def __call__(self, fig: go.Figure) -> str:
        import plotly.io as pio

        style_figure(fig)
        out = pio.to_html(
            fig,
            include_plotlyjs=False,
            full_html=False,
            config=PLOT_CONFIG,
            default_width="100%",
            default_height=f"{int(fig.layout.height or 450)}px",
        )
        return f'<div class="figure">{out}</div>'


# --------------------------------------------------------------------------------------- provenance


def _created_range(df: pd.DataFrame) -> str:
    created = df["created_at"].dropna().astype(str) if "created_at" in df.columns else pd.Series(dtype=str)
    created = created[created != ""]
    return f"{created.min()} … {created.max()}" if not created.empty else "–"


def machine_load(df: pd.DataFrame) -> str:
    """'median 1.2 (0.4 … 3.9) over 12 trials' of the 1-minute load average the trials recorded."""
    if "load_1m" not in df.columns:
        return ""
    load = pd.to_numeric(df["load_1m"], errors="coerce").dropna()
    if load.empty:
        return ""
    return (
        f"median {load.median():.2f} ({load.min():.2f} … {load.max():.2f}) over {len(load)} rows "
        "(1-minute load average at trial time)"
    )


def provenance_items(
    df: pd.DataFrame, context: PageContext, configurations: str = ""
) -> list[tuple[str, str]]:
    rows = f"{len(df)}" + (f" ({configurations})" if configurations else "")
    items = [("experiments", values_text(df, "experiment")), ("result rows", rows)]
    if "benchmark" in df.columns and df["benchmark"].notna().any():
        items.append(("benchmarks", values_text(df, "benchmark")))
    if "decoder" in df.columns:  # a benchmark row's decoder is 'benchmark:<name>': listed above
        decoders = df[~df["decoder"].astype(str).str.startswith("benchmark:")]
        if not decoders.empty:
            items.append(("decoders", values_text(decoders, "decoder")))
    items += [
        ("datasets", values_text(df, "dataset")),
        ("models", values_text(df, "model")),
        ("splits", values_text(df, "split")),
        ("devices", values_text(df, "device")),
        ("CPU threads", values_text(df, "threads")),
        ("torch versions", values_text(df, "torch_version")),
        ("triton versions", values_text(df, "triton_version")),
        ("git commits", values_text(df, "git_commit")),
        ("hosts", values_text(df, "host")),
        ("created_at", _created_range(df)),
    ]
    load = machine_load(df)
    if load:
        items.append(("machine load", load))
    folder = str(context.results_dir) if context.results_dir else "– (rows passed in from Python)"
    items += [
        ("results folder", folder),
        ("report generated", datetime.now(UTC).isoformat(timespec="seconds")),
    ]
    return items


def environments_table(df: pd.DataFrame) -> str:
    """Rows per (device, threads, torch, git commit) when the page mixes more than one environment."""
    cols = [c for c in ("device", "threads", "torch_version", "git_commit", "host") if c in df.columns]
    if not cols:
        return ""
    envs = df.groupby(cols, dropna=False).size().reset_index(name="rows")
    if len(envs) < 2:
        return ""
    rows = [[format_value(v) if not is_missing(v) else "–" for v in r] for r in envs.itertuples(index=False)]
    return "<p>Rows per environment:</p>" + html_table([*cols, "rows"], rows, "envs")


def provenance_block(df: pd.DataFrame, context: PageContext, configurations: str = "") -> str:
    """Where the page's numbers come from (experiments, rows, decoders, datasets, devices, versions,
    commits, hosts, dates, machine load) and the command that rebuilds it."""
    items = provenance_items(df, context, configurations)
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in items)
    rebuild = (
        f"<p>Rebuild this report:</p><pre><code>{esc(context.command)}</code></pre>"
        if context.command
        else note("Built from rows passed in from Python: no <code>genrec report</code> command rebuilds it.")
    )
    return f'<table class="prov"><tbody>{rows}</tbody></table>' + environments_table(df) + rebuild


def provenance_section(
    df: pd.DataFrame, context: PageContext, configurations: str = ""
) -> tuple[str, str, str]:
    return ("provenance", "Provenance", provenance_block(df, context, configurations))


# ---------------------------------------------------------------------------------------------- page

CSS = f"""
body {{ font-family: {FONT}; margin: 0; color: #1f2933; background: #fafbfc; }}
main {{ max-width: 1320px; margin: 0 auto; padding: 24px 32px 64px; }}
h1 {{ font-size: 26px; margin: 8px 0 4px; }}
h2 {{ font-size: 20px; margin: 36px 0 6px; border-bottom: 1px solid #d9dee3; padding-bottom: 4px; }}
p.sub {{ color: #52606d; margin: 0 0 12px; }}
p.note {{ color: #52606d; font-size: 14px; margin: 4px 0 10px; }}
p.flat {{ font-size: 15px; margin: 6px 0; }}
.headline {{ background: white; border: 1px solid #d9dee3; border-left: 4px solid #1f77b4; border-radius: 6px;
             padding: 10px 16px; margin: 8px 0 16px; font-size: 15px; }}
.headline p, .headline ul {{ margin: 4px 0; }}
.headline ul {{ padding-left: 20px; }}
.headline .noisy {{ color: #8a4b00; }}
nav a {{ margin-right: 14px; color: #1f77b4; text-decoration: none; font-size: 14px; }}
.figure {{ background: white; border: 1px solid #e4e7eb; border-radius: 6px; padding: 6px; margin: 8px 0; }}
table {{ border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; background: white; }}
th, td {{ border: 1px solid #e4e7eb; padding: 4px 8px; text-align: left; vertical-align: top; }}
thead th {{ background: #f0f4f8; }}
table.prov th {{ background: #f0f4f8; font-weight: 600; width: 160px; }}
td {{ font-variant-numeric: tabular-nums; }}
pre {{ background: #f0f4f8; padding: 8px 12px; border-radius: 4px; overflow-x: auto; }}
details summary {{ cursor: pointer; color: #1f77b4; margin: 8px 0; }}
"""


def ensure_plotlyjs(folder: Path) -> Path:
    """plotly.min.js in `folder`, written from plotly's bundled copy when absent or different (a newer
    plotly): one copy per folder serves every page in it."""
    from plotly.offline import get_plotlyjs

    path = folder / PLOTLY_JS
    bundle = get_plotlyjs()
    size = len(bundle.encode("utf-8"))
    if path.is_file() and path.stat().st_size == size:
        with path.open(encoding="utf-8") as f:
            if f.read(200) == bundle[:200]:  # the header names the plotly.js version
                return path
    return atomic_write_text(path, bundle)


def plotlyjs_tag(out: Path, embed: bool) -> str:
    if embed:
        from plotly.offline import get_plotlyjs

        return f'<script type="text/javascript">{get_plotlyjs()}</script>'
    ensure_plotlyjs(out.parent)
    return f'<script src="{PLOTLY_JS}" charset="utf-8"></script>'


def write_page(
    out: Path,
    title: str,
    subtitle: str,
    sections: Sequence[tuple[str, str, str]],
    headline: str = "",
    *,
    embed_plotlyjs: bool = False,
) -> Path:
    """One standalone HTML page: a title, the subtitle, the headline (HTML: headline.py's
    `<div class="headline">`, or bare HTML that gets wrapped in one), a navigation bar and one
    <section> per (anchor, heading, body HTML); written atomically. plotly.js
    is loaded once in the head when the page has a figure. Every report page goes through here."""
    out = Path(out)
    nav = "".join(f'<a href="#{a}">{esc(h)}</a>' for a, h, _ in sections)
    body = "".join(f'<section id="{a}"><h2>{esc(h)}</h2>{b}</section>' for a, h, b in sections)
    script = plotlyjs_tag(out, embed_plotlyjs) if 'class="plotly-graph-div"' in body else ""
    # headline.py's HTML comes in its own <div class="headline">; bare HTML gets one. It comes right
    # under the title, before the subtitle: the decision is the first thing a reader sees
    lead = headline if 'class="headline"' in headline[:120] else f'<div class="headline">{headline}</div>'
    lead = lead if headline else ""
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style>{script}</head><body><main>"
        f'<h1>{esc(title)}</h1>{lead}<p class="sub">{esc(subtitle)}</p><nav>{nav}</nav>{body}'
        "</main></body></html>\n"
    )
    return atomic_write_text(out, page)


def finish_page(
    out: Path,
    title: str,
    subtitle: str,
    sections: list[tuple[str, str, str]],
    df: pd.DataFrame,
    context: PageContext,
    configurations: str = "",
) -> Path:
    """The page with the provenance block as its last section: how every page builder ends."""
    sections = [*sections, provenance_section(df, context, configurations)]
    return write_page(out, title, subtitle, sections, context.headline, embed_plotlyjs=context.embed_plotlyjs)
