"""The deployment decision: per latency budget, which configuration to deploy.

The rule, in one place (the report's first screen, its budget table, the sweep's `best:` line and the
MLflow parent run all read the same `Decision`):

* Budgets are the configurations' own Pareto front (median latency vs median quality): one budget per
  point on it, at that point's latency.
* Within a budget, the best is the configuration of highest quality that fits; every configuration
  that fits and whose quality is NOT significantly below the best's ties with it; the one to deploy is
  the cheapest (lowest latency) of those, marked as a tie when it is not the best itself.
* Quality differences are PAIRED where per-user outcomes are stored (genrec.workloads.per_user): a
  paired bootstrap over users of the mean per-user difference (2000 resamples, 95% percentile
  interval; significant when the interval excludes 0). Rows without per-user outcomes fall back to the
  unpaired normal-approximation interval of headline.py, and the sentence says "(unpaired)".
* Speed-up against the reference (beam at its default width; without one, the best configuration):
  reference latency / deployed latency, with the widest of the interval over repeats (headline.py's
  timing margin) and a paired bootstrap over decode batches of the ratio of median batch latencies.
"""

from __future__ import annotations

import functools
import html
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from genrec.dashboards.analysis import format_value, pareto_front
from genrec.dashboards.headline import (
    NOISY_SPREAD,
    Axis,
    Estimate,
    config_estimates,
    config_label_series,
    distinguishable,
    fmt,
    margin,
    noisy_configs,
)

RESAMPLES = 2000
POPULATION = ("dataset", "split")  # rows pair on user ids only within one dataset and split
PAIRED_TEST = "paired bootstrap over users (2000 resamples, 95% percentile interval)"


@dataclass(frozen=True)
class Difference:
    """quality(a) - quality(b) with its 95% interval; paired: from per-user outcomes."""

    value: float
    lo: float
    hi: float
    paired: bool

    @property
    def significant(self) -> bool:
        return self.lo > 0 or self.hi < 0


@dataclass(frozen=True)
class Choice:
    """One row of the decision: the budget a Pareto point sets and what to deploy within it."""

    budget: float
    point: str  # the Pareto configuration whose latency is the budget
    best: str  # highest quality within the budget
    deploy: str  # cheapest configuration not significantly below `best`
    quality: float
    latency: Estimate
    vs_best: Difference | None  # deploy - best (None when deploy is best)
    vs_reference: Difference | None  # deploy - reference (None when deploy is the reference)
    speedup: Estimate | None  # reference latency / deploy latency

    @property
    def tie(self) -> bool:
        return self.deploy != self.best


@dataclass(frozen=True)
class Decision:
    quality: Axis
    latency: Axis
    reference: str | None
    choices: list[Choice]  # by budget, smallest first
    paired: bool  # every quality comparison was paired
    noisy: list[str] = field(default_factory=list)
    timing_note: str = ""  # spread over repeats and machine load

    @property
    def best(self) -> Choice | None:
        """The decision without a budget (the largest one): what `best` means everywhere."""
        return self.choices[-1] if self.choices else None


# ------------------------------------------------------------------------------- per-user values


def user_values(df: pd.DataFrame, labels: pd.Series, metric: str, results_dir: Path | None) -> dict:
    """{configuration label: per-user metric (Series by user id, mean over its rows/seeds)} and
    {label: per-batch latency array} for the configurations whose every row has per-user outcomes."""
    from genrec.workloads.per_user import metric_from_ranks, read_per_user

    quality, batches = {}, {}
    if results_dir is None or "run_id" not in df or "experiment" not in df:
        return quality, batches
    if any(c in df and df[c].nunique(dropna=False) > 1 for c in POPULATION):
        return quality, batches  # user ids of two datasets or splits are not the same users: unpaired
    for label, rows in df.groupby(labels, sort=False):
        frames = [read_per_user(results_dir, str(r.experiment), str(r.run_id)) for r in rows.itertuples()]
        if any(f is None or f.empty for f in frames):
            continue
        per_row = [
            pd.Series(metric_from_ranks(f["target_ranks"], metric), index=f["user_id"]) for f in frames
        ]
        quality[str(label)] = pd.concat(per_row, axis=1).mean(axis=1)
        first = frames[0].drop_duplicates("batch").sort_values("batch")
        batches[str(label)] = first["batch_latency_ms"].to_numpy(dtype=float)
    return quality, batches


