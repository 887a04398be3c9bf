"""The AtSpeed page's ablations (studies/atspeed/report.py, Figure 3 and its table): w/o DR, w/o CA and w/o
top-K (and Table 5's w/ AD, all-step teacher data) against their full objective with tree attention,
and every objective without tree attention (w/o TA) against itself with it, at the main N and gamma;
pairs matched by seed, with the one-sided paired t-test of H1 "the variant is below the full objective".
"""

from __future__ import annotations

import pandas as pd

from genrec.studies.atspeed.report_rows import ABLATIONS, LABELS, by_seed, mean_std, ordered, ordered_groups
from genrec.workloads.metrics import paired_t_test_less


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
