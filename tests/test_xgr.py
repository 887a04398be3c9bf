"""xGR: the early-terminating top-BW against a flat stable sort (ties included), the in-place reorder
(indexed cache) against the copying one (with keep / truncate / expand), buffer reuse, the decode-state
memory, and the `xgr` decoder's top-K against `beam` at beam widths 10..512, with and without a
constraint."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton import (the triton-backend case)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_beam import make_ctx  # noqa: E402
from test_extend import VOCAB, make_model, random_prompts, random_tree  # noqa: E402

from genrec.studies.xgr.xgr_memory import memory_point  # noqa: E402
from genrec.workloads.decoding import xbeam, xgr  # noqa: E402
from genrec.workloads.decoding.base import DecoderContext, decoder_names, get_decoder, make_params  # noqa: E402
from genrec.workloads.decoding.beam_core import select_beams  # noqa: E402
from genrec.workloads.decoding.buffer_pool import BufferPool  # noqa: E402
from genrec.workloads.errors import UserInputError  # noqa: E402
from genrec.workloads.models.model_config import model_config_for
from genrec.workloads.models.transformer import GRTransformer  # noqa: E402
from genrec.workloads.sid_codec import SIDCodec  # noqa: E402


# ---- early-terminating top-BW -------------------------------------------------------------------------
def stable_reference(scores, log_probs, k):
    """Flat candidates, stable descending sort: (values, flat index), padded like select_beams."""
    b, w, t = log_probs.shape
    values, index = (scores[:, :, None] + log_probs).view(b, -1).sort(dim=1, descending=True, stable=True)
    values, index = values[:, :k], index[:, :k]
    if k > w * t:
        values = torch.cat([values, values.new_full((b, k - w * t), float("-inf"))], dim=1)
        index = torch.cat([index, index.new_zeros(b, k - w * t)], dim=1)
    return values, index


def make_candidates(kind, b, w, t, seed):
    g = torch.Generator().manual_seed(seed)
    scores = (torch.randn(b, w, generator=g) * 2).sort(dim=1, descending=True).values
    if kind == "random":
        lp = torch.log_softmax(torch.randn(b, w, t, generator=g) * 3, dim=-1)
    elif kind == "equal":  # every candidate ties with every other
        scores, lp = torch.zeros(b, w), torch.full((b, w, t), -1.0)
    elif kind == "sorted":  # ascending within each beam, beams in descending order: a heap's worst case
        lp = torch.linspace(-9, -1, t).expand(b, w, t).contiguous()
    elif kind == "coarse":  # few distinct values: many ties inside and at the boundary
        lp = torch.randint(-3, 0, (b, w, t), generator=g).float()
        scores = torch.randint(-2, 1, (b, w), generator=g).float().sort(dim=1, descending=True).values
    else:  # "masked": mostly -inf, as under a constraint (often fewer finite candidates than BW)
        lp = torch.log_softmax(torch.randn(b, w, t, generator=g), dim=-1)
        lp = lp.masked_fill(torch.rand(b, w, t, generator=g) < 0.9, float("-inf"))
    return scores, lp


KINDS = ["random", "equal", "sorted", "coarse", "masked"]


@settings(max_examples=80, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    b=st.integers(1, 3),
    w=st.integers(1, 24),
    t=st.sampled_from([1, 3, 8, 16, 32]),
    k=st.integers(1, 60),
    stripes=st.sampled_from([2, 4, 8]),
    seed=st.integers(0, 10_000),
)
def test_early_topk_equals_a_stable_flat_sort(kind, b, w, t, k, stripes, seed):
    scores, lp = make_candidates(kind, b, w, t, seed)
    top, flat = xbeam.early_topk(scores, lp, k, stripes)
    ref_top, ref_flat = stable_reference(scores, lp, k)
    assert torch.equal(top, ref_top) and torch.equal(flat, ref_flat)
    flat_top, _, _ = select_beams(scores, lp, k)  # the flat top-k `beam` runs: same values
    assert torch.equal(top, flat_top)
    assert_pruned_forms_agree(scores, lp, k, stripes)


def assert_pruned_forms_agree(scores, lp, k, stripes):
    """Both pruned forms (numpy: CPU, torch: elsewhere) return the stable order or refuse."""
    b, w, t = lp.shape
    k = min(k, w * t)
    if t % stripes or t // stripes < 2 or w * stripes <= k + 1:
        return
    ref = stable_reference(scores, lp, k)
    gmax = torch.amax(lp.view(b, w, t // stripes, stripes), dim=2) + scores[:, :, None]
    forms = [xbeam._prune_torch] + ([xbeam._prune_numpy] if lp.dtype != torch.bfloat16 else [])
    for prune in forms:
        found = prune(scores, lp, gmax.view(b, -1), k, stripes)
        if found is not None:
            assert torch.equal(found[0], ref[0]) and torch.equal(found[1], ref[1]), prune.__name__


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_early_topk_in_other_dtypes(dtype, kind):
    """bf16 (many ties; the torch form) and fp64 (the numpy form): still the stable order."""
    scores, lp = (x.to(dtype) for x in make_candidates(kind, 2, 64, 64, seed=2))
    assert all(
        torch.equal(x, y) for x, y in zip(xbeam.early_topk(scores, lp, 64), stable_reference(scores, lp, 64))
    )
    assert_pruned_forms_agree(scores, lp, 64, xbeam.STRIPES)


@pytest.mark.parametrize("prune", ["numpy", "torch"])
@pytest.mark.parametrize("kind", KINDS)
def test_pruned_paths_at_bw_512(prune, kind):
    """BW = 512, T = 256: the pruned path proves random inputs (never falls back) and refuses what it
    cannot prove; whatever it returns is the stable order. Both forms (numpy on CPU, torch elsewhere)."""
    scores, lp = make_candidates(kind, 2, 512, 256, seed=1)
    b, w, t = lp.shape
    gmax = torch.amax(lp.view(b, w, t // xbeam.STRIPES, xbeam.STRIPES), dim=2) + scores[:, :, None]
    fn = xbeam._prune_numpy if prune == "numpy" else xbeam._prune_torch
    found = fn(scores, lp, gmax.view(b, -1), 512, xbeam.STRIPES)
    if kind == "random":
        assert found is not None
    ref = stable_reference(scores, lp, 512)
    if found is not None:
        assert torch.equal(found[0], ref[0]) and torch.equal(found[1], ref[1])
    assert all(torch.equal(x, y) for x, y in zip(xbeam.early_topk(scores, lp, 512), ref))


def test_selector_reuses_its_buffers_level_after_level():
    bufs = xbeam.SelectBuffers.build(2, 40, 3, torch.device("cpu"))
    select = xbeam.EarlyTopK(bufs)
    outs = []
    for level, (w, t) in enumerate([(1, 64), (40, 64), (40, 64)]):
        scores, lp = make_candidates("random", 2, w, t, seed=level)
        got = select(scores, lp, 40)
        ref_top, ref_flat = stable_reference(scores, lp, 40)
        assert torch.equal(got[0], ref_top)
        assert torch.equal(got[1] * t + got[2], ref_flat)
        assert got[0].data_ptr() == bufs.scores[level].data_ptr()  # written in place, no allocation
        outs.append([x.clone() for x in got])
    for level, got in enumerate(outs):  # a later level never overwrote an earlier one
        assert torch.equal(got[0], bufs.scores[level]) and torch.equal(got[1], bufs.parent[level])


@pytest.mark.parametrize("buffers", [False, True])
def test_early_selector_ranks_sparse_constraint_candidates(buffers):
    """An exact top-W selector (EarlyTopK) keeps STATIC's sparse candidates on its CSR levels, ranks
    them itself, and decodes what select_beams decodes with the same constraint."""
    from genrec.workloads.constraints.sets import uniform_random
    from genrec.workloads.constraints.transition import build_transition_matrix
    from genrec.workloads.constraints.vntk import StaticMask
    from genrec.workloads.decoding.beam_core import Candidates, run_beam_search
    from genrec.workloads.decoding.processors import ConstraintProcessor

    sizes, batch, width = (64, 64, 64, 64), 2, 40
    mask = StaticMask(build_transition_matrix(uniform_random(sizes, 3000, seed=1), 1))
    g = torch.Generator().manual_seed(0)
    lps = [
        torch.log_softmax(torch.randn(batch if lv == 0 else batch * width, 64, generator=g) * 3, -1)
        for lv in range(4)
    ]

    class Replay:
        def level_log_probs(self, level):
            return lps[level]

        def advance(self, level, parent, token):
            return None

    def search(select):
        return run_beam_search(
            Replay(), [ConstraintProcessor(mask)], batch, width, 4, torch.device("cpu"), select=select
        )

    bufs = xbeam.SelectBuffers.build(batch, width, 4, torch.device("cpu")) if buffers else None
    early, flat = search(xbeam.EarlyTopK(bufs)), search(select_beams)
    assert [isinstance(c.seen, Candidates) for c in early.choices] == [False, True, True, True]
    assert torch.equal(early.scores, flat.scores) and torch.equal(early.codes, flat.codes)
    assert torch.isfinite(early.scores).all()


def test_buffer_pool_lends_one_buffer_at_a_time():
    pool = BufferPool(max_keys=2)
    a = pool.acquire("k", lambda: object())
    b = pool.acquire("k", lambda: object())
    assert a is not b and pool.built == 2
    pool.release("k", a)
    assert pool.acquire("k", lambda: object()) is a and pool.built == 2
    for key in ("x", "y", "z"):
        pool.release(key, key)
    assert pool.acquire("x", lambda: "new") == "new"  # the least recently used key was dropped


# ---- in-place reorder (the indexed cache) -------------------------------------------------------------
@settings(max_examples=10, deadline=None)
@given(batch=st.integers(1, 3), beams=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_indexed_cache_equals_the_copying_cache(batch, beams, seed):
    """Steps, reorders, a tree block, keep, truncate and a re-expand: the same logits from both layouts."""
    rng = np.random.default_rng(seed)
    model = make_model(seed=seed % 3)
    prompt, pmask = random_prompts(rng, batch, VOCAB, 6)
    pre = model.prefill(prompt, pmask)
    copy, index = pre.cache.expand(beams, 10), pre.cache.expand(beams, 10, indexed=True)
    rows = batch * beams

    def both(fn):
        a, b = fn(copy), fn(index)
        torch.testing.assert_close(a, b, atol=0, rtol=0)

    for _ in range(3):
        tok = torch.from_numpy(rng.integers(3, VOCAB, size=rows))
        both(lambda c, tok=tok: model.step(tok, c).logits)
        parent = torch.from_numpy(
            rng.integers(0, beams, size=(batch, beams)) + np.arange(batch)[:, None] * beams
        )
        copy.reorder(parent.reshape(-1))
        index.reorder(parent.reshape(-1))
    assert index.beam_rows is not None and copy.beam_rows is None
    for layer in range(len(copy.beam_k)):  # the table resolves to exactly the copied steps
        assert torch.equal(index._steps_of(index.beam_k[layer]), copy.beam_k[layer][:, :, :3])
    tree = random_tree(rng, rows, 4)
    block = torch.from_numpy(rng.integers(3, VOCAB, size=(rows, 4)))
    both(lambda c: model.extend(block, c, tree).logits)
    keep = torch.stack([torch.full((rows,), 3), torch.from_numpy(rng.integers(4, 7, size=rows))], 1)
    copy.keep(3, keep)
    index.keep(3, keep)  # resolves the table first (keep moves steps between slots)
    both(lambda c: model.step(torch.full((rows,), 5), c).logits)
    copy.truncate(4)
    index.truncate(4)
    both(lambda c: model.step(torch.full((rows,), 7), c).logits)
    parent = torch.from_numpy(rng.integers(0, rows, size=rows))  # any rows: expand must resolve the table
    copy.reorder(parent)
    index.reorder(parent)
    wide_copy, wide_index = copy.expand(beams * 2, 9), index.expand(beams * 2, 9, indexed=True)
    tok = torch.full((rows * 2,), 9)
    torch.testing.assert_close(
        model.step(tok, wide_copy).logits, model.step(tok, wide_index).logits, atol=0, rtol=0
    )


def test_expand_into_lent_storage():
    model = make_model(seed=0)
    pre = model.prefill(torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.bool))
    bufs = xgr.DecodeBuffers.build(model, 1, 3, 4)
    storage = (bufs.beam_k, bufs.beam_v, bufs.beam_rows)
    cache = pre.cache.expand(3, 3, True, storage)
    assert cache.beam_k[0].data_ptr() == bufs.beam_k[0].data_ptr() and cache.beam_rows is bufs.beam_rows
    assert torch.equal(cache.beam_rows, torch.arange(3)[:, None].expand(3, 3))
    with pytest.raises(ValueError, match="does not match"):
        pre.cache.expand(3, 5, True, storage)


def test_decode_state_memory_at_bw_512_is_far_below_a_per_beam_copy():
    """The issue's target: >= 4x below a per-beam-copied cache at BW = 512, 100-token prompt."""
    codec = SIDCodec((256,) * 4)
    model = GRTransformer(model_config_for("tiny", codec.vocab_size, 128)).eval()
    tokens = torch.randint(codec.num_special, codec.vocab_size, (1, 100))
    prompt = model.prefill(tokens, torch.ones_like(tokens, dtype=torch.bool)).cache
    row = memory_point(model, prompt, 1, 512, 4)
    assert row["hf_over_xgr"] >= 4, row


