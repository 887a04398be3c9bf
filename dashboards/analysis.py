"""Pure table functions behind the reports: configuration keys, aggregation over seeds, the Pareto
front and the best configuration per latency budget.

Everything here works on the flat result-row columns (`ResultRow.to_flat()`) and knows no decoder by
name: a decoder's configuration is its name plus every non-null `param_*` column (except a seed), so
rows of decoders added later aggregate and plot without new code. Only pandas and numpy.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

PARAM_PREFIX = "param_"
SEED_PARAMS = frozenset({"param_seed"})
# Columns that are not decoder parameters but still separate configurations when they vary in the
# rows of one report (two datasets, two devices, ...): rows are only averaged inside one setting.
CONTEXT_COLUMNS = (
    "experiment",
    "dataset",
    "model",
    "draft",
    "split",
    "device",
    "threads",
    "batch_size",
    "users",
)
BASELINES = ("popular",)  # sanity floors: shown and annotated, never ranked nor setting an axis range
QUALITY_RE = re.compile(r"^(?P<family>[A-Za-z_]+)@(?P<k>\d+)$")
QUALITY_FAMILY_ORDER = ("hr", "ndcg", "recall")
_METRIC_PREFIXES = ("latency_", "time_", "count_")
_METRIC_NAMES = ("invalid_rate", "missing_rate", "throughput_users_per_s", "memory_peak_mb")


def is_missing(value: object) -> bool:
    if value is None or value is pd.NA:
        return True
    return isinstance(value, float | np.floating) and math.isnan(value)


def format_value(value: object) -> str:
    """A parameter value as people write it: 10 rather than 10.0 (Parquet widens ints next to NaN)."""
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return str(int(value)) if float(value).is_integer() else f"{float(value):g}"
    return str(value)


def param_columns(df: pd.DataFrame) -> list[str]:
    """The decoder-parameter columns of a result table (a seed parameter excluded), sorted."""
    return sorted(c for c in df.columns if c.startswith(PARAM_PREFIX) and c not in SEED_PARAMS)


def varying_param_columns(df: pd.DataFrame) -> list[str]:
    """The parameter columns that take more than one value (a missing value counts as one) in `df`:
    what sets its rows apart; the others are one default repeated on every row."""
    text = lambda v: "" if is_missing(v) else format_value(v)  # noqa: E731
    return [c for c in param_columns(df) if df[c].map(text).nunique() > 1]


def config_params(row: Mapping[str, object], columns: Iterable[str]) -> dict[str, object]:
    """{name: value} of the non-null parameter columns of one row (names without the prefix)."""
    return {c[len(PARAM_PREFIX) :]: row[c] for c in columns if not is_missing(row.get(c))}


def config_label(decoder: str, params: Mapping[str, object]) -> str:
    """'beam(beam_width=10, k=10)'; a decoder without parameters is just its name."""
    if not params:
        return str(decoder)
    inner = ", ".join(f"{k}={format_value(v)}" for k, v in sorted(params.items()))
    return f"{decoder}({inner})"


def config_key(df: pd.DataFrame) -> pd.Series:
    """One configuration key per row: decoder + every non-null parameter except a seed."""
    cols = param_columns(df)
    records = df[["decoder", *cols]].to_dict("records")
    return pd.Series(
        [config_label(r["decoder"], config_params(r, cols)) for r in records],
        index=df.index,
        name="config",
        dtype=object,
    )


def varying_context(df: pd.DataFrame) -> list[str]:
    """Context columns (dataset, model, device, ...) that take more than one value in `df`."""
    return [c for c in CONTEXT_COLUMNS if c in df.columns and df[c].nunique(dropna=False) > 1]


def quality_columns(df: pd.DataFrame) -> list[str]:
    """Ranking-quality columns like hr@5, ndcg@10: hr, ndcg, recall first, then others; by K."""

    def order(c: str) -> tuple[int, str, int]:
        m = QUALITY_RE.match(c)
        assert m is not None
        fam = m["family"].lower()
        rank = QUALITY_FAMILY_ORDER.index(fam) if fam in QUALITY_FAMILY_ORDER else len(QUALITY_FAMILY_ORDER)
        return rank, fam, int(m["k"])

    cols = [c for c in df.columns if QUALITY_RE.match(c) and pd.api.types.is_numeric_dtype(df[c])]
    return sorted(cols, key=order)


def metric_columns(df: pd.DataFrame) -> list[str]:
    """Numeric measurement columns that are averaged over seeds (quality, latency, timings, counters)."""
    out = []
    for c in df.columns:
        if not pd.api.types.is_numeric_dtype(df[c]) or pd.api.types.is_bool_dtype(df[c]):
            continue
        if QUALITY_RE.match(c) or c.startswith(_METRIC_PREFIXES) or c in _METRIC_NAMES:
            out.append(c)
    return out


def _sort_token(value: object) -> tuple[int, float, str]:
    if is_missing(value):
        return (0, 0.0, "")
    if isinstance(value, bool | np.bool_):
        return (1, float(value), "")
    if isinstance(value, int | float | np.integer | np.floating):
        return (1, float(value), "")
    return (2, 0.0, str(value))


def one_row_per_seed(g: pd.DataFrame, seeds_col: str) -> pd.DataFrame:
    """The last row of each seed: two rows of one seed (a sweep that ran twice into the same results)
    are one measurement, not two, and must not count as a second seed or make an error bar."""
    seeded = g[seeds_col].notna()
    one_each = g[seeded].drop_duplicates(seeds_col, keep="last")
    return one_each if seeded.all() else pd.concat([one_each, g[~seeded]])


def aggregate_over_seeds(df: pd.DataFrame, context: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per (configuration, setting): mean, sample std (ddof=1) and count over seeds.

    `context` names the non-parameter columns that separate settings; by default the context
    columns that vary in `df` (so one experiment on one dataset and device needs none). Output
    columns: config, setting, label, decoder, the parameter columns, the context columns, n (distinct seeds),
    seeds ('0,1,2'), and for every metric column M: M (mean) and M_std (NaN for a single row).
    """
    if df.empty:
        raise ValueError("aggregate_over_seeds: no rows")
    ctx = varying_context(df) if context is None else [c for c in context if c in df.columns]
    params = param_columns(df)
    metrics = metric_columns(df)
    work = df.copy()
    work["config"] = config_key(df)
    if ctx:
        records = work[ctx].to_dict("records")
        work["setting"] = [", ".join(f"{c}={format_value(r[c])}" for c in ctx) for r in records]
    else:
        work["setting"] = ""
    seeds_col = "seed" if "seed" in work.columns else None
    rows = []
    for (config, setting), g in work.groupby(["config", "setting"], sort=False, dropna=False):
        if seeds_col:
            g = one_row_per_seed(g, seeds_col)
        first = g.iloc[0]
        row: dict[str, object] = {
            "config": config,
            "setting": setting,
            "label": f"{config} [{setting}]" if setting else config,
            "decoder": first["decoder"],
        }
        row.update({c: first[c] for c in params})
        row.update({c: first[c] for c in ctx})
        row["n"] = len(g)  # distinct seeds (rows without a seed count one each)
        row["seeds"] = (
            ",".join(format_value(s) for s in sorted(g[seeds_col].dropna().unique())) if seeds_col else ""
        )
        for m in metrics:
            values = g[m].astype(float)
            row[m] = values.mean()
            row[f"{m}_std"] = values.std(ddof=1)
        rows.append(row)
    agg = pd.DataFrame(rows)
    order = sorted(
        range(len(agg)),
        key=lambda i: (
            str(agg.at[i, "decoder"]),
            tuple(_sort_token(agg.at[i, c]) for c in params),
            str(agg.at[i, "setting"]),
        ),
    )
    return agg.iloc[order].reset_index(drop=True)


