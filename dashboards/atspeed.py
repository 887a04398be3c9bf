"""Report page for issue 16 (AtSpeed): rows of the `atspeed_arm` benchmark, one per draft objective,
verification, K, draft beams N, draft length gamma, tree attention and seed.

Per dataset: (a) the paper's Table 1 layout, WS@K and AS@K per verification and objective (mean ± std
over seeds) at the main setting (tree attention on, the most common (N, gamma), 40 / 3 on ties);
(b) the acceptance rate per drafted level; (c) WS and AS against N (Figure 4) and against gamma
(appendix Figure 6) where those vary; (d) the ablations w/o DR, w/o CA, w/o top-K and w/o TA against
their full objective, with the paired difference over seeds; (e) Table 2: Recall@K and NDCG@K of
relaxed AtSpeed-R against the target's sampling beam search on the same users, with a one-sided paired
t-test over seeds of H1 "AtSpeed-R below the target"; (f) the share of strict batches whose top-K
equals beam search's (1.0: lossless). `genrec report` dispatches here when every row is an
atspeed_arm row.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from genrec.dashboards.report import (
    PALETTE,
    _FigureWriter,
    environment_section,
    fmt_mean_std,
    html_table,
    write_page,
)
from genrec.workloads.benchmarks.atspeed_arms import VERIFICATIONS, arm_point
from genrec.workloads.metrics import paired_t_test_less

LABELS = {
    "sft": "SFT",
    "wordkd": "WordKD",
    "seqkd": "SeqKD",
    "tvdkd": "TVDKD",
    "atspeed_s": "AtSpeed-S",
    "atspeed_r": "AtSpeed-R",
}
# ablated objective -> (full objective, variant name as in the paper's Figure 3)
ABLATIONS = {
    "atspeed_s-no_dr": ("atspeed_s", "w/o DR"),
    "atspeed_s-no_ca": ("atspeed_s", "w/o CA"),
    "atspeed_r-no_ca": ("atspeed_r", "w/o CA"),
    "atspeed_r-top1": ("atspeed_r", "w/o top-K"),
}
SETTING = ("objective", "verification", "k", "draft_beams", "gamma", "tree_attention")
# arm_point arguments that change what a row measures without being an axis of the page: rows that
# differ in one of them go into separate sections (like two datasets)
CONTEXT = ("target_size", "draft_size", "epochs", "alpha", "teacher_k", "users", "batch_size", "repeats")
DEFAULTS = {n: p.default for n, p in inspect.signature(arm_point).parameters.items() if n != "objective"}
MAX_LEVELS = 8  # acceptance_level_1.. columns read (SIDs have L = 3..8 levels)


def is_atspeed_frame(df: pd.DataFrame) -> bool:
    return "benchmark" in df.columns and df["benchmark"].eq("atspeed_arm").all()


def label(objective: str) -> str:
    if objective in ABLATIONS:
        full, variant = ABLATIONS[objective]
        return f"{LABELS[full]} {variant}"
    return LABELS.get(objective, objective)


def ordered(values: Sequence[str], known: Sequence[str]) -> list[str]:
    present = set(values)
    return [v for v in known if v in present] + sorted(present - set(known))


# ------------------------------------------------------------------------------------------ tidy rows


def _param(df: pd.DataFrame, name: str) -> pd.Series:
    """param_<name>, with arm_point's default where a sweep left it to the function."""
    default = DEFAULTS.get(name)
    if f"param_{name}" not in df.columns:
        return pd.Series([default] * len(df), index=df.index, dtype=object)
    return df[f"param_{name}"].astype(object).where(df[f"param_{name}"].notna(), default)


def _at_k(df: pd.DataFrame, prefix: str, ks: pd.Series) -> pd.Series:
    """Per row, the column `<prefix>@<its K>` (quality columns are named by K, one K per row)."""
    values = [df.at[i, f"{prefix}@{k}"] if f"{prefix}@{k}" in df.columns else np.nan for i, k in ks.items()]
    return pd.to_numeric(pd.Series(values, index=df.index, dtype=object), errors="coerce")


