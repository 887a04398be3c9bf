"""Checks on built figures, for tests (here and in a browser): every axis that carries a trace has a
title, and the figures of a written page can be read back without a browser.

Works on a `plotly.graph_objects.Figure` or on plain JSON (`{"data": [...], "layout": {...}}`, as
`figures_in_html` returns or as a browser's `gd.data` / `gd.layout` hold), so a headless-browser test
can pass what it reads from the page.
"""

from __future__ import annotations

import json
import re
from typing import Any

# trace types drawn without cartesian axes
NO_AXES = frozenset(
    {
        "pie",
        "table",
        "sunburst",
        "treemap",
        "icicle",
        "funnelarea",
        "indicator",
        "sankey",
        "parcoords",
        "parcats",
    }
)
NEWPLOT = re.compile(r"Plotly\.newPlot\(\s*")


def _as_json(fig: Any) -> dict:
    if hasattr(fig, "to_plotly_json"):
        return fig.to_plotly_json()
    return fig


def _axis_name(ref: str | None, letter: str) -> str:
    """'x' -> 'xaxis', 'x3' -> 'xaxis3' (a trace's axis reference to its layout key)."""
    ref = ref or letter
    return f"{letter}axis{ref[1:]}"


def _title_text(axis: dict | None) -> str:
    title = (axis or {}).get("title")
    if isinstance(title, dict):
        return str(title.get("text") or "")
    return str(title or "")


AXIS_KEY = re.compile(r"^[xy]axis\d*$")


def used_axes(fig: Any, declared: bool = False) -> list[str]:
    """Layout keys ('xaxis', 'yaxis2', ...) of the axes at least one trace is drawn on; with
    `declared`, also every axis the layout declares and does not hide (what a browser draws: an empty
    subplot cell's bare axes count)."""
    figure = _as_json(fig)
    data = figure.get("data") or []
    names: set[str] = set()
    if declared:
        layout = figure.get("layout") or {}
        names |= {k for k, v in layout.items() if AXIS_KEY.match(k) and (v or {}).get("visible") is not False}
    for trace in data:
        if trace.get("type", "scatter") in NO_AXES:
            continue
        names.add(_axis_name(trace.get("xaxis"), "x"))
        names.add(_axis_name(trace.get("yaxis"), "y"))
    return sorted(names)


def axis_titles(fig: Any, declared: bool = False) -> dict[str, str]:
    """{layout axis key: its title text ('' when none)} for every axis a trace is drawn on (and, with
    `declared`, every visible axis the layout declares)."""
    layout = _as_json(fig).get("layout") or {}
    return {name: _title_text(layout.get(name)) for name in used_axes(fig, declared)}


def missing_axis_titles(fig: Any, declared: bool = False) -> list[str]:
    """The axes carrying a trace (with `declared`: every visible axis) but no title: [] for a
    well-labelled figure."""
    return [name for name, text in axis_titles(fig, declared).items() if not text.strip()]


def figures_in_html(page: str) -> list[dict]:
    """Every figure of a written report page as {"data": [...], "layout": {...}}, read from its
    `Plotly.newPlot(id, data, layout, config)` call (plotly writes those arguments as JSON)."""
    decoder = json.JSONDecoder()
    figures = []
    for m in NEWPLOT.finditer(page):
        pos = m.end()
        args = []
        for _ in range(3):  # the div id, the data, the layout
            value, pos = decoder.raw_decode(page, pos)
            args.append(value)
            pos = page.index(",", pos) + 1 if len(args) < 3 else pos
            while page[pos].isspace():
                pos += 1
        figures.append({"data": args[1], "layout": args[2]})
    return figures
