"""One look for every report page: a fixed colour per decoder / backend / arm, line and marker styles,
and one plotly template (axes, with units, log ticks and the ratio colour axis, are in axes.py).

Colours are fixed by name, not by position, so `nezha` is the same orange on the NEZHA arms page, a
beam-width sweep and a load test. A name outside the table gets a colour from a hash of the name
(stable across pages and runs) that is kept away from every fixed colour, so an unknown decoder is never
mistaken for a known one. Only plotly (imported lazily); no page logic.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import plotly.graph_objects as go

# ------------------------------------------------------------------------------------------- colours

DECODER_COLOURS = {
    "beam": "#1F77B4",  # blue family: beam search and its variants
    "beam-converged": "#08306B",
    "beam_sample": "#6BAED6",
    "hf_beam": "#17BECF",
    "nezha": "#FF7F0E",  # orange family: NEZHA and its ablation arms
    "nezha-1": "#FDD0A2",
    "nezha-2": "#FDAE6B",
    "nezha-3": "#F16913",
    "nezha-4": "#A63603",
    "nezha-every": "#BCBD22",
    "mtp": "#9467BD",
    "static": "#D62728",
    "atspeed_strict": "#2CA02C",  # green family: AtSpeed decoders and draft objectives
    "atspeed_relaxed": "#98DF8A",
    "xgr": "#E377C2",
    "popular": "#7F7F7F",
    "exhaustive": "#8C564B",
}
BACKEND_COLOURS = {
    "torch": "#1B9E77",
    "triton": "#D95F02",
    "official": "#7570B3",
    "dense": "#66A61E",
    "sparse": "#E6AB02",
    "cpu_trie": "#A6761D",
    "ppv_exact": "#393B79",
    "ppv_approx": "#637939",
    "hash_bitmap": "#843C39",
}
ARM_COLOURS = {
    "vani": "#525252",  # MaRI's three inference modes
    "uoi": "#9C9EDE",
    "mari": "#E7298A",
    "sft": "#BDBDBD",  # AtSpeed's draft objectives
    "wordkd": "#CEDB9C",
    "seqkd": "#8CA252",
    "tvdkd": "#74C476",
    "atspeed_s": "#006D2C",
    "atspeed_r": "#41AB5D",
}
FIXED_COLOURS = {**DECODER_COLOURS, **BACKEND_COLOURS, **ARM_COLOURS}
# spellings of one name seen on the pages (labels as the papers print them)
ALIASES = {
    "vanilla": "vani",
    "atspeed-s": "atspeed_s",
    "atspeed-r": "atspeed_r",
    "beam_converged": "beam-converged",
    "nezha_every": "nezha-every",
}
REFERENCE_COLOUR = "#222222"  # Pareto fronts, SLO lines, y = x: not a decoder
MIN_DISTANCE = 40.0  # RGB distance a hashed colour keeps from every fixed one (more would crowd them)


def colour_key(name: object) -> str:
    key = str(name).strip().lower()
    return ALIASES.get(key, key)


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    h = hex_colour.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def _hsl_hex(hue: float, sat: float, light: float) -> str:
    import colorsys

    r, g, b = colorsys.hls_to_rgb(hue, light, sat)
    return f"#{round(r * 255):02X}{round(g * 255):02X}{round(b * 255):02X}"


@cache
def hashed_colour(name: str) -> str:
    """A colour from a hash of `name` (not Python's salted hash: the same on every run), at least
    MIN_DISTANCE from every fixed colour; the farthest of 64 candidates if none is that far."""
    fixed = [_rgb(c) for c in FIXED_COLOURS.values()]
    best, best_d = "", -1.0
    for salt in range(64):
        digest = hashlib.sha256(f"{salt}:{name}".encode()).digest()
        hue, sat, light = digest[0] / 256, 0.45 + digest[1] / 256 * 0.4, 0.35 + digest[2] / 256 * 0.25
        candidate = _hsl_hex(hue, sat, light)
        d = min(math.dist(_rgb(candidate), f) for f in fixed)
        if d >= MIN_DISTANCE:
            return candidate
        if d > best_d:
            best, best_d = candidate, d
    return best


def colour(name: object) -> str:
    """The colour of a decoder, backend or arm on every page; unknown names get `hashed_colour`."""
    key = colour_key(name)
    return FIXED_COLOURS.get(key) or hashed_colour(key)


def tint(hex_colour: str, amount: float) -> str:
    """The colour mixed with white (amount 0: itself, 1: white): a variant of an entity (an ablation of
    an objective, a smaller D_user) reads as a lighter shade of the entity's own colour."""
    r, g, b = (round(c + (255 - c) * amount) for c in _rgb(hex_colour))
    return f"#{r:02X}{g:02X}{b:02X}"


DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "x", "star", "pentagon")


@dataclass(frozen=True)
class TraceStyle:
    colour: str
    dash: str
    symbol: str


def trace_styles(groups: Iterable[tuple[str, str]]) -> dict[tuple[str, str], TraceStyle]:
    """(colour name, variant) -> style: the name's fixed colour, and a dash and marker per variant
    of that name (in first-seen order), so two lines of one decoder share its colour and differ by
    dash."""
    seen: dict[str, list[str]] = {}
    out: dict[tuple[str, str], TraceStyle] = {}
    for name, variant in groups:
        variants = seen.setdefault(name, [])
        if variant not in variants:
            variants.append(variant)
        i = variants.index(variant)
        out[(name, variant)] = TraceStyle(colour(name), DASHES[i % len(DASHES)], SYMBOLS[i % len(SYMBOLS)])
    return out


# ------------------------------------------------------------------------------------------ template

PLOT_CONFIG = {"displaylogo": False, "responsive": True}
# a horizontal legend under the plots, anchored to the figure's bottom edge (below the axis titles)
BOTTOM_LEGEND = dict(orientation="h", yref="container", y=0.0, yanchor="bottom", x=0, xanchor="left")
FONT = '-apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif'


@cache
def template() -> go.layout.Template:
    """plotly_white with the pages' font, grid and hover label; trace colours are set per trace from
    `colour`, the colorway only catches a trace that forgot."""
    import plotly.graph_objects as go
    import plotly.io as pio

    base = pio.templates["plotly_white"]
    t = go.layout.Template(base)
    t.layout.update(
        font=dict(family=FONT, size=13, color="#1F2933"),
        title=dict(x=0.01, font=dict(size=16)),
        colorway=[hashed_colour(f"trace {i}") for i in range(10)],
        hoverlabel=dict(font=dict(family=FONT)),
        xaxis=dict(showline=True, linecolor="#9AA5B1", ticks="outside", title=dict(standoff=8)),
        yaxis=dict(showline=True, linecolor="#9AA5B1", ticks="outside", title=dict(standoff=8)),
    )
    return t


def legend_height(names: Sequence[str], width_px: int = 1150) -> int:
    """Rough pixel height of a wrapped horizontal legend, reserved in the bottom margin."""
    total = sum(60 + 7 * len(n) for n in names)
    return 26 * max(1, -(-total // width_px))


def style_figure(fig: go.Figure) -> go.Figure:
    """The shared template, and a bottom legend whose rows fit in the bottom margin (every page's
    figure writer calls this, so no page can drift)."""
    names = [t.name for t in fig.data if t.name and t.showlegend is not False]
    fig.update_layout(template=template())
    if names and fig.layout.legend.orientation is None:
        px = legend_height(names)
        fig.update_layout(legend=BOTTOM_LEGEND, margin=dict(b=70 + px))
        if fig.layout.height:
            fig.update_layout(height=fig.layout.height + px)
    return fig
