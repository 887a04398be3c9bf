"""Beam search against the exhaustive reference, validity flags, params and the popular baseline."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.decoding.base import DecoderContext, ItemIndex, get_decoder, make_params
from genrec.workloads.decoding.exhaustive import exhaustive_top_k
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec


def make_ctx(sizes, seed, n_items=None, max_items=4):
    codec = SIDCodec(tuple(sizes))
    rng = np.random.default_rng(seed)
    space = codec.num_sids
    n_items = n_items or max(2, space // 2)
    keys = rng.choice(space, size=min(n_items, space), replace=False)
    codes = codec.keys_to_codes(keys)
    torch.manual_seed(seed)
    # large init so the distribution is far from uniform and beam search has real choices to make
    model = GRTransformer(
        ModelConfig(vocab_size=codec.vocab_size, dim=16, n_layers=1, n_heads=2, max_seq_len=64)
    )
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return DecoderContext(model.eval(), codec, codes, max_items, popularity=rng.integers(0, 50, len(codes)))


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 5), min_size=1, max_size=3),
    seed=st.integers(0, 10_000),
    batch=st.integers(1, 3),
    k=st.integers(1, 4),
)
def test_beam_equals_exhaustive_when_beam_holds_every_prefix(sizes, seed, batch, k):
    ctx = make_ctx(sizes, seed)
    rng = np.random.default_rng(seed + 1)
    histories = [list(rng.integers(0, len(ctx.item_codes), size=rng.integers(1, 6))) for _ in range(batch)]
    # with W >= the number of prefixes at every level, beam search keeps every prefix: exact
    width = max(math.prod(sizes[:-1]) * sizes[-1], k) if len(sizes) == 1 else max(math.prod(sizes[:-1]), k)
    k = min(k, math.prod(sizes))
    beam = get_decoder("beam")
    res = beam.decode(ctx, histories, make_params(beam, {"beam_width": width, "k": k}))
    ref_codes, ref_scores = exhaustive_top_k(ctx, histories, k)
    torch.testing.assert_close(res.scores, ref_scores, atol=1e-4, rtol=1e-4)
    # same SIDs, up to ties in score
    for b in range(batch):
        for j in range(k):
            if not torch.equal(res.codes[b, j], ref_codes[b, j]):
                tied = (ref_scores[b] - res.scores[b, j]).abs() < 1e-4
                assert any(torch.equal(res.codes[b, j], ref_codes[b, i]) for i in torch.nonzero(tied)[:, 0])


def test_narrow_beam_scores_never_beat_exhaustive():
    ctx = make_ctx((4, 4, 4), seed=3)
    hist = [[0, 1], [2]]
    beam = get_decoder("beam")
    res = beam.decode(ctx, hist, make_params(beam, {"beam_width": 2, "k": 2}))
    _, ref = exhaustive_top_k(ctx, hist, 2)
    assert (res.scores <= ref + 1e-5).all()
    assert (res.scores[:, :-1] >= res.scores[:, 1:]).all()  # sorted best first


def test_validity_flags_and_item_ids_match_the_catalogue():
    ctx = make_ctx((3, 3), seed=5, n_items=4)
    beam = get_decoder("beam")
    res = beam.decode(ctx, [[0], [1, 2]], make_params(beam, {"beam_width": 9, "k": 9}))
    catalogue = {tuple(c): i for i, c in enumerate(ctx.item_codes.tolist())}
    for b in range(2):
        for j in range(9):
            sid = tuple(res.codes[b, j].tolist())
            assert bool(res.valid[b, j]) == (sid in catalogue)
            assert int(res.item_ids[b, j]) == catalogue.get(sid, -1)
    assert res.valid.sum() == 2 * 4  # every SID of the space is returned once, 4 are items


def test_beam_wider_than_first_codebook_returns_only_real_beams():
    ctx = make_ctx((2, 2), seed=1, n_items=4)
    beam = get_decoder("beam")
    res = beam.decode(ctx, [[0]], make_params(beam, {"beam_width": 6, "k": 6}))
    assert torch.isfinite(res.scores[0, :4]).all() and torch.isinf(res.scores[0, 4:]).all()
    assert not res.valid[0, 4:].any()


def test_timings_and_counters_are_reported():
    ctx = make_ctx((4, 4, 4), seed=0)
    beam = get_decoder("beam")
    res = beam.decode(ctx, [[1, 2]], make_params(beam, {"beam_width": 3, "k": 2}))
    assert {"prefill", "decode", "system", "decode_forward"} <= set(res.timings_ms)
    assert 0 < res.timings_ms["decode_forward"] <= res.timings_ms["decode"]
    assert res.counters["model_calls"] == 3


def test_bad_params_and_inputs_are_rejected():
    ctx = make_ctx((3, 3), seed=0)
    beam = get_decoder("beam")
    with pytest.raises(UserInputError, match="larger than the beam width"):
        make_params(beam, {"beam_width": 2, "k": 5})
    with pytest.raises(UserInputError, match="no parameter"):
        make_params(beam, {"beam": 2})
    with pytest.raises(UserInputError, match="unknown decoder"):
        get_decoder("nope")
    with pytest.raises(UserInputError, match="unknown item ids"):
        beam.decode(ctx, [[999]], make_params(beam, {}))


def test_popular_baseline_ranks_by_train_count():
    ctx = make_ctx((3, 3), seed=0)
    pop = get_decoder("popular")
    res = pop.decode(ctx, [[0], [1]], make_params(pop, {"k": 3}))
    expected = np.argsort(-ctx.popularity, kind="stable")[:3]
    assert res.item_ids.tolist() == [expected.tolist()] * 2 and res.valid.all()


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(0, 63), min_size=1, max_size=30, unique=True),
    st.lists(st.integers(0, 63), max_size=20),
)
def test_item_index_lookup_matches_python_dict(item_keys, queries):
    codec = SIDCodec((4, 4, 4))
    index = ItemIndex(codec, codec.keys_to_codes(np.array(item_keys)))
    ids, valid = index.lookup(
        torch.as_tensor(codec.keys_to_codes(np.array(queries, dtype=np.int64)).reshape(-1, 3))
    )
    table = {k: i for i, k in enumerate(item_keys)}
    assert ids.tolist() == [table.get(q, -1) for q in queries]
    assert valid.tolist() == [q in table for q in queries]