# ---- the decoder -------------------------------------------------------------------------------------
def decode_pair(ctx, hist, width, k, extra):
    beam, xgr_dec = get_decoder("beam"), get_decoder("xgr")
    a = beam.decode(ctx, hist, make_params(beam, {"beam_width": width, "k": k, **extra}))
    b = xgr_dec.decode(ctx, hist, make_params(xgr_dec, {"beam_width": width, "k": k, **extra}))
    return a, b


def assert_same_top_k(a, b):
    torch.testing.assert_close(b.scores, a.scores, atol=0, rtol=0)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.item_ids, b.item_ids)
    assert torch.equal(a.valid, b.valid)


CONSTRAINTS = [{}, {"constraint": "all"}, {"constraint": "random", "constraint_size": 40}]


@pytest.mark.parametrize("extra", CONSTRAINTS, ids=["none", "all", "random"])
@pytest.mark.parametrize("width", [10, 33, 64, 128])
def test_xgr_top_k_equals_beam(width, extra):
    ctx = make_ctx((8, 8, 8), seed=width, n_items=300)
    rng = np.random.default_rng(width)
    hist = [list(rng.integers(0, len(ctx.item_codes), size=rng.integers(1, 5))) for _ in range(3)]
    assert_same_top_k(*decode_pair(ctx, hist, width, 10, extra))


