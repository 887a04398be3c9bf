"""Tables of the decoder page: the best configuration per latency budget, the Pareto front and every
configuration (mean ± std over seeds)."""

from __future__ import annotations

import pandas as pd

from genrec.dashboards.analysis import format_value, is_missing, param_columns, varying_param_columns
from genrec.dashboards.page import esc, fmt_mean_std, html_table, note, params_text


def fixed_params_note(agg: pd.DataFrame) -> str:
    """The parameters every configuration shares, said once (the tables show only those that vary)."""
    varying = set(varying_param_columns(agg))
    fixed = [c for c in param_columns(agg) if c not in varying and agg[c].notna().any()]
    if not fixed:
        return ""
    text = ", ".join(f"{c.removeprefix('param_')}={format_value(agg[c].dropna().iloc[0])}" for c in fixed)
    return note(f"Same on every configuration (not repeated in the tables): {esc(text)}.")


def latency_cols(agg: pd.DataFrame) -> list[str]:
    return [f"latency_{p}_ms" for p in ("p50", "p99") if f"latency_{p}_ms" in agg.columns]


def budget_table(table: pd.DataFrame, metric: str, latency_name: str, agg: pd.DataFrame) -> str:
    lat_cols = latency_cols(agg)
    headers = (
        [f"budget: {latency_name} ≤ (ms)", "decoder", "parameters", metric]
        + [f"latency {c.split('_')[1]} (ms)" for c in lat_cols]
        + ["seeds"]
    )
    rows = []
    for _, r in table.iterrows():
        if is_missing(r.get("decoder")):
            rows.append(
                [format_value(r["budget_ms"]), "no configuration within budget", "", "–"]
                + ["–"] * len(lat_cols)
                + [""]
            )
            continue
        rows.append(
            [
                format_value(r["budget_ms"]),
                r["decoder"],
                params_text(r),
                fmt_mean_std(r[metric], r[f"{metric}_std"]),
            ]
            + [fmt_mean_std(r[c], r[f"{c}_std"], 2) for c in lat_cols]
            + [int(r["n"])]
        )
    return html_table(headers, rows, "budget")


def front_table(front: pd.DataFrame, metric: str, latency_col: str, latency_name: str) -> str:
    headers = ["decoder", "parameters", metric, f"latency {latency_name} (ms)", "seeds"]
    shown = varying_param_columns(front)
    rows = [
        [
            r["decoder"],
            params_text(r, shown),
            fmt_mean_std(r[metric], r[f"{metric}_std"]),
            fmt_mean_std(r[latency_col], r[f"{latency_col}_std"], 2),
            int(r["n"]),
        ]
        for _, r in front.iterrows()
    ]
    return html_table(headers, rows, "front")


def configurations_table(agg: pd.DataFrame, qcols: list[str]) -> str:
    rates = ("invalid_rate", "missing_rate")
    extra = [c for c in (*rates, *latency_cols(agg), "throughput_users_per_s") if c in agg.columns]
    headers = ["decoder", "parameters", "seeds", *qcols, *extra]
    rows = []
    shown = varying_param_columns(agg)
    for _, r in agg.iterrows():
        cells: list[object] = [
            r["decoder"],
            params_text(r, shown),
            f"{int(r['n'])} ({r['seeds']})" if r["seeds"] else int(r["n"]),
        ]
        cells += [fmt_mean_std(r[c], r[f"{c}_std"]) for c in qcols]
        for c in extra:
            digits = 4 if c in rates else 2 if c.startswith("latency_") else 1
            cells.append(fmt_mean_std(r[c], r[f"{c}_std"], digits))
        rows.append(cells)
    return html_table(headers, rows, "configs") + fixed_params_note(agg)
