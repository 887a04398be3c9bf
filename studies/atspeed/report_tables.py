"""The AtSpeed page's tables (studies/atspeed/report.py): Table 1 (WS@K and AS@K per verification and
objective), acceptance per drafted level, the ablations (records from atspeed_ablations.py), Table 2
(relaxed AtSpeed-R against the target's sampling beam search) and strict verification's identical share.
Cells are mean ± std over seeds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from genrec.dashboards.page import fmt_mean_std, html_table
from genrec.studies.atspeed.atspeed_arms import VERIFICATIONS
from genrec.studies.atspeed.report_rows import (
    ABLATIONS,
    LABELS,
    at_setting,
    by_seed,
    cell,
    label,
    level_columns,
    ordered,
    ordered_groups,
)
from genrec.workloads.metrics import paired_t_test_less

# --------------------------------------------------------------------------------------- (a) Table 1


def table1(main: pd.DataFrame) -> tuple[list[str], list[list[object]]]:
    """Headers and rows of Table 1: per verification, one row per objective, WS@K then AS@K for every K.
    The best mean of a column within a verification is marked with *."""
    ks = sorted(main["k"].unique())
    headers = ["verification", "objective", "seeds", *(f"WS@{k}" for k in ks), *(f"AS@{k}" for k in ks)]
    rows: list[list[object]] = []
    for verification in ordered(main["verification"], VERIFICATIONS):
        part = main[main["verification"] == verification]
        objectives = [o for o in ordered(part["objective"], list(LABELS)) if o not in ABLATIONS]
        part = part[part["objective"].isin(objectives)]
        means = {m: part.groupby(["k", "objective"])[m].mean() for m in ("ws", "accepted_steps")}
        for objective in objectives:
            rows_o = part[part["objective"] == objective]
            seeds = ", ".join(str(s) for s in sorted(rows_o["seed"].unique()))
            cells: list[object] = [verification, label(objective), seeds]
            for m in ("ws", "accepted_steps"):
                for k in ks:
                    text = cell(rows_o.loc[rows_o["k"] == k, m], 2)
                    column = means[m].get(k)
                    if column is not None and len(objectives) > 1 and column.get(objective) == column.max():
                        text += " *"
                    cells.append(text)
            rows.append(cells)
    return headers, rows


# -------------------------------------------------------------------------- (b) acceptance per level


def acceptance_table(main: pd.DataFrame) -> str:
    levels = level_columns(main)
    rows = []
    for (verification, objective, k), part in ordered_groups(main, ("verification", "objective", "k")):
        rows.append(
            [
                verification,
                label(objective),
                k,
                *(cell(part[c], 3) for c in levels),
                cell(part["accepted_steps"], 2),
            ]
        )
    headers = ["verification", "objective", "K", *(f"level {c.rsplit('_', 1)[1]}" for c in levels), "AS@K"]
    return html_table(headers, rows)


# ------------------------------------------------------------------------------------- (d) ablations


def ablation_table(records: list[dict]) -> str:
    rows = []
    for r in records:
        cells: list[object] = [r["verification"], label(r["full"]), r["variant"], r["k"], r["ws"]["seeds"]]
        for metric in ("ws", "as"):
            res = r[metric]
            p = "–" if np.isnan(res["p"]) else f"{res['p']:.3f}"
            cells += [
                fmt_mean_std(*res["full"], 2),
                fmt_mean_std(*res["variant"], 2),
                fmt_mean_std(*res["diff"], 2),
                p,
            ]
        rows.append(cells)
    return html_table(ABLATION_HEADERS, rows)


ABLATION_HEADERS = [
    "verification",
    "full objective",
    "variant",
    "K",
    "paired seeds",
    "WS@K full",
    "WS@K variant",
    "ΔWS (variant - full)",
    "p (H1: variant WS below)",
    "AS@K full",
    "AS@K variant",
    "ΔAS (variant - full)",
    "p (H1: variant AS below)",
]


# --------------------------------------------------------------------------------------- (e) Table 2


def table2_rows(
    t: pd.DataFrame, setting: tuple[bool, int, int], objective: str = "atspeed_r"
) -> list[list[object]]:
    """Per metric and K: the target's beam search (temperature 0, from strict rows' reference when the
    page has them), its sampling beam search and relaxed AtSpeed-R on the same users, the paired
    difference and the one-sided paired t-test of H1 "AtSpeed-R below the target", and WS@K."""
    main = at_setting(t, setting)
    relaxed = main[(main["verification"] == "relaxed") & (main["objective"] == objective)]
    strict = t[t["verification"] == "strict"]  # beam search does not depend on the draft or the setting
    rows: list[list[object]] = []
    for family, name in (("recall", "Recall"), ("ndcg", "NDCG")):
        for k in sorted(relaxed["k"].unique()):
            part = by_seed(relaxed[relaxed["k"] == k])
            ref, at = part[f"reference_{family}"], part[f"atspeed_{family}"]
            greedy = (
                by_seed(strict[strict["k"] == k])[f"reference_{family}"]
                if len(strict)
                else pd.Series(dtype=float)
            )
            cells: list[object] = [f"{name}@{k}", len(part), cell(greedy, 4), cell(ref, 4), cell(at, 4)]
            if len(part) >= 2:
                res = paired_t_test_less(at.tolist(), ref.tolist())
                verdict = "significantly below" if res["p_value"] < 0.05 else "not significantly below"
                t_text = "-" if np.isnan(res["t"]) else f"{res['t']:.2f}"
                cells += [cell(at - ref, 4), t_text, f"{res['p_value']:.3f}", verdict]
            else:
                cells += [cell(at - ref, 4), "-", "-", "needs 2 or more seeds"]
            rows.append(cells + [cell(part["ws"], 2)])
    return rows


TABLE2_HEADERS = [
    "metric",
    "seeds",
    "target beam search (T=0)",
    "target sampling (T=1)",
    "AtSpeed-R relaxed",
    "Δ (AtSpeed-R - target sampling)",
    "t",
    "p (H1: AtSpeed-R below)",
    "verdict",
    "WS@K vs target sampling",
]


# ------------------------------------------------------------------------------- (f) strict lossless


def identical_rows(t: pd.DataFrame) -> list[list[object]]:
    """Strict rows per objective and tree attention: the smallest identical_share over seeds, N and
    gamma at each K (1.0: every batch's top-K equals beam search's)."""
    strict = t[t["verification"] == "strict"]
    ks = sorted(strict["k"].unique())
    rows = []
    for (objective, tree), part in ordered_groups(strict, ("objective", "tree_attention")):
        mins = [part.loc[part["k"] == k, "identical_share"].min() for k in ks]
        cells = ["–" if pd.isna(m) else f"{m:.4f}" for m in mins]
        rows.append([label(objective), "on" if tree else "off", len(part), *cells])
    return rows