@pytest.mark.parametrize("extra", CONSTRAINTS[:1] + CONSTRAINTS[2:], ids=["none", "random"])
def test_xgr_top_k_equals_beam_at_width_512(extra):
    """Codebooks of 64: 4096 prefixes after level 1, so BW = 512 is a real choice and the pruned
    selection runs (T = 64 = 2 groups of 32)."""
    ctx = make_ctx((64, 64, 64), seed=5, n_items=3000)
    extra = {**extra, "constraint_size": 2000} if extra else extra
    a, b = decode_pair(ctx, [[1, 2, 3], [4]], 512, 50, extra)
    assert_same_top_k(a, b)


@settings(max_examples=15, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 6), min_size=1, max_size=3),
    width=st.integers(1, 40),
    seed=st.integers(0, 1000),
    constrained=st.booleans(),
)
def test_xgr_equals_beam_on_random_tiny_models(sizes, width, seed, constrained):
    ctx = make_ctx(sizes, seed)
    extra = {"constraint": "all"} if constrained else {}
    assert_same_top_k(*decode_pair(ctx, [[0], [1, 0]], width, min(width, 3), extra))


@pytest.mark.parametrize(
    "ablation", [{"reorder": "copy"}, {"select": "flat"}, {"reuse_buffers": False}], ids=lambda a: str(a)
)
def test_ablations_decode_the_same(ablation):
    ctx = make_ctx((8, 8, 8), seed=1, n_items=300)
    dec = get_decoder("xgr")
    full = dec.decode(ctx, [[1, 2], [3]], make_params(dec, {"beam_width": 20, "k": 5}))
    part = dec.decode(ctx, [[1, 2], [3]], make_params(dec, {"beam_width": 20, "k": 5, **ablation}))
    assert_same_top_k(full, part)


