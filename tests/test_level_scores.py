"""A level's scores: full-vocabulary log-softmax gathered at the level's (non-contiguous) token ids, and
`level_softmax` (only the level's LM-head rows) against gather-then-renormalise of the full logits."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.decoding.scorers import level_log_probs as range_log_probs
from genrec.workloads.sid_codec import SIDCodec
from genrec.workloads.sid_table import SIDTokenTable
from genrec.workloads.tokenize.level_scores import (
    gather_level_log_probs,
    level_ids_tensor,
    level_log_probs,
    renormalise_over_level,
)


@st.composite
def head_and_level(draw):
    vocab = draw(st.integers(2, 60))
    dim = draw(st.integers(1, 16))
    t = draw(st.integers(1, vocab))
    ids = draw(st.permutations(range(vocab)))[:t]  # any order, as LC-Rec's string-order ids
    rows = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, 2, dim, generator=g) * 2
    weight = torch.randn(vocab, dim, generator=g)
    return hidden, weight, torch.tensor(ids, dtype=torch.long)


@st.composite
def head_and_gappy_level(draw):
    """As head_and_level, with some codes of the level left without a token (id -1, an LC-Rec gap)."""
    hidden, weight, ids = draw(head_and_level())
    gaps = draw(st.sets(st.integers(0, len(ids) - 1), max_size=len(ids) - 1))
    ids = ids.clone()
    ids[sorted(gaps)] = -1
    return hidden, weight, ids


@settings(max_examples=80, deadline=None)
@given(case=head_and_level())
def test_full_scores_are_the_full_log_softmax_at_the_level_ids(case):
    hidden, weight, ids = case
    logits = hidden @ weight.T
    ref = torch.stack([torch.log_softmax(logits, -1)[..., i] for i in ids.tolist()], dim=-1)
    torch.testing.assert_close(level_log_probs(hidden, weight, ids), ref, rtol=0, atol=1e-5)
    assert torch.equal(gather_level_log_probs(logits, ids), torch.log_softmax(logits, -1)[..., ids])


@settings(max_examples=80, deadline=None)
@given(case=head_and_level())
def test_level_softmax_equals_gather_then_renormalise(case):
    hidden, weight, ids = case
    ref = renormalise_over_level(gather_level_log_probs(hidden @ weight.T, ids))
    got = level_log_probs(hidden, weight, ids, level_softmax=True)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.exp().sum(-1), torch.ones(got.shape[:-1]))
    # one step ranks the codes alike; the scores differ by the per-row log mass of the level
    full = level_log_probs(hidden, weight, ids)
    gap = got - full
    torch.testing.assert_close(gap, gap[..., :1].expand_as(gap), rtol=0, atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(case=head_and_gappy_level())
def test_gap_codes_score_minus_infinity_in_both_modes(case):
    hidden, weight, ids = case
    present = ids >= 0
    logits = hidden @ weight.T
    for level_softmax in (False, True):
        got = level_log_probs(hidden, weight, ids, level_softmax=level_softmax)
        assert torch.isneginf(got[..., ~present]).all()
        ref = torch.log_softmax(logits, -1)[..., ids[present]]
        if level_softmax:
            ref = renormalise_over_level(ref)
        torch.testing.assert_close(got[..., present], ref, rtol=0, atol=1e-5)


def test_our_codec_gives_the_range_scores_bit_identically():
    codec = SIDCodec((5, 7, 3))
    logits = torch.randn(4, codec.vocab_size)
    for level in range(codec.levels):
        ids = level_ids_tensor(codec, level, "cpu")
        assert torch.equal(
            gather_level_log_probs(logits, ids), range_log_probs(logits, *codec.level_range(level))
        )


def test_level_softmax_computes_only_the_level_rows_in_the_weights_dtype():
    table = SIDTokenTable(((7, 2, 9), (0, 5)), 10)
    codec = SIDCodec.from_table(table)
    weight = torch.randn(10, 8, dtype=torch.bfloat16)
    weight[[1, 3, 4, 6, 8]] = float("nan")  # rows of no level-0 token: never read by level_softmax
    hidden = torch.randn(3, 8)
    out = level_log_probs(hidden, weight, level_ids_tensor(codec, 0, "cpu"), level_softmax=True)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert np.array_equal(codec.level_token_ids(0), [7, 2, 9])
