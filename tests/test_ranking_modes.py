"""VanI, UOI and MaRI give the same scores for the same weights (random configs, shapes, seeds), and
`RankingScorer.score` rejects malformed requests with a UserInputError naming the problem."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.errors import UserInputError
from genrec.workloads.ranking.model import RankingConfig, eligible_reference_nodes, init_model
from genrec.workloads.ranking.modes import MODES, RankingScorer

dims = st.integers(1, 9)


@settings(max_examples=25, deadline=None)
@given(
    d_user=dims,
    d_seq=dims,
    seq_len=st.integers(1, 6),
    d_item=dims,
    d_cross=dims,
    d_attn=dims,
    d_hidden=dims,
    experts=st.integers(1, 4),
    tasks=st.integers(1, 3),
    b=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_three_modes_agree(
    d_user, d_seq, seq_len, d_item, d_cross, d_attn, d_hidden, experts, tasks, b, seed
):
    cfg = RankingConfig(
        d_user=d_user,
        d_seq=d_seq,
        seq_len=seq_len,
        d_item=d_item,
        d_cross=d_cross,
        d_attn=d_attn,
        d_hidden=d_hidden,
        d_user_emb=3,
        d_tower=4,
        experts=experts,
        tasks=tasks,
    )
    scorer = RankingScorer(init_model(cfg, seed))
    g = torch.Generator().manual_seed(seed)
    user = {"profile": torch.randn(d_user, generator=g), "seq": torch.randn(seq_len, d_seq, generator=g)}
    items, cross = torch.randn(b, d_item, generator=g), torch.randn(b, d_cross, generator=g)
    out = {m: scorer.score(user, items, cross, m) for m in MODES}
    assert out["vani"].shape == (b, tasks)
    torch.testing.assert_close(out["uoi"], out["vani"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["mari"], out["vani"], rtol=1e-5, atol=1e-6)
    assert {e.target for e in scorer.eligible} == eligible_reference_nodes(cfg)


def test_trained_weights_agree_at_large_b():
    from genrec.workloads.ranking.synth import synth_clicks
    from genrec.workloads.ranking.train import train_ranking

    cfg = RankingConfig(
        d_user=32,
        d_seq=8,
        seq_len=6,
        d_item=16,
        d_cross=4,
        d_attn=8,
        d_hidden=16,
        d_user_emb=8,
        d_tower=8,
        experts=2,
        tasks=2,
    )
    scorer = RankingScorer(train_ranking(cfg, steps=20, batch=64).model)
    data = synth_clicks(cfg, rows=500, split=3)
    user = {"profile": data.profile[0], "seq": data.seq[0]}
    ref = scorer.score(user, data.item, data.cross, "vani")
    for mode in ("uoi", "mari"):
        torch.testing.assert_close(scorer.score(user, data.item, data.cross, mode), ref, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def scorer():
    return RankingScorer(init_model(RankingConfig(d_user=5, d_seq=3, seq_len=4, d_item=6, d_cross=2)))


def good(b=3):
    return {"profile": torch.randn(5), "seq": torch.randn(4, 3)}, torch.randn(b, 6), torch.randn(b, 2)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda u, i, c: ({"profile": u["profile"]}, i, c), "keys 'profile' and 'seq'"),
        (lambda u, i, c: ({**u, "profile": torch.randn(2, 5)}, i, c), "user profile"),
        (lambda u, i, c: ({**u, "seq": torch.randn(5, 3)}, i, c), "user seq"),
        (lambda u, i, c: (u, torch.randn(3, 7), c), r"item features: expected \[B, 6\]"),
        (lambda u, i, c: (u, i, torch.randn(4, 2)), "one row per candidate"),
        (lambda u, i, c: (u, i.long(), c), "floating point"),
        (lambda u, i, c: (u, i, c * float("nan")), "NaN"),
    ],
)
def test_bad_requests_raise_user_input_error(scorer, mutate, match):
    with pytest.raises(UserInputError, match=match):
        scorer.score(*mutate(*good()), mode="mari")


def test_unknown_mode(scorer):
    with pytest.raises(UserInputError, match="choose one of"):
        scorer.score(*good(), mode="fast")