def test_buffers_are_reused_across_requests_and_results_do_not_alias_them():
    ctx = make_ctx((8, 8, 8), seed=2, n_items=300)
    dec = get_decoder("xgr")
    params = make_params(dec, {"beam_width": 17, "k": 4})
    first = dec.decode(ctx, [[1], [2]], params)
    kept = first.scores.clone()
    built = ctx.buffers.built
    second = dec.decode(ctx, [[3, 4], [5]], params)  # same (batch, BW): the lent buffers come back
    assert ctx.buffers.built == built
    assert torch.equal(first.scores, kept)  # the first result was not overwritten
    assert not torch.equal(first.scores, second.scores)


def test_xgr_with_the_triton_attention_equals_beam():
    pytest.importorskip("triton", reason="triton is not installed (CPU runs it under its interpreter)")
    ctx = make_ctx((4, 4, 4), seed=3)
    if torch.cuda.is_available():  # compiled, the kernel reads CUDA tensors (the interpreter CPU ones)
        ctx = DecoderContext(ctx.model.cuda(), ctx.codec, ctx.item_codes, ctx.max_items, ctx.popularity)
    a, b = decode_pair(ctx, [[0, 1], [2]], 10, 5, {"attention": "triton"})
    beam = get_decoder("beam")
    ref = beam.decode(ctx, [[0, 1], [2]], make_params(beam, {"beam_width": 10, "k": 5}))
    assert torch.equal(b.codes, ref.codes)
    torch.testing.assert_close(b.scores, ref.scores, atol=1e-5, rtol=1e-5)


def test_params_and_registration():
    assert "xgr" in decoder_names()
    dec = get_decoder("xgr")
    with pytest.raises(UserInputError, match="`reorder` must be one of"):
        make_params(dec, {"reorder": "nope"})
    with pytest.raises(UserInputError, match="`select` must be one of"):
        make_params(dec, {"select": "heap"})
    with pytest.raises(UserInputError, match="larger than the beam width"):
        make_params(dec, {"beam_width": 2, "k": 5})
