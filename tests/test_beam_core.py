"""The one beam core with level processors: constraints under every beam-based decoder.

- `beam` with `constraint=X` decodes exactly as `static` with X (same SIDs, same scores);
- NEZHA with a constraint set and verify="every" equals the per-beam reference of Algorithm 3 whose
  verifier is the constraint set (the set is inside the catalogue, so every-step verification against
  the catalogue and the set's mask together keep exactly the set's prefixes);
- NEZHA + STATIC returns only items of the set (invalid_rate 0) with any verify mode;
- select_beams equals a sort of all candidates, with padding when there are fewer than W.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.constraints.sets import ConstraintSet
from genrec.workloads.constraints.transition import build_transition_matrix
from genrec.workloads.constraints.vntk import StaticMask
from genrec.workloads.decoding import mtp as _mtp  # noqa: F401  (registers the decoders)
from genrec.workloads.decoding.base import DecoderContext, get_decoder, make_params
from genrec.workloads.decoding.beam_core import select_beams
from genrec.workloads.decoding.nezha import PythonSetVerifier, head_beam_search, reference_decode
from genrec.workloads.decoding.processors import ConstraintProcessor
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.nezha_head import HeadConfig, build_head
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec

DIM = 16


def make_ctx(sizes, seed, with_head=False):
    codec = SIDCodec(tuple(sizes))
    rng = np.random.default_rng(seed)
    n = max(4, codec.num_sids // 2)
    items = codec.keys_to_codes(rng.choice(codec.num_sids, size=n, replace=False))
    torch.manual_seed(seed)
    model = GRTransformer(
        ModelConfig(vocab_size=codec.vocab_size, dim=DIM, n_layers=1, n_heads=2, max_seq_len=96)
    )
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    head = None
    if with_head:
        head = build_head(HeadConfig.for_variant("nezha", DIM, codec.codebook_sizes, "full")).eval()
        with torch.no_grad():
            for p in head.parameters():
                p.normal_(0, 0.7)
    popularity = rng.integers(0, 3, len(items))
    popularity[::3] = 0  # the cold-start set is never empty
    return DecoderContext(model.eval(), codec, np.asarray(items), 4, popularity, head)


def subset(ctx, seed, n):
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(ctx.item_codes), size=min(n, len(ctx.item_codes)), replace=False)
    return ConstraintSet.from_codes("sub", ctx.codec, ctx.item_codes[pick])


@settings(max_examples=12, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 5), min_size=2, max_size=3),
    seed=st.integers(0, 10_000),
    width=st.integers(1, 6),
    n_allowed=st.integers(1, 12),
)
def test_beam_with_a_constraint_equals_static(sizes, seed, width, n_allowed):
    ctx = make_ctx(sizes, seed)
    ctx.constraints.register(subset(ctx, seed, n_allowed))
    beam, static = get_decoder("beam"), get_decoder("static")
    hist = [[0, 1], [2]]
    p = {"beam_width": width, "k": width, "constraint": "sub"}
    a = beam.decode(ctx, hist, make_params(beam, p))
    b = static.decode(ctx, hist, make_params(static, p))
    assert torch.equal(a.codes, b.codes) and torch.equal(a.valid, b.valid)
    torch.testing.assert_close(a.scores, b.scores, atol=0, rtol=0)
    allowed = {tuple(r) for r in ctx.constraints.constraint_set(make_params(beam, p)).codes.tolist()}
    got = {
        tuple(c)
        for c, ok in zip(a.codes.reshape(-1, len(sizes)).tolist(), a.valid.reshape(-1).tolist())
        if ok
    }
    assert got <= allowed


@pytest.mark.parametrize("seed", range(4))
def test_nezha_head_search_with_a_constraint_equals_the_reference(seed):
    sizes = (5, 4, 6)
    ctx = make_ctx(sizes, seed, with_head=True)
    cset = subset(ctx, seed, 15)
    states = torch.randn(4, len(sizes) + 1, DIM, generator=torch.Generator().manual_seed(seed))
    mask = ConstraintProcessor(StaticMask(build_transition_matrix(cset, 1)))
    with torch.no_grad():
        res = head_beam_search(ctx.draft_head, states, 3, ctx.codec, ctx.index.prefix_sets(), "every", [mask])
    ref = reference_decode(
        ctx.draft_head, states, 3, ctx.codec, PythonSetVerifier(ctx.codec, cset.codes), "every"
    )
    for u, want in enumerate(ref):
        got = [
            (tuple(res.codes[u, j].tolist()), float(res.scores[u, j]))
            for j in range(3)
            if math.isfinite(float(res.scores[u, j]))
        ]
        assert [c for c, _ in got] == [c for c, _ in want]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("verify", ["final", "every", "none"])
def test_nezha_with_static_returns_only_items_of_the_set(verify):
    ctx = make_ctx((6, 5, 4), seed=3, with_head=True)
    dec = get_decoder("nezha")
    params = make_params(dec, {"beam_width": 6, "k": 6, "constraint": "cold_start", "verify": verify})
    res = dec.decode(ctx, [[0, 1], [2], [3, 4, 5]], params)
    cold = {tuple(c) for c in ctx.item_codes[ctx.popularity == 0].tolist()}
    found = torch.isfinite(res.scores)
    returned = [tuple(c) for c in res.codes[found].tolist()]
    assert returned and set(returned) <= cold
    assert bool(res.valid[found].all())  # every returned SID is an item: invalid_rate 0
    assert res.counters["missing"] == int((~found).sum())


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 3),
    w=st.integers(1, 4),
    t=st.integers(1, 5),
    width=st.integers(1, 12),
    seed=st.integers(0, 10_000),
    ties=st.booleans(),
)
def test_select_beams_equals_a_full_sort(b, w, t, width, seed, ties):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, w, generator=g)
    lp = torch.randn(b, w, t, generator=g)
    if ties:
        lp = lp.round()
        scores = scores.round()
    top, parent, code = select_beams(scores, lp, width)
    for u in range(b):
        cand = sorted(((scores[u, j] + lp[u, j, c]).item() for j in range(w) for c in range(t)), reverse=True)
        n = min(width, w * t)
        np.testing.assert_allclose(top[u, :n].numpy(), cand[:n], rtol=1e-6)
        assert torch.isinf(top[u, n:]).all()
        # each kept (parent, code) really scores what it says
        np.testing.assert_allclose(
            (scores[u, parent[u, :n]] + lp[u, parent[u, :n], code[u, :n]]).numpy(),
            top[u, :n].numpy(),
            rtol=1e-6,
        )
