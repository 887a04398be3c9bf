"""Report page for issue 6's comparison: rows of the `nezha_arm` benchmark (one per arm and seed).

Per dataset: a table of every arm (mean ± std over seeds of HR/NDCG@5/10, the share of returned
slots holding items, the share of unverified drafts that are items, p50 latency split into prefill
and decode, training time and steps), quality bars with std error bars, stacked prefill/decode
latency bars, and the one-sided paired t-tests over seeds (pairs matched by seed) of H1 "NEZHA
below beam search" (also against beam-converged, when the sweep has it) and "NEZHA below MTP" on each
quality metric: p >= 0.05 means not significantly below. The report registry sends
nezha_arm rows here. Every arm keeps its colour from style.py (nezha orange, beam blue, ...).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from genrec.dashboards.axes import axis, per_batch
from genrec.dashboards.page import FigureWriter, PageContext, finish_page, fmt_mean_std, html_table
from genrec.dashboards.style import colour
from genrec.studies.nezha.nezha_arms import ARMS
from genrec.workloads.metrics import paired_t_test_less

TESTED = ("hr@5", "hr@10", "ndcg@5", "ndcg@10")
TABLE_COLUMNS = (
    ("hr@5", "HR@5", 4),
    ("hr@10", "HR@10", 4),
    ("ndcg@5", "NDCG@5", 4),
    ("ndcg@10", "NDCG@10", 4),
    ("valid_share", "returned valid", 4),
    ("users_with_k_valid", "users with K valid", 4),
    ("drafts_valid_share", "drafts valid", 4),
    ("latency_p50_ms", "p50 ms / batch", 2),
    ("prefill_ms", "prefill ms", 2),
    ("decode_ms", "decode ms", 2),
    ("train_seconds", "train s", 1),
    ("train_steps", "train steps", 0),
)


def is_nezha_frame(df: pd.DataFrame) -> bool:
    return "benchmark" in df.columns and df["benchmark"].eq("nezha_arm").all()


def arm_order(arms: pd.Series) -> list[str]:
    known = [a for a in ARMS if a in set(arms)]
    return known + sorted(set(arms) - set(known))


def _numeric(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce") if col in df.columns else pd.Series(np.nan, df.index)


def paired_tests(df: pd.DataFrame, arm: str, other: str) -> list[list[object]]:
    """Rows [metric, seeds, mean diff, t, p, verdict] of H1 "arm below other", pairs matched by seed."""
    a = df[df["param_arm"] == arm].drop_duplicates("seed", keep="last").set_index("seed")
    b = df[df["param_arm"] == other].drop_duplicates("seed", keep="last").set_index("seed")
    seeds = sorted(set(a.index) & set(b.index))
    rows: list[list[object]] = []
    for m in TESTED:
        if len(seeds) < 2:
            rows.append([m, len(seeds), "-", "-", "-", "needs 2 or more seeds in both arms"])
            continue
        res = paired_t_test_less(_numeric(a.loc[seeds], m).tolist(), _numeric(b.loc[seeds], m).tolist())
        verdict = "significantly below" if res["p_value"] < 0.05 else "not significantly below"
        t = "-" if np.isnan(res["t"]) else f"{res['t']:.2f}"
        rows.append([m, len(seeds), f"{res['mean_diff']:+.4f}", t, f"{res['p_value']:.3f}", verdict])
    return rows


PHASE_COLOURS = {"prefill": "#4A5568", "decode": "#A0AEC0"}  # phases, not arms: greys
EVAL_BATCH = ("param_eval_batch_size",)
DEFAULT_EVAL_BATCH = 32  # nezha_arms.arm_point's eval_batch_size


def quality_figure(arms: list[str], grouped: dict[str, pd.DataFrame]):
    """One bar per arm (its fixed colour) in each metric's group; error bars ± std over seeds."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for a in arms:
        rows = grouped[a]
        fig.add_trace(
            go.Bar(
                x=list(TESTED),
                y=[_numeric(rows, m).mean() for m in TESTED],
                error_y={
                    "type": "data",
                    "array": [_numeric(rows, m).std(ddof=1) if len(rows) > 1 else 0.0 for m in TESTED],
                },
                name=a,
                marker_color=colour(a),
            )
        )
    fig.update_layout(
        barmode="group",
        height=420,
        xaxis={"title": {"text": "quality metric"}},
        yaxis=axis("hr@10", title="HR@K / NDCG@K, mean over seeds ± std (share, 0–1)"),
    )
    return fig


