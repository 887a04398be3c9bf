"""Report page for issue 16 (AtSpeed): rows of the `atspeed_arm` benchmark, one per draft objective,
verification, K, draft beams N, draft length gamma, tree attention and seed.

Per dataset: (a) the paper's Table 1 layout, WS@K and AS@K per verification and objective (mean ± std
over seeds) at the main setting (tree attention on, the most common (N, gamma), 40 / 3 on ties);
(b) the acceptance rate per drafted level; (c) WS and AS against N (Figure 4) and against gamma
(appendix Figure 6) where those vary; (d) the ablations w/o DR, w/o CA, w/o top-K and w/o TA against
their full objective, with the paired difference over seeds; (e) Table 2: Recall@K and NDCG@K of
relaxed AtSpeed-R against the target's sampling beam search on the same users, with a one-sided paired
t-test over seeds of H1 "AtSpeed-R below the target"; (f) the share of strict batches whose top-K
equals beam search's (1.0: lossless). The report registry (registry.py) sends atspeed_arm rows here;
objectives keep their colours from style.py on every panel.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from genrec.dashboards.atspeed_rows import (  # noqa: F401  (is_atspeed_frame: the page's row test)
    ABLATIONS,
    LABELS,
    MAX_LEVELS,
    at_setting,
    by_seed,
    cell,
    is_atspeed_frame,
    label,
    latest_per_setting,
    main_setting,
    mean_std,
    ordered,
    ordered_groups,
    sections_by_dataset,
    tidy,
)
from genrec.dashboards.page import FigureWriter, PageContext, finish_page, fmt_mean_std, html_table
from genrec.dashboards.style import colour, rate_axis, tint, trace_styles
from genrec.workloads.benchmarks.atspeed_arms import VERIFICATIONS
from genrec.workloads.metrics import paired_t_test_less

# an ablation reads as a lighter shade of its full objective's colour
VARIANT_TINT = {"w/o DR": 0.3, "w/o top-K": 0.3, "w/o CA": 0.5, "w/o TA": 0.7}


def objective_colour(objective: str, variant: str = "") -> str:
    """The objective's fixed colour (style.py); an ablated objective or a variant a lighter shade of it."""
    if objective in ABLATIONS:
        objective, variant = ABLATIONS[objective]
    return tint(colour(objective), VARIANT_TINT.get(variant, 0.4)) if variant else colour(objective)


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


def acceptance_figure(main: pd.DataFrame, figure: FigureWriter) -> str:
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
        for objective in objectives:
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
                    line={"color": objective_colour(objective)},
                ),
                row=1,
                col=col,
            )
            shown.add(objective)
        fig.update_xaxes(title_text="drafted level j", dtick=1, row=1, col=col)
        fig.update_yaxes(title_text="acceptance rate at level j (share, 0–1)", row=1, col=col, **rate_axis())
    fig.update_layout(height=420)
    return figure(fig)


# ------------------------------------------------------------------------------ (c) N and gamma


def curve_figure(rows: pd.DataFrame, x: str, line: str, x_title: str, figure: FigureWriter) -> str:
    """WS@K and AS@K against `x`, one line per (verification, objective, K, `line` value)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=["walltime speedup WS@K", "accepted steps AS@K"])
    keys = ("verification", "objective", "k", line)
    groups = [(key, part) for key, part in ordered_groups(rows, keys) if part[x].nunique() >= 2]
    # an objective's colour, a dash per (verification, K, other parameter) within it
    styles = trace_styles((o, f"{v} {k} {other}") for (v, o, k, other), _ in groups)
    for key, part in groups:
        verification, objective, k, other = key
        style = styles[(objective, f"{verification} {k} {other}")]
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
                    line={"color": objective_colour(objective), "dash": style.dash},
                    marker={"symbol": style.symbol},
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text=x_title, tickvals=sorted(rows[x].unique()))
    fig.update_yaxes(title_text="WS@K (reference ms / AtSpeed ms, x)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="AS@K (accepted levels per SD step)", rangemode="tozero", row=1, col=2)
    fig.update_layout(height=440)
    return figure(fig)


def curves_section(t: pd.DataFrame, figure: FigureWriter) -> str:
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
        for (v, o, k, n, g), part in ordered_groups(
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
        for (verification, k), part in ordered_groups(ablated_rows, ("verification", "k")):
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


def ablation_figure(records: list[dict], figure: FigureWriter) -> str:
    """Figure 3: bars of WS@K (top) and AS@K (bottom) per K for each full objective and its variants,
    one column per verification (means over the paired seeds, error bars ± std)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    verifications = ordered([r["verification"] for r in records], VERIFICATIONS)
    titles = [f"{v}: {m}" for m in ("WS@K", "AS@K") for v in verifications]
    fig = make_subplots(rows=2, cols=len(verifications), subplot_titles=titles)
    shown: set[str] = set()  # one legend entry per bar name, across panels
    for col, verification in enumerate(verifications, start=1):
        bars: dict[str, dict[int, tuple[tuple[float, float], tuple[float, float]]]] = {}
        colours: dict[str, str] = {}
        for r in (r for r in records if r["verification"] == verification):
            bars.setdefault(label(r["full"]), {}).setdefault(r["k"], (r["ws"]["full"], r["as"]["full"]))
            variant = f"{label(r['full'])} {r['variant']}"
            bars.setdefault(variant, {})[r["k"]] = (r["ws"]["variant"], r["as"]["variant"])
            colours[label(r["full"])] = objective_colour(r["full"])
            colours[variant] = objective_colour(r["full"], r["variant"])
        for name, per_k in bars.items():
            first = name not in shown
            shown.add(name)
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
        fig.update_xaxes(title_text="K (items recommended)", row=1, col=col)
        fig.update_xaxes(title_text="K (items recommended)", row=2, col=col)
    fig.update_layout(barmode="group", height=820)
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
    for (objective, tree), part in ordered_groups(strict, ("objective", "tree_attention")):
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
    t: pd.DataFrame, name: str, anchor: str, figure: FigureWriter
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


def build_atspeed_report(
    df: pd.DataFrame, out: str | os.PathLike, title: str, *, context: PageContext = PageContext()
) -> Path:
    figure = FigureWriter()
    t = latest_per_setting(tidy(df))
    sections: list[tuple[str, str, str]] = []
    for i, (name, part) in enumerate(sections_by_dataset(t)):
        sections += dataset_sections(part, name, f"d{i}", figure)
    subtitle = f"{len(df)} result rows: {len(t)} (objective, verification, K, N, gamma, tree attention, seed)"
    if len(t) < len(df):
        subtitle += f"; {len(df) - len(t)} repeated points: the latest row counts"
    return finish_page(Path(out), title, subtitle, sections, df, context)
