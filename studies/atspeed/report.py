"""Report page for issue 16 (AtSpeed): rows of the `atspeed_arm` benchmark, one per draft objective,
verification, K, draft beams N, draft length gamma, tree attention and seed.

Per dataset: (a) the paper's Table 1 layout, WS@K and AS@K per verification and objective (mean ± std
over seeds) at the main setting (tree attention on, the most common (N, gamma), 40 / 3 on ties);
(b) the acceptance rate per drafted level; (c) WS and AS against N (Figure 4) and against gamma
(appendix Figure 6) where those vary; (d) the ablations w/o DR, w/o CA, w/o top-K and w/o TA against
their full objective, with the paired difference over seeds; (e) Table 2: Recall@K and NDCG@K of
relaxed AtSpeed-R against the target's sampling beam search on the same users, with a one-sided paired
t-test over seeds of H1 "AtSpeed-R below the target"; (f) the share of strict batches whose top-K
equals beam search's (1.0: lossless). The report registry sends atspeed_arm rows here;
objectives keep their colours from style.py on every panel.

This module is the page: each dataset's sections (a)-(f) and `build_atspeed_report`. Beside it:

    atspeed_rows.py       labels, the tidy table of result rows, the main setting, the paper's order
    atspeed_tables.py     Table 1, acceptance per level, the ablation table, Table 2, identical shares
    atspeed_figures.py    acceptance per level, WS/AS against N and gamma, the ablation bars; colours
    atspeed_ablations.py  the ablations paired by seed against their full objective (table and figure)

Every name these modules export that used to be importable from here still is.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from genrec.dashboards.page import FigureWriter, PageContext, finish_page, html_table
from genrec.studies.atspeed.report_ablations import ablation_records
from genrec.studies.atspeed.report_figures import ablation_figure, acceptance_figure, curve_figure
from genrec.studies.atspeed.report_rows import (
    at_setting,
    cell,
    label,
    latest_per_setting,
    main_setting,
    ordered_groups,
    sections_by_dataset,
    tidy,
)
from genrec.studies.atspeed.report_tables import (
    TABLE2_HEADERS,
    ablation_table,
    acceptance_table,
    identical_rows,
    table1,
    table2_rows,
)

# -------------------------------------------------------------------------------------- the sections


def table1_section(main: pd.DataFrame, where: str) -> str:
    headers, rows = table1(main)
    note = (
        f'<p class="note">Mean ± std over seeds at {where}. WS@K: the reference\'s median ms per batch '
        "over AtSpeed's on the same users in the same trial (strict: the target's beam search at beam K; "
        "relaxed: its sampling beam search); AS@K: accepted levels per speculative step. "
        "*: best mean of its column within a verification.</p>"
    )
    return note + html_table(headers, rows)


def levels_section(main: pd.DataFrame, where: str, figure: FigureWriter) -> str:
    return (
        f'<p class="note">Share of users verified at drafted level j whose drafts pass, at {where}.</p>'
        + acceptance_figure(main, figure)
        + acceptance_table(main)
    )


def curves_section(t: pd.DataFrame, figure: FigureWriter) -> str:
    tree = t[t["tree_attention"]]
    keys = ["verification", "objective", "k"]
    varies = {x: bool((tree.groupby(keys)[x].nunique() > 1).any()) for x in ("draft_beams", "gamma")}
    if not any(varies.values()):
        return (
            '<p class="note">N (draft_beams) and gamma do not vary in these rows; sweep '
            "studies/atspeed/experiments/atspeed_n_gamma.yaml for Figure 4 and Figure 6.</p>"
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


def ablations_section(t: pd.DataFrame, setting: tuple[bool, int, int], figure: FigureWriter) -> str:
    _, n, g = setting
    ablations = ablation_records(t, setting)
    if not ablations:
        return (
            '<p class="note">No ablation rows: sweep the ablated objectives '
            "(studies/atspeed/experiments/atspeed_strict.yaml, atspeed_relaxed.yaml) or "
            "studies/atspeed/experiments/atspeed_no_ta.yaml.</p>"
        )
    return (
        f'<p class="note">At N = {n}, gamma = {g}. Pairs matched by seed; Δ: mean ± std of the per-seed '
        'difference; p: one-sided paired t-test of H1 "the variant is below the full objective". '
        "w/o DR / w/o CA / w/o top-K: drafts trained without density regularisation, constrained "
        "alignment or the target's top-K (top-1 only); w/o TA: the same draft verified one level per "
        "target call.</p>" + ablation_table(ablations) + ablation_figure(ablations, figure)
    )


def table2_section(t: pd.DataFrame, setting: tuple[bool, int, int], where: str) -> str:
    table2 = table2_rows(t, setting)
    if not table2:
        return (
            '<p class="note">Needs relaxed atspeed_r rows '
            "(studies/atspeed/experiments/atspeed_relaxed.yaml).</p>"
        )
    return (
        f'<p class="note">Relaxed AtSpeed-R at {where} against the target\'s sampling beam search on the '
        "same users and seed; T=0: the target's beam search from the strict rows. Mean ± std over seeds; p: "
        'one-sided paired t-test of H1 "AtSpeed-R below the target" (p >= 0.05: not significantly '
        "below).</p>" + html_table(TABLE2_HEADERS, table2)
    )


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
    return [
        (f"{anchor}-table1", f"{name}: WS@K and AS@K (Table 1)", table1_section(main, where)),
        (f"{anchor}-levels", f"{name}: acceptance per drafted level", levels_section(main, where, figure)),
        (f"{anchor}-curves", f"{name}: draft beams N and draft length gamma", curves_section(t, figure)),
        (f"{anchor}-ablations", f"{name}: ablations (Figure 3)", ablations_section(t, setting, figure)),
        (
            f"{anchor}-table2",
            f"{name}: relaxed AtSpeed-R vs target sampling (Table 2)",
            table2_section(t, setting, where),
        ),
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