def latency_figure(arms: list[str], grouped: dict[str, pd.DataFrame], df: pd.DataFrame):
    """Prefill and decode time per arm, stacked (means over seeds)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for col, name in (("prefill_ms", "prefill"), ("decode_ms", "decode")):
        fig.add_trace(
            go.Bar(
                x=arms,
                y=[_numeric(grouped[a], col).mean() for a in arms],
                name=name,
                marker_color=PHASE_COLOURS[name],
            )
        )
    batch = (
        per_batch(df, EVAL_BATCH)
        if "param_eval_batch_size" in df
        else f"per batch of {DEFAULT_EVAL_BATCH} users"
    )
    fig.update_layout(
        barmode="stack",
        height=380,
        xaxis={"title": {"text": "arm"}},
        yaxis=axis("decode_ms", title=f"time {batch} (ms, mean over seeds)"),
    )
    return fig


def dataset_sections(df: pd.DataFrame, label: str, anchor: str, figure: FigureWriter) -> list:
    arms = arm_order(df["param_arm"])
    grouped = {a: df[df["param_arm"] == a] for a in arms}
    rows = []
    for a in arms:
        part = grouped[a]
        seeds = ", ".join(str(int(s)) for s in sorted(part["seed"].unique()))
        cells: list[object] = [a, f"{len(part)} ({seeds})"]
        for col, _, digits in TABLE_COLUMNS:
            v = _numeric(part, col)
            cells.append(fmt_mean_std(v.mean(), v.std(ddof=1) if len(v) > 1 else 0.0, digits))
        rows.append(cells)
    table = html_table(["arm", "seeds", *(name for _, name, _ in TABLE_COLUMNS)], rows)

    quality = quality_figure(arms, grouped)
    latency = latency_figure(arms, grouped, df)

    tests = ""
    for other in ("beam", "beam-converged", "mtp"):
        if "nezha" in grouped and other in grouped:
            tests += f"<h3>H1: NEZHA below {other} (one-sided paired t-test over seeds)</h3>" + html_table(
                ["metric", "paired seeds", "mean diff (nezha - other)", "t", "p", "verdict"],
                paired_tests(df, "nezha", other),
            )
    note = (
        '<p class="note">Every arm of a seed is trained from that seed with the same data, size and '
        "epoch budget. nezha-4 decodes the nezha checkpoint without verification, nezha-every with "
        "verification at every step. <em>returned valid</em>: share of returned slots holding an item; "
        "<em>users with K valid</em>: share of users whose list holds K items; <em>drafts valid</em>: "
        "share of the unverified top-K drafts that are items (head decoders).</p>"
    )
    return [
        (f"{anchor}-table", f"{label}: arms", note + table),
        (f"{anchor}-quality", f"{label}: quality", figure(quality)),
        (f"{anchor}-latency", f"{label}: latency split", figure(latency)),
        (
            f"{anchor}-tests",
            f"{label}: paired t-tests",
            tests or "<p>needs the nezha arm and beam or mtp</p>",
        ),
    ]


def build_nezha_report(
    df: pd.DataFrame, out: str | os.PathLike, title: str, *, context: PageContext = PageContext()
) -> Path:
    figure = FigureWriter()
    key = "dataset_name" if "dataset_name" in df.columns else "param_data"
    sections: list[tuple[str, str, str]] = []
    for i, (name, part) in enumerate(df.groupby(key, sort=True)):
        sections += dataset_sections(part, str(name), f"d{i}", figure)
    return finish_page(
        Path(out), title, f"{len(df)} result rows (one per arm and seed)", sections, df, context
    )