@functools.lru_cache(maxsize=8)
def _resample_index(n: int, seed: int = 0) -> np.ndarray:
    """The same resamples for every comparison on n users (cached: a page compares many pairs)."""
    idx = np.random.default_rng(seed).integers(0, n, size=(RESAMPLES, n))
    idx.setflags(write=False)
    return idx


def paired_difference(a: pd.Series, b: pd.Series) -> Difference | None:
    """mean(a - b) over the users both have, with its paired-bootstrap 95% interval."""
    common = a.index.intersection(b.index)
    if len(common) < 2:
        return None
    d = a.loc[common].to_numpy(dtype=float) - b.loc[common].to_numpy(dtype=float)
    boot = d[_resample_index(len(d))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return Difference(float(d.mean()), float(lo), float(hi), True)


def unpaired_difference(a: Estimate, b: Estimate) -> Difference:
    h = math.hypot(a.half_width, b.half_width)
    d = a.value - b.value
    return Difference(d, d - h, d + h, False)


def batch_speedup(ref: np.ndarray, dep: np.ndarray) -> tuple[float, float] | None:
    """95% paired-bootstrap interval over decode batches of median(ref) / median(dep)."""
    if len(ref) != len(dep) or len(ref) < 2 or not (np.all(ref > 0) and np.all(dep > 0)):
        return None
    idx = _resample_index(len(ref), seed=1)
    ratios = np.median(ref[idx], axis=1) / np.median(dep[idx], axis=1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


# ------------------------------------------------------------------------------------ the decision


@dataclass(frozen=True)
class Inputs:
    """Medians and per-user data of the compared configurations (labels as config_label_series)."""

    q: dict[str, Estimate]
    lat: dict[str, Estimate]
    users: dict[str, pd.Series]
    batches: dict[str, np.ndarray]
    quality: Axis
    cache: dict = field(default_factory=dict)  # (a, b) -> Difference: each pair is resampled once

    def difference(self, a: str, b: str) -> Difference:
        if (a, b) not in self.cache:
            found = None
            if a in self.users and b in self.users:
                found = paired_difference(self.users[a], self.users[b])
            self.cache[(a, b)] = found if found is not None else unpaired_difference(self.q[a], self.q[b])
        return self.cache[(a, b)]

    def below(self, a: str, best: str) -> bool:
        """Whether a's quality is significantly below best's."""
        if a == best:
            return False
        if a in self.users and best in self.users:
            d = self.difference(a, best)
            if d.paired:
                return d.significant and d.value < 0
        return distinguishable(self.quality, self.q[best], self.q[a])


def default_beam_width() -> int:
    from dataclasses import fields

    from genrec.workloads.decoding.base import get_decoder

    try:
        return int(next(f.default for f in fields(get_decoder("beam").Params) if f.name == "beam_width"))
    except Exception:  # noqa: BLE001 - a registry without beam: the usual production width
        return 10


def reference_name(label: str | None) -> str | None:
    """How sentences name the reference: its label, with the width when the label leaves it out."""
    if label is None or "beam_width" in label:
        return label
    return f"{label}-{default_beam_width()}"


def reference_label(df: pd.DataFrame, labels: pd.Series, among: list[str]) -> str | None:
    """Beam search at its default width (the usual production baseline), if it was run."""
    width = default_beam_width()
    if "param_beam_width" not in df:
        return None
    beam = df[(df["decoder"].astype(str) == "beam") & (pd.to_numeric(df["param_beam_width"]) == width)]
    found = [str(x) for x in labels[beam.index].unique() if str(x) in among]
    return sorted(found, key=len)[0] if found else None


def speedup(inputs: Inputs, ref: str, dep: str, latency: Axis) -> Estimate:
    est = margin(latency, inputs.lat[dep], inputs.lat[ref])  # how many times faster dep is than ref
    lo, hi = (est.lo, est.hi) if min(inputs.lat[dep].n, inputs.lat[ref].n) >= 2 else (math.inf, -math.inf)
    if ref in inputs.batches and dep in inputs.batches:
        found = batch_speedup(inputs.batches[ref], inputs.batches[dep])
        if found is not None:
            lo, hi = min(lo, found[0]), max(hi, found[1])
    if not math.isfinite(lo):
        lo, hi = est.value, est.value
    return Estimate(est.value, min(lo, est.value), max(hi, est.value), est.n)


def choose(inputs: Inputs, budget: float, point: str) -> tuple[str, str]:
    """(best, deploy) within `budget`: deploy is the cheapest not significantly below best."""
    fits = [c for c in inputs.q if inputs.lat[c].value <= budget]
    best = max(fits, key=lambda c: (inputs.q[c].value, -inputs.lat[c].value, c == point))
    ties = [c for c in fits if not inputs.below(c, best)]
    deploy = min(ties, key=lambda c: (inputs.lat[c].value, -inputs.q[c].value, c))
    return best, deploy


def budget_points(inputs: Inputs, budgets: tuple[float, ...] | None) -> list[tuple[str, float]]:
    """(configuration, budget): the Pareto front's points at their own latency, or, for budgets given
    by the user, the best configuration that fits each (a budget nothing fits is left out)."""
    both = sorted(inputs.q)
    points = pd.DataFrame(
        {"c": both, "lat": [inputs.lat[c].value for c in both], "q": [inputs.q[c].value for c in both]}
    )
    if not budgets:
        front = pareto_front(points, "lat", "q").sort_values("lat", kind="stable")
        return list(zip(front["c"], front["lat"].astype(float)))
    out = []
    for b in sorted(budgets):
        fits = points[points["lat"] <= b]
        if not fits.empty:
            out.append((str(fits.sort_values(["q", "lat"], ascending=[False, True])["c"].iloc[0]), float(b)))
    return out


def decide(
    df: pd.DataFrame,
    quality: Axis,
    latency: Axis,
    results_dir: Path | None = None,
    budgets: tuple[float, ...] | None = None,
) -> Decision | None:
    """The decision over the compared rows `df` (baselines and other tasks already left out)."""
    labels = config_label_series(df)
    q, lat = dict(config_estimates(df, quality)), dict(config_estimates(df, latency))
    both = sorted(c for c in q if c in lat)
    if not both:
        return None
    users, batches = user_values(df, labels, quality.column, results_dir)
    inputs = Inputs({c: q[c] for c in both}, {c: lat[c] for c in both}, users, batches, quality)
    ref = reference_label(df, labels, both)
    choices = []
    for point, budget in budget_points(inputs, budgets):
        best, deploy = choose(inputs, budget, point)
        choices.append(
            Choice(
                float(budget),
                point,
                best,
                deploy,
                q[deploy].value,
                lat[deploy],
                inputs.difference(deploy, best) if deploy != best else None,
                inputs.difference(deploy, ref) if ref and deploy != ref else None,
                speedup(inputs, ref, deploy, latency) if ref and deploy != ref else None,
            )
        )
    paired = len(users) == len(both)
    return Decision(quality, latency, ref, choices, paired, noisy_configs(df, latency), timing_note(df))


def timing_note(df: pd.DataFrame) -> str:
    """'latency spread over repeats 3-41% of the median; machine load (1 min) 0.8-3.9 at 16 threads'."""
    parts = []
    lo, hi = "latency_p50_lo_ms", "latency_p50_hi_ms"
    if lo in df and pd.to_numeric(df[lo], errors="coerce").notna().any():
        spread = (pd.to_numeric(df[hi]) - pd.to_numeric(df[lo])) / pd.to_numeric(df["latency_p50_ms"])
        spread = spread.dropna()
        parts.append(f"latency spread over repeats {spread.min():.0%}–{spread.max():.0%} of the median")
    else:
        parts.append("each configuration timed in one pass (no spread over repeats)")
    if "load_1m" in df and pd.to_numeric(df["load_1m"], errors="coerce").notna().any():
        load = pd.to_numeric(df["load_1m"], errors="coerce").dropna()
        threads = sorted({format_value(t) for t in df["threads"].dropna()}) if "threads" in df else []
        at = f" at {'/'.join(threads)} torch thread(s)" if threads else ""
        parts.append(f"machine load (1 min) {load.min():.1f}–{load.max():.1f}{at}")
    return "; ".join(parts)


# ------------------------------------------------------------------------------------- sentences


def interval(d: Difference) -> str:
    return f"{d.value:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}]"


def quality_phrase(d: Difference, metric: str) -> str:
    how = "paired" if d.paired else "unpaired"
    verdict = "significant" if d.significant else "not significant"
    return f"{metric} {interval(d)} ({how}), {verdict}"


def choice_sentence(dec: Decision, c: Choice) -> str:
    """'Within 140 ms: deploy nezha: 1.40x faster than beam(beam_width=10) [1.22–1.72x], recall@10
    -0.0075 [-0.0120, -0.0031] (paired), significant.'"""
    unit = dec.latency.unit or ""
    head = f"Within {fmt(c.budget, unit)}: deploy {c.deploy}"
    parts = []
    if c.speedup is not None and dec.reference:
        s = c.speedup
        word = "faster" if s.value >= 1 else "slower"
        factor = s.value if s.value >= 1 else 1 / s.value
        span = f"[{s.lo:.2f}–{s.hi:.2f}x]" if s.hi > s.lo else "(measured once: no interval)"
        if s.lo <= 1.0 <= s.hi and s.hi > s.lo:  # the interval holds 1: the two may swap on a re-run
            span += " (speed difference not significant)"
        parts.append(f"{factor:.2f}x {word} than {reference_name(dec.reference)} {span}")
    if c.vs_reference is not None:
        parts.append(quality_phrase(c.vs_reference, dec.quality.label))
    elif c.deploy == dec.reference:
        parts.append(f"the reference, {dec.quality.label} {c.quality:.4f}")
    else:
        parts.append(f"{dec.quality.label} {c.quality:.4f}")
    text = f"{head}: " + ", ".join(parts)
    if c.tie and c.vs_best is not None:
        text += f"; ties with the best within budget, {c.best} ({quality_phrase(c.vs_best, 'diff')})"
    return text + "."


def noisy_sentence(dec: Decision) -> str:
    if not dec.noisy:
        return f"Timings: {dec.timing_note}." if dec.timing_note else ""
    return (
        f"Noisy timings: {', '.join(dec.noisy)} varied by more than {NOISY_SPREAD:.0%} between repeats, so "
        f"two runs can disagree on speed ({dec.timing_note}); re-run with more repeats on an idle machine."
    )


# ------------------------------------------------------------------------------------------- HTML


def decision_rows(dec: Decision) -> list[list[str]]:
    """The budget table (the same rows under the headline's sentences and in the body)."""
    unit = dec.latency.unit or ""
    rows = []
    for c in dec.choices:
        span = f"[{fmt(c.latency.lo)}–{fmt(c.latency.hi)}]" if c.latency.hi > c.latency.lo else ""
        speed = f"{c.speedup.value:.2f}x [{c.speedup.lo:.2f}–{c.speedup.hi:.2f}]" if c.speedup else "–"
        rows.append(
            [
                f"≤ {fmt(c.budget, unit)} ({c.point})",
                c.deploy + (" (tie)" if c.tie else ""),
                f"{c.quality:.4f}",
                f"{fmt(c.latency.value, unit)} {span}".strip(),
                speed,
                quality_phrase(c.vs_reference, "").strip() if c.vs_reference else "–",
                f"{c.best}: {quality_phrase(c.vs_best, '').strip()}" if c.vs_best else "best",
            ]
        )
    return rows


def decision_table(dec: Decision) -> str:
    q, lat, ref = dec.quality.label, dec.latency.label, reference_name(dec.reference) or "none"
    heads = [
        f"{lat} budget (Pareto point)",
        "deploy",
        q,
        lat,
        f"speed-up vs {ref}",
        f"{q} vs {ref}",
        f"{q} vs best within budget",
    ]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in heads)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in decision_rows(dec)
    )
    return f'<table class="decision-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def render_decision(dec: Decision) -> str:
    """The first screen: one sentence per budget, how quality was compared, and the timing caveat."""
    esc = html.escape
    items = "".join(f"<li>{esc(choice_sentence(dec, c))}</li>" for c in reversed(dec.choices))
    how = (
        PAIRED_TEST if dec.paired else "unpaired normal-approximation intervals (no per-user outcomes stored)"
    )
    rule = (
        f"Deploy = the cheapest configuration whose {dec.quality.label} is not significantly below the best "
        f"within the budget; budgets are the Pareto front's points; quality compared by {how}; "
        f"speed-up interval: the widest of the range over repeats and a paired bootstrap over batches."
    )
    noisy = noisy_sentence(dec)
    cls = "noisy" if dec.noisy else "timing"
    return (
        f'<div class="decision"><ul class="decision-sentences">{items}</ul>'
        f'<p class="rule">{esc(rule)}</p>'
        + (f'<p class="{cls}">{esc(noisy)}</p>' if noisy else "")
        + decision_table(dec)
        + "</div>"
    )
