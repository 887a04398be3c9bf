"""Per-user outcomes beside each result row: ranks recompute every quality metric exactly, the file
is written atomically, and an evaluation's table reproduces its row's quality."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.metrics import user_metric_vector
from genrec.workloads.per_user import (
    metric_from_ranks,
    per_user_path,
    read_per_user,
    target_ranks,
    write_per_user,
)

ITEMS = st.integers(-1, 12)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(ITEMS, max_size=8), st.lists(st.integers(0, 12), min_size=1, max_size=3)),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(["hr", "recall", "ndcg"]),
    st.integers(1, 8),
)
def test_ranks_recompute_the_reference_metrics(users, family, k):
    ranked = [r for r, _ in users]
    targets = [t for _, t in users]
    ranks = [target_ranks(r, t) for r, t in users]
    got = metric_from_ranks(ranks, f"{family}@{k}")
    np.testing.assert_allclose(got, user_metric_vector(ranked, targets, f"{family}@{k}"), atol=1e-12)


def test_evaluation_stores_users_that_reproduce_its_row(synth_dir, tiny_model_dir, tmp_path):
    from genrec.workloads.evaluation import EvalConfig, evaluate, load_context

    ctx, ds, _ = load_context(tiny_model_dir, synth_dir, "cpu")
    cfg = EvalConfig(
        decoder="beam", params={"beam_width": 10}, ks=(5, 10), batch_size=16, max_users=40, threads=1
    )
    out = evaluate(ctx, ds, cfg, progress=False)
    path = write_per_user(tmp_path, "exp", "run-1", out.per_user())
    assert path == per_user_path(tmp_path, "exp", "run-1") and not list(path.parent.glob(".*"))
    users = read_per_user(tmp_path, "exp", "run-1")
    assert len(users) == 40 and users["batch"].max() == 2
    assert users["batch_latency_ms"].notna().all()
    for metric in ("hr@5", "recall@10", "ndcg@10"):
        assert metric_from_ranks(users["target_ranks"], metric).mean() == np.float64(out.row.quality[metric])
    assert read_per_user(tmp_path, "exp", "run-2") is None
