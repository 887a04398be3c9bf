"""One look for every report page: a fixed colour per decoder / backend / arm, one plotly template,
labelled axes with units, [0, 1] for rates, log axes with readable ticks, and one diverging colour
axis for speed-up ratios.

Colours are fixed by name, not by position, so `nezha` is the same orange on the NEZHA arms page, a
beam-width sweep and a load test. A name outside the table gets a colour from a hash of the name
(stable across pages and runs) that is kept away from every fixed colour, so an unknown decoder is never
mistaken for a known one. Axis titles come from a registry of column -> (title, unit); a column outside
it gets a title guessed from its suffix (`_ms` -> ms, `_rate` -> a share on [0, 1]). Only pandas and
plotly (imported lazily); no page logic.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import pandas as pd

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


# ------------------------------------------------------------------------------------ axis registry


@dataclass(frozen=True)
class AxisSpec:
    title: str
    unit: str = ""  # shown in parentheses; "" for a plain count
    rate: bool = False  # a share on [0, 1]
    ratio: bool = False  # a speed-up / overhead ratio (x): 1.0 is "no change"


# exact column names (metrics and the `param_` -less parameter names)
AXES: dict[str, AxisSpec] = {
    # decoder rows
    "latency_mean_ms": AxisSpec("latency mean {per_batch}", "ms"),
    "throughput_users_per_s": AxisSpec("throughput", "users/s"),
    "memory_peak_mb": AxisSpec("peak memory", "MB"),
    "invalid_rate": AxisSpec("invalid share of returned items", rate=True),
    "missing_rate": AxisSpec("missing share of returned slots", rate=True),
    "beam_width": AxisSpec("beam width"),
    "k": AxisSpec("K (items recommended)"),
    "draft_width": AxisSpec("draft width"),
    # STATIC benchmarks
    "kernel_us_per_beam": AxisSpec("kernel time per beam", "µs"),
    "kernel_ms": AxisSpec("kernel time per step", "ms"),
    "kernel_ms_p99": AxisSpec("kernel time per step p99", "ms"),
    "mask_kernel_ms": AxisSpec("mask kernel time per step", "ms"),
    "max_branch_factor": AxisSpec("largest branch factor"),
    "max_branch": AxisSpec("max branch factor"),
    "step_ms": AxisSpec("constrained decode step time", "ms"),
    "unconstrained_step_ms": AxisSpec("unconstrained decode step time", "ms"),
    "overhead_ratio": AxisSpec("step time overhead (constrained / unconstrained)", "x", ratio=True),
    "overhead_ms": AxisSpec("step time overhead", "ms"),
    "build_s": AxisSpec("index build time", "s"),
    "memory_mb": AxisSpec("index memory", "MB"),
    "mb_per_million": AxisSpec("index memory per million constraints", "MB"),
    "compliance": AxisSpec("constraint compliance", rate=True),
    "constraint_size": AxisSpec("constraint-set size |C|"),
    "vocab": AxisSpec("codebook size V"),
    "levels": AxisSpec("SID levels L"),
    "batch": AxisSpec("batch size (users)"),
    "beam": AxisSpec("beam width"),
    # MaRI
    "time_speedup": AxisSpec("time speed-up (vanilla / MaRI)", "x", ratio=True),
    "flops_speedup": AxisSpec("FLOPs speed-up (vanilla / MaRI, theory)", "x", ratio=True),
    "b": AxisSpec("B (candidates)"),
    "d_user": AxisSpec("D_user"),
    "d_item": AxisSpec("D_item"),
    "d_hidden": AxisSpec("D_hidden"),
    "d_cross": AxisSpec("D_cross"),
    "chunk": AxisSpec("chunk size (columns)"),
    "time_vanilla_ms": AxisSpec("vanilla MatMul time", "ms"),
    "time_mari_ms": AxisSpec("MaRI time", "ms"),
    "time_vani_ms": AxisSpec("VanI model time", "ms"),
    "time_uoi_ms": AxisSpec("UOI model time", "ms"),
    "time_mari_neat_ms": AxisSpec("neat MaRI time", "ms"),
    "time_mari_fragmented_ms": AxisSpec("fragmented MaRI time", "ms"),
    "degradation_vs_neat_pct": AxisSpec("latency increase over neat MaRI", "%"),
    "degradation_vs_vanilla_pct": AxisSpec("latency increase over vanilla", "%"),
    # NEZHA / AtSpeed arms
    "valid_share": AxisSpec("returned slots holding an item", rate=True),
    "users_with_k_valid": AxisSpec("users with K valid items", rate=True),
    "drafts_valid_share": AxisSpec("unverified drafts that are items", rate=True),
    "identical_share": AxisSpec("batches identical to beam search", rate=True),
    "prefill_ms": AxisSpec("prefill time per batch", "ms"),
    "decode_ms": AxisSpec("decode time per batch", "ms"),
    "train_seconds": AxisSpec("training time", "s"),
    "ws": AxisSpec("walltime speed-up WS@K (reference / AtSpeed)", "x", ratio=True),
    "accepted_steps": AxisSpec("accepted steps AS@K", "levels per SD step"),
    "draft_beams": AxisSpec("draft beams N"),
    "gamma": AxisSpec("draft length gamma", "levels per SD step"),
    # load tests
    "throughput_rps": AxisSpec("achieved throughput", "answered req/s"),
    "goodput_rps": AxisSpec("goodput", "req/s within the SLO"),
    "offered_rate_rps": AxisSpec("offered rate", "req/s"),
    "rate": AxisSpec("offered rate", "req/s"),
    # serving benchmark (xgr_serving): figures at the highest rate meeting the SLO
    "best_rate": AxisSpec("highest rate meeting the SLO", "req/s"),
    "goodput_at_best": AxisSpec("goodput at that rate", "req/s within the SLO"),
    "batch_size_at_best": AxisSpec("mean server batch size at that rate", "requests"),
    "service_us_per_token": AxisSpec("service model: time per prompt token", "µs"),
    "service_overhead_ms": AxisSpec("service model: time per batch", "ms"),
    "batch_size_mean": AxisSpec("mean server batch size", "requests"),
}
_QUALITY_NAMES = {"hr": "HR", "recall": "Recall", "ndcg": "NDCG", "precision": "Precision", "mrr": "MRR"}
_LATENCY = re.compile(r"^latency_(p\d+|mean)_ms$")
_QUALITY = re.compile(r"^(hr|recall|ndcg|precision|mrr|map)@(\d+)$", re.I)
_ACCEPTANCE = re.compile(r"^acceptance(?:_level_(\d+))?$")
_PHASE = re.compile(r"^time_(\w+)_ms$")
_SPEEDUP = re.compile(r"^speedup_(\w+)_vs_(\w+)$")
_SUFFIX_UNITS = (("_ms", "ms"), ("_us", "µs"), ("_seconds", "s"), ("_s", "s"), ("_mb", "MB"), ("_pct", "%"))


def _family(name: str) -> AxisSpec | None:
    """Column families: latency_<stat>_ms, <quality>@K, acceptance[_level_j], speedup_<a>_vs_<b>."""
    if m := _LATENCY.match(name):
        return AxisSpec(f"latency {m[1]} {{per_batch}}", "ms")
    if m := _QUALITY.match(name):
        return AxisSpec(f"{_QUALITY_NAMES.get(m[1].lower(), m[1])}@{m[2]}", rate=True)
    if m := _ACCEPTANCE.match(name):
        return AxisSpec("acceptance rate" + (f" at level {m[1]}" if m[1] else ""), rate=True)
    if m := _PHASE.match(name):
        return AxisSpec(f"{m[1].replace('_', ' ')} time {{per_batch}}", "ms")
    if m := _SPEEDUP.match(name):
        return AxisSpec(f"speed-up {m[1]} vs {m[2]}", "x", ratio=True)
    return None


def describe(column: str) -> AxisSpec:
    """The axis spec of a column (a `param_` prefix is dropped): registry, then a column family,
    then a guess from the suffix (`_rate` / `_share` are shares on [0, 1])."""
    name = column.removeprefix("param_")
    if name in AXES:
        return AXES[name]
    family = _family(name)
    if family is not None:
        return family
    if name.endswith(("_rate", "_share")):
        return AxisSpec(name.replace("_", " "), rate=True)
    for suffix, unit in _SUFFIX_UNITS:
        if name.endswith(suffix):
            return AxisSpec(name.removesuffix(suffix).replace("_", " "), unit)
    return AxisSpec(name.replace("_", " "))


def is_rate(column: str) -> bool:
    return describe(column).rate


BATCH_COLUMNS = ("batch_size", "param_batch_size", "param_batch")


def batch_sizes(rows: pd.DataFrame | None, columns: Sequence[str] = BATCH_COLUMNS) -> list[int]:
    """Distinct positive batch sizes of the rows, from the first of `columns` that has any (decoder
    rows: `batch_size`; benchmarks: their batch parameter), for 'per batch of N users'."""
    if rows is None:
        return []
    for col in columns:
        if col in rows.columns:
            values = pd.to_numeric(rows[col], errors="coerce").dropna()
            sizes = sorted({int(v) for v in values if v > 0})
            if sizes:
                return sizes
    return []


def per_batch(rows: pd.DataFrame | None, columns: Sequence[str] = BATCH_COLUMNS) -> str:
    sizes = batch_sizes(rows, columns)
    if not sizes:
        return "per batch"
    return "per batch of " + ", ".join(map(str, sizes)) + " users"


def axis_title(column: str, rows: pd.DataFrame | None = None, *, log: bool = False) -> str:
    """'kernel time per beam (µs)'; latency titles name the batch size of `rows`; a log axis says so."""
    spec = describe(column)
    title = spec.title.replace("{per_batch}", per_batch(rows))
    unit = spec.unit or ("share, 0–1" if spec.rate else "")
    text = f"{title} ({unit})" if unit else title
    return f"{text} (log scale)" if log else text


# ------------------------------------------------------------------------------------------ log ticks

LOG_SPAN = 10.0  # values spanning at least a decade get a log axis (where every value is positive)


def numbers(values: Iterable[object]) -> list[float]:
    """The finite numbers among `values` (strings and None dropped)."""
    series = pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce").astype(float)
    return [float(v) for v in series if math.isfinite(v)]


def wants_log(values: Iterable[object], span: float = LOG_SPAN) -> bool:
    v = numbers(values)
    return bool(v) and min(v) > 0 and max(v) / min(v) >= span


def tick_text(value: float) -> str:
    """10, 20, 50, 100, 2000, 50k, 1M, 0.05: short labels for 1-2-5 ticks."""
    if value == 0:
        return "0"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e4, "k")):
        if abs(value) >= scale:
            div = 1e3 if suffix == "k" else scale
            return f"{value / div:g}{suffix}"
    return f"{value:g}"


def log_ticks(lo: float, hi: float) -> list[float]:
    """1, 2, 5 x 10^k inside [lo, hi] (only 1 x 10^k over more than five decades, where 2 and 5 would
    crowd); the neighbours around a range too narrow to hold two of them."""
    if not (lo > 0 and hi >= lo):
        return []
    steps = (1.0,) if hi / lo > 1e5 else (1.0, 2.0, 5.0)
    ticks = [
        m * 10.0**e
        for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
        for m in steps
    ]
    inside = [t for t in ticks if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]
    if len(inside) >= 2:
        return inside
    below = [t for t in ticks if t < lo][-1:]
    above = [t for t in ticks if t > hi][:1]
    return below + inside + above


def log_axis(values: Iterable[float]) -> dict:
    """type=log with 1-2-5 tick values and short labels (not plotly's '9, 100, 2, 3' minor labels)."""
    v = [x for x in numbers(values) if x > 0]
    axis: dict = {"type": "log"}
    if v:
        ticks = log_ticks(min(v), max(v))
        axis.update(tickmode="array", tickvals=ticks, ticktext=[tick_text(t) for t in ticks])
    return axis


def rate_axis() -> dict:
    """Shares on [0, 1] (a little margin so a point at 0 or 1 is not cut in half)."""
    return {"range": [-0.02, 1.02], "tickmode": "array", "tickvals": [0, 0.2, 0.4, 0.6, 0.8, 1.0]}


ZOOM_MARGIN = 0.08  # share of the data's span added on each side of a zoomed axis


def zoom_range(values: Iterable[object], rate: bool = False) -> list[float] | None:
    """[lo, hi] around the data (error-bar ends included by the caller) with ZOOM_MARGIN of the span
    on each side, so differences of 0.0075 between decoders are visible; a rate stays within
    [-0.02, 1.02]. None when there is nothing to zoom to."""
    v = numbers(values)
    if not v:
        return None
    lo, hi = min(v), max(v)
    pad = max((hi - lo) * ZOOM_MARGIN, abs(hi) * 0.01, 1e-6)
    lo, hi = lo - pad, hi + pad
    return [max(lo, -0.02), min(hi, 1.02)] if rate else [lo, hi]


def axis(
    column: str,
    values: Iterable[float] | None = None,
    rows: pd.DataFrame | None = None,
    *,
    log: bool | None = None,
    discrete: bool = False,
    title: str | None = None,
    zoom: bool = False,
) -> dict:
    """A layout axis for `column`: its title with unit, [0, 1] for a rate, a log axis with 1-2-5
    ticks when asked (log=True) or when `values` span a decade (log=None; never for rates), and tick
    marks at the values themselves on a linear axis with few of them (discrete=True: beam widths);
    zoom=True puts a rate on its data's range plus margins instead of [0, 1] (`values` must then
    include the error-bar ends)."""
    vals = [] if values is None else list(values)
    spec = describe(column)
    use_log = (not spec.rate and wants_log(vals)) if log is None else log
    out: dict = {"title": {"text": title or axis_title(column, rows, log=use_log)}}
    if spec.rate and not use_log and zoom and zoom_range(vals, True) is not None:
        out.update(range=zoom_range(vals, True))  # decoder quality: zoomed to the differences
    elif spec.rate and not use_log:
        out.update(rate_axis())
    elif use_log:
        out.update(log_axis(vals))
    elif discrete:
        distinct = sorted(set(numbers(vals)))
        if 0 < len(distinct) <= 12:
            out.update(tickmode="array", tickvals=distinct, ticktext=[tick_text(x) for x in distinct])
    return out


# ------------------------------------------------------------------------------ ratio colour axis

# red = slower than the baseline, white = 1.0x, blue = faster (plotly's RdBu runs red -> blue)
RATIO_SCALE = "RdBu"


def ratio_z(values: Iterable[float]) -> list[float | None]:
    """log2 of ratios: a diverging scale then puts 0.5x and 2x at equal distance from 1.0x."""
    return [math.log2(v) if v is not None and v > 0 and not math.isnan(v) else None for v in values]


def ratio_coloraxis(all_values: Iterable[float], title: str = "speed-up (x)") -> dict:
    """The figure's one colour axis for ratio heatmaps: log2 scale centred at 1.0x (cmid = log2 1 =
    0), the same cmin / cmax for every panel (from `all_values`, every ratio on the page), and a colour
    bar labelled in ratios (0.5x, 1x, 2x, ...)."""
    z = [x for x in ratio_z(all_values) if x is not None]
    reach = max([abs(x) for x in z] + [math.log2(1.1)])
    whole = math.floor(reach)
    step = max(1, math.ceil(whole / 3))  # at most 7 labels: 1x and three powers of two each side
    exponents = range(-whole // step * step, whole + 1, step) if whole else (-reach, 0.0, reach)
    ticks = [2.0**e for e in exponents]
    return {
        "colorscale": RATIO_SCALE,
        "cmid": 0.0,
        "cmin": -reach,
        "cmax": reach,
        "colorbar": {
            "title": {"text": title},
            "tickvals": [math.log2(t) for t in ticks],
            "ticktext": [
                f"1/{1 / t:.3g}x" if t < 1 and e == int(e) else f"{t:.3g}x" for t, e in zip(ticks, exponents)
            ],
        },
    }