def _number(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce") if col in df.columns else pd.Series(np.nan, df.index)


def tidy(df: pd.DataFrame) -> pd.DataFrame:
    """One row per result row: the setting, seed, a dataset label and the metrics this page reads."""
    t = pd.DataFrame(index=df.index)
    t["objective"] = _param(df, "objective").astype(str)
    t["verification"] = _param(df, "verification").astype(str)
    for name in ("k", "draft_beams", "gamma"):
        t[name] = _param(df, name).astype(int)
    t["tree_attention"] = _param(df, "tree_attention").map(lambda v: str(v).lower() in ("true", "1", "1.0"))
    t["seed"] = _number(df, "seed").astype(int)
    named = df["dataset"].astype(str) if "dataset" in df.columns else pd.Series("", index=df.index)
    t["data"] = named.where(
        ~named.isin(["", "nan", "None"]), _param(df, "data").map(lambda p: Path(str(p)).name)
    )
    for name in CONTEXT:
        t[name] = _param(df, name).astype(str)
    for col in ("ws", "accepted_steps", "target_calls", "identical_share"):
        t[col] = _number(df, col)
    for j in range(1, MAX_LEVELS + 1):
        if f"acceptance_level_{j}" in df.columns:
            t[f"acceptance_level_{j}"] = _number(df, f"acceptance_level_{j}")
    for side in ("reference", "atspeed"):
        for family in ("recall", "ndcg"):
            t[f"{side}_{family}"] = _at_k(df, f"{side}_{family}", t["k"])
    return t


def sections_by_dataset(t: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(label, rows) per dataset, split further by any context argument that varies within it."""
    out: list[tuple[str, pd.DataFrame]] = []
    for name, part in t.groupby("data", sort=True):
        varying = [c for c in CONTEXT if part[c].nunique() > 1]
        if not varying:
            out.append((str(name), part))
            continue
        for values, sub in part.groupby(varying, sort=True):
            values = values if isinstance(values, tuple) else (values,)
            out.append((f"{name} ({', '.join(f'{c}={v}' for c, v in zip(varying, values))})", sub))
    return out


def main_setting(t: pd.DataFrame) -> tuple[bool, int, int]:
    """(tree attention, N, gamma) of Table 1: tree attention on when any row has it, then the (N, gamma)
    with the most rows (the sweep's fixed defaults; experiments/atspeed_n_gamma.yaml adds a few rows at
    many pairs), arm_point's defaults on ties."""
    tree = bool(t["tree_attention"].any())
    counts = t[t["tree_attention"] == tree].groupby(["draft_beams", "gamma"]).size()
    top = [pair for pair, n in counts.items() if n == counts.max()]
    default = (DEFAULTS["draft_beams"], DEFAULTS["gamma"])
    n, g = default if default in top else top[0]
    return tree, int(n), int(g)


def at_setting(t: pd.DataFrame, setting: tuple[bool, int, int]) -> pd.DataFrame:
    tree, n, g = setting
    return t[(t["tree_attention"] == tree) & (t["draft_beams"] == n) & (t["gamma"] == g)]


def mean_std(values: pd.Series) -> tuple[float, float]:
    v = values.dropna()
    if v.empty:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def cell(values: pd.Series, digits: int) -> str:
    return fmt_mean_std(*mean_std(values), digits)


def by_seed(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per seed (the latest, if a sweep was re-run into the same folder)."""
    return rows.drop_duplicates("seed", keep="last").set_index("seed").sort_index()


# ------------------------------------------------------------------------------------ (a) Table 1


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


# ------------------------------------------------------------------------ (b) acceptance per level


def level_columns(t: pd.DataFrame) -> list[str]:
    return [
        c
        for c in (f"acceptance_level_{j}" for j in range(1, MAX_LEVELS + 1))
        if c in t and t[c].notna().any()
    ]


def acceptance_table(main: pd.DataFrame) -> str:
    levels = level_columns(main)
    rows = []
    for (verification, objective, k), part in _groups(main, ("verification", "objective", "k")):
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


def _groups(rows: pd.DataFrame, keys: tuple[str, ...]) -> list[tuple[tuple, pd.DataFrame]]:
    """groupby in the page's order: verifications and objectives as the paper lists them, then K."""
    order = {
        "verification": ordered(rows["verification"], VERIFICATIONS),
        "objective": ordered(rows["objective"], [*LABELS, *ABLATIONS]),
    }
    keyed = {tuple(key if isinstance(key, tuple) else (key,)): part for key, part in rows.groupby(list(keys))}

    def rank(key: tuple) -> tuple:
        return tuple(order[name].index(v) if name in order else v for name, v in zip(keys, key))

    return [(key, keyed[key]) for key in sorted(keyed, key=rank)]


def acceptance_figure(main: pd.DataFrame, figure: _FigureWriter) -> str:
    """Acceptance rate vs drafted level at one K (10 when swept), one panel per verification."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    levels = level_columns(main)
    if not levels:
        return ""
    ks = sorted(main["k"].unique())
    k = 10 if 10 in ks else ks[-1]
    verifications = ordered(main["verification"], VERIFICATIONS)
    fig = make_subplots(
        rows=1, cols=len(verifications), subplot_titles=[f"{v}, K = {k}" for v in verifications]
    )
    objectives = ordered(main["objective"], [*LABELS, *ABLATIONS])
    shown: set[str] = set()  # one legend entry per objective, whichever panel has it first
    for col, verification in enumerate(verifications, start=1):
        part = main[(main["verification"] == verification) & (main["k"] == k)]
        for i, objective in enumerate(objectives):
            rows = part[part["objective"] == objective]
            if rows.empty:
                continue
            stats = [mean_std(rows[c]) for c in levels]
            fig.add_trace(
                go.Scatter(
                    x=list(range(1, len(levels) + 1)),
                    y=[m for m, _ in stats],
                    error_y={"type": "data", "array": [s for _, s in stats]},
                    name=label(objective),
                    legendgroup=objective,
                    showlegend=objective not in shown,
                    mode="lines+markers",
                    line={"color": PALETTE[i % len(PALETTE)]},
                ),
                row=1,
                col=col,
            )
            shown.add(objective)
        fig.update_xaxes(title_text="drafted level j", dtick=1, row=1, col=col)
        fig.update_yaxes(
            title_text="acceptance rate at level j (share, 0-1)", range=[0, 1.05], row=1, col=col
        )
    fig.update_layout(height=420)
    return figure(fig)


# ------------------------------------------------------------------------------ (c) N and gamma


def curve_figure(rows: pd.DataFrame, x: str, line: str, x_title: str, figure: _FigureWriter) -> str:
    """WS@K and AS@K against `x`, one line per (verification, objective, K, `line` value)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=["walltime speedup WS@K", "accepted steps AS@K"])
    keys = ("verification", "objective", "k", line)
    for i, (key, part) in enumerate(_groups(rows, keys)):
        if part[x].nunique() < 2:
            continue
        verification, objective, k, other = key
        name = f"{label(objective)} {verification} K={k}, {'N' if line == 'draft_beams' else 'gamma'}={other}"
        for col, metric in enumerate(("ws", "accepted_steps"), start=1):
            stats = part.groupby(x)[metric].agg(["mean", "std"]).fillna({"std": 0.0})
            fig.add_trace(
                go.Scatter(
                    x=list(stats.index),
                    y=list(stats["mean"]),
                    error_y={"type": "data", "array": list(stats["std"])},
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    mode="lines+markers",
                    line={"color": PALETTE[i % len(PALETTE)]},
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text=x_title, tickvals=sorted(rows[x].unique()))
    fig.update_yaxes(title_text="WS@K (reference ms / AtSpeed ms, x)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="AS@K (accepted levels per SD step)", rangemode="tozero", row=1, col=2)
    fig.update_layout(height=440)
    return figure(fig)


def curves_section(t: pd.DataFrame, figure: _FigureWriter) -> str:
    tree = t[t["tree_attention"]]
    keys = ["verification", "objective", "k"]
    varies = {x: bool((tree.groupby(keys)[x].nunique() > 1).any()) for x in ("draft_beams", "gamma")}
    if not any(varies.values()):
        return (
            '<p class="note">N (draft_beams) and gamma do not vary in these rows; sweep '
            "experiments/atspeed_n_gamma.yaml for Figure 4 and Figure 6.</p>"
        )
    body = (
        '<p class="note">Mean over seeds (error bars: ± std). Rows with tree attention only. A larger N '
        "drafts more beams (higher acceptance, more draft work); the best gamma depends on N.</p>"
    )
    if varies["draft_beams"]:
        body += "<h3>Draft beam size N (Figure 4)</h3>" + curve_figure(
            tree, "draft_beams", "gamma", "draft beams N", figure
        )
    if varies["gamma"]:
        body += "<h3>Draft length gamma (appendix Figure 6)</h3>" + curve_figure(
            tree, "gamma", "draft_beams", "draft length gamma (levels per SD step)", figure
        )
    # the table lists the curves' points only: arms measured at one (N, gamma) are Table 1's cells
    swept = tree.groupby(keys)[["draft_beams", "gamma"]].transform("nunique").max(axis=1) > 1
    rows = [
        [v, label(o), k, n, g, len(part), cell(part["ws"], 2), cell(part["accepted_steps"], 2)]
        for (v, o, k, n, g), part in _groups(
            tree[swept], ("verification", "objective", "k", "draft_beams", "gamma")
        )
    ]
    table = html_table(["verification", "objective", "K", "N", "gamma", "rows", "WS@K", "AS@K"], rows)
    return body + f"<details><summary>{len(rows)} settings</summary>{table}</details>"


# ------------------------------------------------------------------------------------ (d) ablations


def ablation_pairs(
    t: pd.DataFrame, setting: tuple[bool, int, int]
) -> list[tuple[str, str, pd.DataFrame, pd.DataFrame]]:
    """(full objective, variant, full rows, ablated rows) at the main N and gamma: every ablated objective
    against its full one with tree attention, and every objective without tree attention against itself
    with it."""
    _, n, g = setting
    same = t[(t["draft_beams"] == n) & (t["gamma"] == g)]
    tree, flat = same[same["tree_attention"]], same[~same["tree_attention"]]
    out = []
    for ablated, (full, variant) in ABLATIONS.items():
        if (tree["objective"] == ablated).any():
            out.append((full, variant, tree[tree["objective"] == full], tree[tree["objective"] == ablated]))
    for objective in ordered(flat["objective"], [*LABELS, *ABLATIONS]):
        out.append(
            (objective, "w/o TA", tree[tree["objective"] == objective], flat[flat["objective"] == objective])
        )
    return out


def paired(full: pd.DataFrame, ablated: pd.DataFrame, metric: str) -> dict:
    """The variant against the full objective on one metric, pairs matched by seed: their means and stds
    over the paired seeds, the per-seed difference (variant - full) and the one-sided paired t-test's p
    of H1 "variant below full" (NaN below 2 pairs)."""
    a, f = by_seed(ablated), by_seed(full)
    seeds = sorted(set(a.index) & set(f.index))
    fa, ab = f.loc[seeds, metric], a.loc[seeds, metric]
    p = paired_t_test_less(ab.tolist(), fa.tolist())["p_value"] if len(seeds) >= 2 else float("nan")
    return {
        "seeds": len(seeds),
        "full": mean_std(fa),
        "variant": mean_std(ab),
        "diff": mean_std(ab - fa),
        "p": p,
    }


def ablation_records(t: pd.DataFrame, setting: tuple[bool, int, int]) -> list[dict]:
    """One record per (variant, verification, K): `paired` on WS@K and on AS@K."""
    out: list[dict] = []
    for full, variant, full_rows, ablated_rows in ablation_pairs(t, setting):
        for (verification, k), part in _groups(ablated_rows, ("verification", "k")):
            base = full_rows[(full_rows["verification"] == verification) & (full_rows["k"] == k)]
            out.append(
                {
                    "verification": verification,
                    "full": full,
                    "variant": variant,
                    "k": int(k),
                    "ws": paired(base, part, "ws"),
                    "as": paired(base, part, "accepted_steps"),
                }
            )
    return out


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


def ablation_figure(records: list[dict], figure: _FigureWriter) -> str:
    """Figure 3: bars of WS@K (top) and AS@K (bottom) per K for each full objective and its variants,
    one column per verification (means over the paired seeds, error bars ± std)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    verifications = ordered([r["verification"] for r in records], VERIFICATIONS)
    titles = [f"{v}: {m}" for m in ("WS@K", "AS@K") for v in verifications]
    fig = make_subplots(rows=2, cols=len(verifications), subplot_titles=titles)
    colours: dict[str, str] = {}  # one colour and one legend entry per bar name, across panels
    for col, verification in enumerate(verifications, start=1):
        bars: dict[str, dict[int, tuple[tuple[float, float], tuple[float, float]]]] = {}
        for r in (r for r in records if r["verification"] == verification):
            bars.setdefault(label(r["full"]), {}).setdefault(r["k"], (r["ws"]["full"], r["as"]["full"]))
            variant = f"{label(r['full'])} {r['variant']}"
            bars.setdefault(variant, {})[r["k"]] = (r["ws"]["variant"], r["as"]["variant"])
        for name, per_k in bars.items():
            first = name not in colours
            colours.setdefault(name, PALETTE[len(colours) % len(PALETTE)])
            ks = sorted(per_k)
            for row in (1, 2):
                stats = [per_k[k][row - 1] for k in ks]
                fig.add_trace(
                    go.Bar(
                        x=[f"K={k}" for k in ks],
                        y=[m for m, _ in stats],
                        error_y={"type": "data", "array": [s for _, s in stats]},
                        name=name,
                        legendgroup=name,
                        showlegend=first and row == 1,
                        marker_color=colours[name],
                    ),
                    row=row,
                    col=col,
                )
        fig.update_yaxes(title_text="WS@K (reference ms / AtSpeed ms, x)", rangemode="tozero", row=1, col=col)
        fig.update_yaxes(title_text="AS@K (accepted levels per SD step)", rangemode="tozero", row=2, col=col)
        fig.update_xaxes(title_text="K (items recommended)", row=2, col=col)
    fig.update_layout(barmode="group", height=680)
    return figure(fig)


# ------------------------------------------------------------------------------------- (e) Table 2


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


# ------------------------------------------------------------------------------ (f) strict lossless


def identical_rows(t: pd.DataFrame) -> list[list[object]]:
    """Strict rows per objective and tree attention: the smallest identical_share over seeds, N and
    gamma at each K (1.0: every batch's top-K equals beam search's)."""
    strict = t[t["verification"] == "strict"]
    ks = sorted(strict["k"].unique())
    rows = []
    for (objective, tree), part in _groups(strict, ("objective", "tree_attention")):
        mins = [part.loc[part["k"] == k, "identical_share"].min() for k in ks]
        cells = ["–" if pd.isna(m) else f"{m:.4f}" for m in mins]
        rows.append([label(objective), "on" if tree else "off", len(part), *cells])
    return rows


def identical_section(t: pd.DataFrame) -> str:
    strict = t[t["verification"] == "strict"]
    if strict.empty:
        return '<p class="note">No strict rows.</p>'
    shares = strict["identical_share"]
    low = int((shares < 1.0).sum())
    verdict = (
        f"every strict row has identical_share = 1.0 ({len(strict)} rows): lossless"
        if low == 0 and shares.notna().all()
        else f"NOT lossless: {low} of {len(strict)} strict rows below 1.0 "
        f"({int(shares.isna().sum())} without the metric)"
    )
    ks = sorted(strict["k"].unique())
    headers = ["objective", "tree attention", "rows", *(f"min identical_share @K={k}" for k in ks)]
    return f'<p class="note"><strong>{verdict}</strong></p>' + html_table(headers, identical_rows(t))


# ------------------------------------------------------------------------------------------ the page


def dataset_sections(
    t: pd.DataFrame, name: str, anchor: str, figure: _FigureWriter
) -> list[tuple[str, str, str]]:
    setting = main_setting(t)
    tree, n, g = setting
    main = at_setting(t, setting)
    where = f"N = {n}, gamma = {g}, tree attention {'on' if tree else 'off'}"
    headers, rows = table1(main)
    note = (
        f'<p class="note">Mean ± std over seeds at {where}. WS@K: the reference\'s median ms per batch '
        "over AtSpeed's on the same users in the same trial (strict: the target's beam search at beam K; "
        "relaxed: its sampling beam search); AS@K: accepted levels per speculative step. "
        "*: best mean of its column within a verification.</p>"
    )
    ablations = ablation_records(t, setting)
    ablation_body = (
        f'<p class="note">At N = {n}, gamma = {g}. Pairs matched by seed; Δ: mean ± std of the per-seed '
        'difference; p: one-sided paired t-test of H1 "the variant is below the full objective". '
        "w/o DR / w/o CA / w/o top-K: drafts trained without density regularisation, constrained "
        "alignment or the target's top-K (top-1 only); w/o TA: the same draft verified one level per "
        "target call.</p>" + ablation_table(ablations) + ablation_figure(ablations, figure)
        if ablations
        else '<p class="note">No ablation rows: sweep the ablated objectives '
        "(experiments/atspeed_strict.yaml, atspeed_relaxed.yaml) or experiments/atspeed_no_ta.yaml.</p>"
    )
    table2 = table2_rows(t, setting)
    table2_body = (
        f'<p class="note">Relaxed AtSpeed-R at {where} against the target\'s sampling beam search on the '
        "same users and seed; T=0: the target's beam search from the strict rows. Mean ± std over seeds; p: "
        'one-sided paired t-test of H1 "AtSpeed-R below the target" (p >= 0.05: not significantly '
        "below).</p>" + html_table(TABLE2_HEADERS, table2)
        if table2
        else '<p class="note">Needs relaxed atspeed_r rows (experiments/atspeed_relaxed.yaml).</p>'
    )
    return [
        (f"{anchor}-table1", f"{name}: WS@K and AS@K (Table 1)", note + html_table(headers, rows)),
        (
            f"{anchor}-levels",
            f"{name}: acceptance per drafted level",
            f'<p class="note">Share of users verified at drafted level j whose drafts pass, at {where}.</p>'
            + acceptance_figure(main, figure)
            + acceptance_table(main),
        ),
        (f"{anchor}-curves", f"{name}: draft beams N and draft length gamma", curves_section(t, figure)),
        (f"{anchor}-ablations", f"{name}: ablations (Figure 3)", ablation_body),
        (f"{anchor}-table2", f"{name}: relaxed AtSpeed-R vs target sampling (Table 2)", table2_body),
        (f"{anchor}-identical", f"{name}: strict verification is lossless", identical_section(t)),
    ]


def latest_per_setting(t: pd.DataFrame) -> pd.DataFrame:
    """One row per setting and seed: the latest (rows come oldest first). Two sweeps can measure the same
    point (atspeed_n_gamma's N = 40, gamma = 3 is a Table 1 cell); a mean ± std over seeds must count
    each seed once."""
    keys = ["data", *CONTEXT, *SETTING, "seed"]
    return t.drop_duplicates(keys, keep="last")


def build_atspeed_report(df: pd.DataFrame, out: str | os.PathLike, title: str) -> Path:
    figure = _FigureWriter()
    t = latest_per_setting(tidy(df))
    sections: list[tuple[str, str, str]] = []
    for i, (name, part) in enumerate(sections_by_dataset(t)):
        sections += dataset_sections(part, name, f"d{i}", figure)
    sections += environment_section(df)
    subtitle = f"{len(df)} result rows: {len(t)} (objective, verification, K, N, gamma, tree attention, seed)"
    if len(t) < len(df):
        subtitle += f"; {len(df) - len(t)} repeated points: the latest row counts"
    return write_page(Path(out), title, subtitle, sections)
