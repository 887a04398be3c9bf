"""The headline of a report: what was compared, who wins on each axis, by how much, and whether the
difference is real.

Every report page opens with one. It is computed from the flat result rows only (no figure state), so
a test can recompute the winner from the Parquet rows independently and compare.

The rules, in one place:

* A configuration's value on an axis is the MEDIAN over its measurements (seeds, and the repeats a
  trial ran: `latency_p50_ms` of a trial with `eval.repeats >= 2` is already the median of its
  repeats, with `latency_p50_lo_ms` / `latency_p50_hi_ms` the smallest and largest repeat).
* Its uncertainty interval: for a rate measured on n users (hr@K, recall@K, ndcg@K, *_rate) the
  normal-approximation half-width 1.96 * sqrt(p (1 - p) / n), widened to the spread over seeds when
  that is larger; for a timing, the range over repeats and seeds. A timing measured once has an
  unknown spread: it is never crowned (a single run on a shared machine moved 20-50x).
* The winner must beat the runner-up by more than their combined uncertainty (rates: difference
  larger than sqrt(h1^2 + h2^2); timings: the intervals do not overlap). Otherwise the finding is
  "no significant difference", and every configuration within noise of the best is named.
* A metric that takes one value for every configuration is "flat": one sentence, no winner.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from genrec.dashboards.analysis import (
    best_per_budget,
    config_label,
    config_params,
    format_value,
    is_missing,
    param_columns,
    varying_context,
)
from genrec.workloads.results import spread_columns

Z95 = 1.96
FLAT_TOL = 1e-9
NOISY_SPREAD = 0.25  # a timing whose (max - min) / median over repeats exceeds this is flagged


@dataclass(frozen=True)
class Axis:
    """One column to compare on. kind 'rate': a share of users in [0, 1] (binomial uncertainty);
    'timing': a measured time or speed (uncertainty from repeats)."""

    column: str
    higher_is_better: bool
    kind: str = "rate"  # 'rate' | 'timing'
    name: str = ""  # how the page writes it ('recall@10', 'latency p50')
    unit: str = ""  # 'ms', 'x', ''

    @property
    def label(self) -> str:
        return self.name or self.column


@dataclass(frozen=True)
class Estimate:
    """Median and uncertainty interval of one configuration on one axis; n = measurements."""

    value: float
    lo: float
    hi: float
    n: int

    @property
    def half_width(self) -> float:
        return max(self.value - self.lo, self.hi - self.value)

    @property
    def spread(self) -> float:
        """(hi - lo) / |value|: the relative run-to-run spread of a timing."""
        return (self.hi - self.lo) / abs(self.value) if self.value else math.inf


@dataclass(frozen=True)
class Verdict:
    """The finding on one axis."""

    axis: Axis
    ranked: list[tuple[str, Estimate]]  # best first
    flat: bool
    significant: bool
    within_noise: list[str]  # configurations not distinguishable from the best (best included)
    margin: Estimate | None  # rates: best - runner-up; timings: runner-up / best (a speed-up)
    reason: str = ""  # why nothing was crowned, when nothing was

    @property
    def winner(self) -> str | None:
        return self.ranked[0][0] if self.ranked and self.significant and not self.flat else None


@dataclass(frozen=True)
class BudgetPick:
    budget: float
    config: str | None
    quality: Estimate | None
    cost: Estimate | None  # quality lost vs the best configuration at any latency (>= 0 when worse)
    cost_significant: bool


@dataclass(frozen=True)
class Headline:
    compared: str
    verdicts: list[Verdict]
    budgets: list[BudgetPick] = field(default_factory=list)
    noisy: list[str] = field(default_factory=list)  # configurations whose timing spread is large
    budget_axes: tuple[str, str] = ("", "")  # (quality label, latency label) of the budget table
    notes: list[str] = field(default_factory=list)  # shown, not ranked (baselines, other tasks)


# ------------------------------------------------------------------------------------- estimates


def estimate(rows: pd.DataFrame, axis: Axis) -> Estimate | None:
    """Median and interval of `axis.column` over the rows of one configuration (None: no value)."""
    values = pd.to_numeric(rows[axis.column], errors="coerce") if axis.column in rows else None
    if values is None or values.notna().sum() == 0:
        return None
    ok = values.notna()
    vals = values[ok].to_numpy(dtype=float)
    mid = float(np.median(vals))
    lo_col, hi_col = spread_columns(axis.column)
    lows = pd.to_numeric(rows.loc[ok, lo_col], errors="coerce") if lo_col in rows else None
    highs = pd.to_numeric(rows.loc[ok, hi_col], errors="coerce") if hi_col in rows else None
    lo, hi = float(vals.min()), float(vals.max())
    repeats = len(vals)
    if lows is not None and highs is not None and lows.notna().any():
        lo, hi = min(lo, float(lows.min())), max(hi, float(highs.max()))
        per_row = pd.to_numeric(rows.loc[ok, "repeats"], errors="coerce") if "repeats" in rows else None
        repeats = int(per_row.fillna(1).sum()) if per_row is not None else 2 * len(vals)
    if axis.kind == "rate":
        users = pd.to_numeric(rows.loc[ok, "users"], errors="coerce") if "users" in rows else None
        n_users = float(users.min()) if users is not None and users.notna().any() else math.nan
        p = min(max(mid, 0.0), 1.0)
        h = Z95 * math.sqrt(p * (1 - p) / n_users) if n_users > 0 else 0.0
        h = max(h, mid - lo, hi - mid)
        return Estimate(mid, mid - h, mid + h, len(vals))
    return Estimate(mid, lo, hi, repeats)


def config_estimates(df: pd.DataFrame, axis: Axis) -> list[tuple[str, Estimate]]:
    """(configuration label, estimate) per configuration of `df` that has a value on `axis`."""
    labels = config_label_series(df)
    out = []
    for label, rows in df.groupby(labels, sort=True):
        est = estimate(rows, axis)
        if est is not None:
            out.append((str(label), est))
    return out


def varying_params(rows: pd.DataFrame) -> list[str]:
    """The parameter columns that take more than one value in `rows` (one decoder's rows)."""
    text = lambda v: "" if is_missing(v) else format_value(v)  # noqa: E731
    return [c for c in param_columns(rows) if rows[c].map(text).nunique() > 1]


def config_label_series(df: pd.DataFrame) -> pd.Series:
    """A short label per row's configuration: the decoder and only the parameters that vary among that
    decoder's rows ('beam(beam_width=20)', 'nezha'), plus the context that varies ('[model=...]')."""
    labels = pd.Series("", index=df.index, dtype=object)
    for decoder, rows in df.groupby(df["decoder"].astype(str), sort=False):
        shown = varying_params(rows)
        for i, r in rows.iterrows():
            labels[i] = config_label(decoder, config_params(r, shown))
    for c in varying_context(df):  # only where a row differs from most rows ('[model=nezha-ckpt]')
        values = df[c].map(format_value)
        usual = values.mode().iloc[0]
        odd = values != usual
        labels[odd] = labels[odd] + " [" + c + "=" + values[odd] + "]"
    return labels


# -------------------------------------------------------------------------------------- verdicts


def _better(axis: Axis, a: float, b: float) -> bool:
    return a > b if axis.higher_is_better else a < b


def distinguishable(axis: Axis, best: Estimate, other: Estimate) -> bool:
    """Whether `best` beats `other` by more than their combined uncertainty."""
    if axis.kind == "rate":
        gap = abs(best.value - other.value)
        return gap > math.hypot(best.half_width, other.half_width) and gap > FLAT_TOL
    if best.n < 2 or other.n < 2:  # a single timing: its spread is unknown
        return False
    if axis.higher_is_better:
        return best.lo > other.hi
    return best.hi < other.lo


def margin(axis: Axis, best: Estimate, other: Estimate) -> Estimate:
    """Rates: best - other (an absolute difference); timings: how many times better the best is."""
    if axis.kind == "rate":
        h = math.hypot(best.half_width, other.half_width)
        d = abs(best.value - other.value)
        return Estimate(d, d - h, d + h, min(best.n, other.n))
    if axis.higher_is_better:  # throughput, speed-up: best / other
        ratio = best.value / other.value if other.value else math.inf
        lo = best.lo / other.hi if other.hi else math.inf
        hi = best.hi / other.lo if other.lo else math.inf
    else:  # a time: other / best
        ratio = other.value / best.value if best.value else math.inf
        lo = other.lo / best.hi if best.hi else math.inf
        hi = other.hi / best.lo if best.lo else math.inf
    return Estimate(ratio, lo, hi, min(best.n, other.n))


def verdict(df: pd.DataFrame, axis: Axis) -> Verdict | None:
    """The finding on one axis over the configurations of `df` (None: no configuration has it)."""
    ests = config_estimates(df, axis)
    if not ests:
        return None
    sign = -1.0 if axis.higher_is_better else 1.0
    ranked = sorted(ests, key=lambda e: (sign * e[1].value, e[0]))
    values = [e.value for _, e in ranked]
    flat = len(ranked) > 1 and max(values) - min(values) <= FLAT_TOL * max(1.0, abs(values[0]))
    if len(ranked) == 1 or flat:
        return Verdict(
            axis, ranked, flat, False, [c for c, _ in ranked], None, "only one" if not flat else ""
        )
    best = ranked[0][1]
    within = [c for c, e in ranked if c == ranked[0][0] or not distinguishable(axis, best, e)]
    significant = len(within) == 1
    reason = ""
    if not significant and axis.kind == "timing" and min(best.n, ranked[1][1].n) < 2:
        reason = "measured once (no repeats): its run-to-run spread is unknown"
    return Verdict(axis, ranked, False, significant, within, margin(axis, best, ranked[1][1]), reason)


def budget_picks(
    df: pd.DataFrame, quality: Axis, latency: Axis, budgets: Sequence[float]
) -> list[BudgetPick]:
    """Per latency budget: the best-quality configuration whose median latency fits, and what it
    costs in quality against the best configuration at any latency."""
    q = dict(config_estimates(df, quality))
    lat = dict(config_estimates(df, latency))
    both = sorted(c for c in q if c in lat)
    if not both:
        return []
    # the pick itself is analysis.best_per_budget (the budget table's rule) over the medians
    sign = 1.0 if quality.higher_is_better else -1.0
    medians = pd.DataFrame(
        {"config": both, "q": [sign * q[c].value for c in both], "lat": [lat[c].value for c in both]}
    )
    top = best_per_budget(medians, "lat", "q", [math.inf])["config"].iloc[0]
    picks = []
    for budget, pick in zip(budgets, best_per_budget(medians, "lat", "q", budgets)["config"]):
        if is_missing(pick):
            picks.append(BudgetPick(float(budget), None, None, None, False))
            continue
        cost = margin(quality, q[top], q[pick]) if pick != top else Estimate(0.0, 0.0, 0.0, q[pick].n)
        sig = pick != top and distinguishable(quality, q[top], q[pick])
        picks.append(BudgetPick(float(budget), pick, q[pick], cost, sig))
    return picks


def noisy_configs(df: pd.DataFrame, latency: Axis, threshold: float = NOISY_SPREAD) -> list[str]:
    """Configurations whose timing varied by more than `threshold` of its median between repeats."""
    return [c for c, e in config_estimates(df, latency) if e.n >= 2 and e.spread > threshold]


def compared_sentence(df: pd.DataFrame) -> str:
    """'12 configurations of 3 decoders (beam, nezha, static) on synth-..., model tiny, 2000 users,
    3 repeats each'."""
    labels = config_label_series(df)
    decoders = sorted(df["decoder"].astype(str).unique()) if "decoder" in df else []
    where = ""
    if "param_decoder" in df and df["param_decoder"].notna().any():  # a benchmark that varies decoders
        where = f" in {', '.join(decoders)}"
        decoders = sorted(df["param_decoder"].dropna().astype(str).unique())
    parts = [
        f"{labels.nunique()} configurations of {len(decoders)} decoder(s) ({', '.join(decoders)}){where}"
    ]
    for col, word in (("dataset", "data"), ("model", "model")):
        if col in df and df[col].notna().any():
            vals = sorted({str(v) for v in df[col].dropna() if str(v)})
            if vals:
                parts.append(f"{word} {', '.join(vals)}")
    if "users" in df and df["users"].notna().any():
        parts.append(f"{int(pd.to_numeric(df['users'], errors='coerce').max())} users")
    per_config = labels.value_counts()
    reps = pd.to_numeric(df["repeats"], errors="coerce").fillna(1) if "repeats" in df else None
    total = reps.groupby(labels).sum() if reps is not None else per_config
    lo, hi = int(total.min()), int(total.max())
    parts.append(f"{lo} measurement(s) each" if lo == hi else f"{lo}-{hi} measurements each")
    return "; ".join(parts)


def build_headline(
    df: pd.DataFrame,
    axes: Sequence[Axis],
    budget_axes: tuple[Axis, Axis] | None = None,
    budgets: Sequence[float] = (),
) -> Headline:
    """The headline of a page: a verdict per axis, optionally the best pick per latency budget."""
    verdicts = [v for v in (verdict(df, a) for a in axes) if v is not None]
    picks = budget_picks(df, *budget_axes, budgets) if budget_axes and budgets else []
    timing = next((a for a in axes if a.kind == "timing"), None)
    noisy = noisy_configs(df, timing) if timing else []
    labels = (budget_axes[0].label, budget_axes[1].label) if budget_axes else ("", "")
    return Headline(compared_sentence(df), verdicts, picks, noisy, labels)


# --------------------------------------------------------------------------------------- sentences


def fmt(value: float, unit: str = "") -> str:
    if not math.isfinite(value):
        return "∞"
    a = abs(value)
    text = (
        f"{value:.0f}"
        if a >= 100
        else f"{value:.1f}"
        if a >= 10
        else f"{value:.2f}"
        if a >= 1
        else f"{value:.4f}"
    )
    if unit == "x":
        return f"{value:.2f}x"
    return f"{text} {unit}".strip()


def describe(est: Estimate, axis: Axis) -> str:
    if axis.kind == "rate":
        return f"{fmt(est.value)} ± {fmt(est.half_width)}"
    if est.n < 2:
        return f"{fmt(est.value, axis.unit)} (1 measurement)"
    return f"{fmt(est.value, axis.unit)} [{fmt(est.lo)}–{fmt(est.hi)}]"


def verdict_sentence(v: Verdict) -> str:
    """One plain sentence per axis (also what the browser test reads)."""
    a = v.axis
    best, best_est = v.ranked[0]
    if v.flat:
        return f"{a.label}: {fmt(best_est.value, a.unit)} for every configuration (no difference)."
    if len(v.ranked) == 1:
        return f"{a.label}: only {best} has it: {describe(best_est, a)}."
    runner, runner_est = v.ranked[1]
    word = "higher" if a.higher_is_better else "lower"
    if v.significant and v.margin is not None:
        if a.kind == "rate":
            by = f"by {fmt(v.margin.value)} (95% interval {fmt(v.margin.lo)} to {fmt(v.margin.hi)})"
        else:
            by = f"{fmt(v.margin.value, 'x')} (range {fmt(v.margin.lo, 'x')}–{fmt(v.margin.hi, 'x')})"
            by = f"by {by}" if a.higher_is_better else f"{by} faster"
        return (
            f"{a.label} ({word} is better): winner {best} at {describe(best_est, a)}, "
            f"beats runner-up {runner} ({describe(runner_est, a)}) {by}."
        )
    why = f" ({v.reason})" if v.reason else ""
    others = [c for c in v.within_noise if c != best]
    # every one named: a list cut with "..." hid the choice
    tied = f"{best} and {len(others)} other(s) ({', '.join(others)})"
    return (
        f"{a.label} ({word} is better): no significant difference between {tied}{why}; "
        f"best median {describe(best_est, a)}."
    )


def budget_rows(h: Headline, latency_unit: str = "ms") -> list[list[str]]:
    rows = []
    for i, p in enumerate(h.budgets):
        if i and p.config is not None and p.config == h.budgets[i - 1].config:
            continue  # a larger budget that buys nothing better: the row above says it
        if p.config is None or p.quality is None or p.cost is None:
            rows.append([f"≤ {format_value(p.budget)} {latency_unit}", "nothing fits", "–", "–"])
            continue
        if p.cost.value <= FLAT_TOL:
            cost = "none (best overall)"
        elif p.cost_significant:
            cost = f"−{fmt(p.cost.value)} (significant)"
        else:
            cost = f"−{fmt(p.cost.value)} (within noise)"
        rows.append([f"≤ {format_value(p.budget)} {latency_unit}", p.config, fmt(p.quality.value), cost])
    return rows


def render_headline(h: Headline) -> str:
    """The headline as HTML (the page writer puts it under the title)."""
    esc = html.escape
    items = "".join(f"<li>{esc(verdict_sentence(v))}</li>" for v in h.verdicts)
    out = [
        f'<p class="compared"><b>Compared:</b> {esc(h.compared)}.</p>',
        f'<ul class="verdicts">{items}</ul>',
    ]
    if h.budgets:
        q, lat = h.budget_axes
        head = "".join(
            f"<th>{esc(t)}</th>"
            for t in (f"{lat} budget", "best configuration", q, f"{q} cost vs the best overall")
        )
        body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in budget_rows(h))
        out.append(
            f"<p><b>Best decoder per latency budget</b> (median {esc(lat)}; quality cost with its "
            f'significance):</p><table class="budget-headline"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>"
        )
    if h.notes:
        out.append(f'<p class="notes"><b>Not ranked:</b> {esc("; ".join(h.notes))}.</p>')
    if h.noisy:
        out.append(
            f'<p class="noisy"><b>Noisy timings</b> (spread over repeats above {NOISY_SPREAD:.0%} of the '
            f"median): {esc(', '.join(h.noisy))}. Re-run before trusting their latency.</p>"
        )
    return '<div class="headline">' + "".join(out) + "</div>"
