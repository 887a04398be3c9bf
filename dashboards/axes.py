"""Labelled axes for every report page: a registry of column -> (title, unit), titles guessed from a
column's suffix (`_ms` -> ms, `_rate` -> a share on [0, 1]), log axes with readable ticks where values
span a decade, zoomed ranges, and one diverging colour axis for speed-up ratios. Colours, traces and the
plotly template are in style.py. Only pandas; no page logic.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pandas as pd

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
