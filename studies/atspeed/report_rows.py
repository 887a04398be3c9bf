"""The AtSpeed page's rows (studies/atspeed/report.py): labels as the paper prints them, the tidy table
(one row per result row: setting, seed, dataset and the metrics the page reads), the acceptance columns
it has, the main setting of Table 1, and grouping in the paper's order. No figures here.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from genrec.dashboards.page import fmt_mean_std
from genrec.studies.atspeed.atspeed_arms import VERIFICATIONS, arm_point

LABELS = {
    "sft": "SFT",
    "wordkd": "WordKD",
    "seqkd": "SeqKD",
    "tvdkd": "TVDKD",
    "atspeed_s": "AtSpeed-S",
    "atspeed_r": "AtSpeed-R",
}
# ablated objective -> (full objective, variant name as in the paper's Figure 3 and Table 5)
ABLATIONS = {
    "atspeed_s-no_dr": ("atspeed_s", "w/o DR"),
    "atspeed_s-no_ca": ("atspeed_s", "w/o CA"),
    "atspeed_r-no_ca": ("atspeed_r", "w/o CA"),
    "atspeed_r-top1": ("atspeed_r", "w/o top-K"),
    # not an ablation but an addition (Table 5): the same pairing by seed, the same test of "below"
    "atspeed_s-ad": ("atspeed_s", "w/ AD"),
    "atspeed_r-ad": ("atspeed_r", "w/ AD"),
    "seqkd-ad": ("seqkd", "w/ AD"),
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


def level_columns(t: pd.DataFrame) -> list[str]:
    """The acceptance_level_<j> columns that have a value in `t`, level 1 first."""
    return [
        c
        for c in (f"acceptance_level_{j}" for j in range(1, MAX_LEVELS + 1))
        if c in t and t[c].notna().any()
    ]


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
    with the most rows (the sweep's fixed defaults; studies/atspeed/experiments/atspeed_n_gamma.yaml adds a
    few rows at many pairs), arm_point's defaults on ties."""
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


def ordered_groups(rows: pd.DataFrame, keys: tuple[str, ...]) -> list[tuple[tuple, pd.DataFrame]]:
    """groupby in the page's order: verifications and objectives as the paper lists them, then K."""
    order = {
        "verification": ordered(rows["verification"], VERIFICATIONS),
        "objective": ordered(rows["objective"], [*LABELS, *ABLATIONS]),
    }
    keyed = {tuple(key if isinstance(key, tuple) else (key,)): part for key, part in rows.groupby(list(keys))}

    def rank(key: tuple) -> tuple:
        return tuple(order[name].index(v) if name in order else v for name, v in zip(keys, key))

    return [(key, keyed[key]) for key in sorted(keyed, key=rank)]


def latest_per_setting(t: pd.DataFrame) -> pd.DataFrame:
    """One row per setting and seed: the latest (rows come oldest first). Two sweeps can measure the same
    point (atspeed_n_gamma's N = 40, gamma = 3 is a Table 1 cell); a mean ± std over seeds must count
    each seed once."""
    keys = ["data", *CONTEXT, *SETTING, "seed"]
    return t.drop_duplicates(keys, keep="last")