def pareto_front(
    df: pd.DataFrame, x: str, y: str, minimize_x: bool = True, maximize_y: bool = True
) -> pd.DataFrame:
    """Rows of `df` not dominated by any other row, ordered from the best x to the worst.

    Row a dominates row b when a is at least as good in both x and y and strictly better in one.
    Rows with NaN in x or y are left out; identical points are all kept. O(n log n).
    """
    data = df[[x, y]].astype(float)
    keep = data.notna().all(axis=1).to_numpy()
    xs = data[x].to_numpy()[keep] * (1.0 if minimize_x else -1.0)
    ys = data[y].to_numpy()[keep] * (1.0 if maximize_y else -1.0)
    positions = np.flatnonzero(keep)
    order = np.lexsort((-ys, xs))  # by x (best first), then y (best first)
    front: list[int] = []
    best_before = -math.inf  # best y among all points with a strictly better x
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and xs[order[j]] == xs[order[i]]:
            j += 1
        top = ys[order[i]]  # the group's best y (sorted first)
        if top > best_before:
            front += [positions[order[t]] for t in range(i, j) if ys[order[t]] == top]
            best_before = top
        i = j
    return df.iloc[front]


def best_per_budget(
    df: pd.DataFrame, latency_col: str, quality_col: str, budgets: Iterable[float]
) -> pd.DataFrame:
    """For each latency budget, the row with the best quality whose latency <= budget.

    Ties in quality go to the lower latency, then to the earlier row. One output row per budget
    (column `budget_ms` first, then `df`'s columns); a budget nothing fits gets NaN/None columns.
    """
    lat = df[latency_col].astype(float)
    qual = df[quality_col].astype(float)
    records: list[dict[str, object]] = []
    for budget in budgets:
        ok = (lat <= float(budget)) & qual.notna()
        if not ok.any():
            records.append({"budget_ms": float(budget)})
            continue
        cand = pd.DataFrame({"q": qual[ok], "lat": lat[ok], "pos": np.flatnonzero(ok.to_numpy())})
        best = cand.sort_values(["q", "lat", "pos"], ascending=[False, True, True], kind="stable")
        records.append({"budget_ms": float(budget), **df.iloc[int(best["pos"].iloc[0])].to_dict()})
    return pd.DataFrame(records, columns=["budget_ms", *df.columns])


def round_up_significant(value: float, digits: int = 2) -> float:
    """12.34 -> 13, 0.01234 -> 0.013: budgets that read well and still admit the value itself."""
    if not math.isfinite(value) or value <= 0:
        return value
    exponent = math.floor(math.log10(value)) - (digits - 1)
    step = 10.0**exponent
    rounded = math.ceil(value / step - 1e-9) * step
    return round(rounded, max(0, -exponent))


def default_budgets(
    latencies: Iterable[float], quantiles: Sequence[float] = (0.1, 0.25, 0.5, 0.75, 1.0)
) -> list[float]:
    """Budgets at quantiles of the observed latencies, rounded up to two significant digits."""
    values = pd.Series(list(latencies), dtype=float).dropna()
    if values.empty:
        return []
    return sorted({round_up_significant(float(values.quantile(q))) for q in quantiles})


def constant_value(values: Iterable[object]) -> float | None:
    """The one value of a metric that is the same for every configuration (two or more finite values,
    equal to 1e-9 relative), else None: such a panel says one sentence instead of drawing a flat
    line."""
    v = pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce").astype(float).dropna()
    if len(v) < 2:
        return None
    lo, hi = float(v.min()), float(v.max())
    return lo if math.isclose(lo, hi, rel_tol=1e-9, abs_tol=1e-12) else None
