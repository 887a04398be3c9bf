"""STATIC constrained decoding: constraint sets, the CSR transition matrix, the VNTK mask, the decoder."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.kernels.constrained_mask_torch import vntk_apply
from genrec.workloads.constraints.baselines import HashBitmap
from genrec.workloads.constraints.live import LiveStaticMask
from genrec.workloads.constraints.sets import (
    ConstraintError,
    ConstraintSet,
    cold_start,
    from_file,
    newest,
    random_subset,
    uniform_random,
)
from genrec.workloads.constraints.transition import build_transition_matrix
from genrec.workloads.constraints.vntk import StaticMask
from genrec.workloads.decoding.base import DecoderContext, get_decoder, make_params
from genrec.workloads.decoding.beam import backbone_beam_search
from genrec.workloads.decoding.params import BeamParams
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec

GOLDEN = [(1, 2, 3, 4, 5), (1, 2, 3, 6, 7), (1, 2, 8, 9, 0), (2, 3, 4, 5, 6)]


def make_ctx(sizes, seed, item_codes=None):
    codec = SIDCodec(tuple(sizes))
    rng = np.random.default_rng(seed)
    if item_codes is None:
        n = max(2, codec.num_sids // 2)
        item_codes = codec.keys_to_codes(rng.choice(codec.num_sids, size=n, replace=False))
    torch.manual_seed(seed)
    model = GRTransformer(
        ModelConfig(vocab_size=codec.vocab_size, dim=16, n_layers=1, n_heads=2, max_seq_len=64)
    )
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return DecoderContext(
        model.eval(), codec, np.asarray(item_codes), 4, popularity=rng.integers(0, 3, len(item_codes))
    )


# --- reference: a Python trie walk over the allowed SIDs ---------------------------------------
@torch.no_grad()
def brute_force_beam(ctx, history, allowed, width):
    """Constrained beam search by full recomputation and a dict trie; returns [(sid, score)] best first."""
    codec = ctx.codec
    children: dict[tuple, set] = {}
    for sid in allowed:
        for t in range(codec.levels):
            children.setdefault(tuple(sid[:t]), set()).add(int(sid[t]))
    prompt, mask = ctx.prompts([history])
    beams = [((), 0.0)]
    for level in range(codec.levels):
        n = len(beams)
        toks = torch.as_tensor(np.asarray([p for p, _ in beams], dtype=np.int64).reshape(n, level))
        seq = torch.cat([prompt.expand(n, -1), toks + torch.as_tensor(codec.offsets()[:level])], dim=1)
        seq_mask = torch.cat([mask.expand(n, -1), torch.ones(n, level, dtype=torch.bool)], dim=1)
        logits, _ = ctx.model(seq, seq_mask)  # one full recomputation per level, no KV cache
        lp = torch.log_softmax(logits[:, -1].float(), -1)[:, slice(*codec.level_range(level))]
        cands = [
            (prefix + (tok,), score + float(lp[i, tok]))
            for i, (prefix, score) in enumerate(beams)
            for tok in sorted(children.get(prefix, ()))
        ]
        cands.sort(key=lambda c: -c[1])
        beams = cands[:width]
    return beams


# --- constraint sets ---------------------------------------------------------------------------
def test_unsorted_and_duplicated_input_is_sorted_and_deduplicated():
    cs = ConstraintSet.from_codes("x", (10,) * 5, [GOLDEN[3], GOLDEN[0], GOLDEN[2], GOLDEN[0], GOLDEN[1]])
    assert [tuple(r) for r in cs.codes.tolist()] == GOLDEN
    assert cs.stats["duplicates_dropped"] == 1 and cs.stats["was_sorted"] is False
    assert cs.contains(np.array([GOLDEN[1], (1, 2, 3, 4, 6)])).tolist() == [True, False]


def test_every_construction_normalises_or_rejects():
    """`ConstraintSet(...)` directly normalises exactly as from_codes (the upstream builder's silently
    wrong index from unsorted input cannot be built)."""
    rows = [GOLDEN[3], GOLDEN[0], GOLDEN[2], GOLDEN[0], GOLDEN[1]]
    direct = ConstraintSet("x", (10,) * 5, np.asarray(rows), {"rule": "test"})
    via = ConstraintSet.from_codes("x", (10,) * 5, rows, rule="test")
    assert [tuple(r) for r in direct.codes.tolist()] == GOLDEN and direct.codes.dtype == np.int32
    assert np.array_equal(direct.codes, via.codes) and direct.stats == via.stats
    assert direct.stats["duplicates_dropped"] == 1 and direct.stats["rule"] == "test"
    assert _enumerate(StaticMask(build_transition_matrix(direct, 1)), (10,) * 5) == GOLDEN
    with pytest.raises(ConstraintError, match="outside the codebook"):
        ConstraintSet("bad", (10,) * 5, np.asarray([[1, 2, 3, 4, 10]]))
    with pytest.raises(ConstraintError, match="empty"):
        ConstraintSet("bad", (10,) * 5, np.zeros((0, 5), dtype=np.int64))


@pytest.mark.parametrize(
    "codes, match",
    [
        ([[1, 2, 3]], "shape"),
        ([[1, 2, 3, 4, 10]], "outside the codebook"),
        ([[1, 2, 3, 4, -1]], "outside the codebook"),
        (np.zeros((0, 5), dtype=np.int64), "empty"),
        ([[1.5, 2, 3, 4, 5]], "integers"),
    ],
)
def test_bad_constraint_input_raises_documented_errors(codes, match):
    with pytest.raises(ConstraintError, match=match):
        ConstraintSet.from_codes("bad", (10,) * 5, codes)
    assert issubclass(ConstraintError, UserInputError)


def test_rules_build_the_expected_sets(tmp_path):
    codec = SIDCodec((4, 4, 4))
    items = codec.keys_to_codes(np.arange(0, 64, 2))  # 32 items
    counts = np.zeros(32, dtype=int)
    counts[:30] = 1
    assert len(cold_start(codec, items, counts)) == 2
    with pytest.raises(ConstraintError, match="empty"):
        cold_start(codec, items, np.ones(32))
    r = random_subset(codec, items, 5, seed=1)
    assert len(r) == 5 and ConstraintSet.from_codes("all", codec, items).contains(r.codes).all()
    with pytest.raises(ConstraintError, match="between 1 and"):
        random_subset(codec, items, 33)
    first_seen = np.arange(32.0)
    nw = newest(codec, items, first_seen, 0.25)
    assert sorted(map(tuple, nw.codes.tolist())) == sorted(map(tuple, items[24:].tolist()))
    u = uniform_random((2048,) * 8, 1000, seed=0)  # the paper's space (2^88 SIDs) needs no int64 keys
    assert len(u) == 1000 and u.codes.shape == (1000, 8)
    assert len(uniform_random(codec, 64)) == 64
    f = tmp_path / "set.txt"
    f.write_text("# allowed\n1 2 3\n0,0,1\n1-2-3\n")
    assert from_file(codec, f).codes.tolist() == [[0, 0, 1], [1, 2, 3]]
    f.write_text("1 2\n")
    with pytest.raises(ConstraintError, match=r"set.txt:1: 2 codes, expected 3"):
        from_file(codec, f)
    np.save(tmp_path / "s.npy", np.array([[3, 3, 3], [0, 0, 0]]))
    assert from_file(codec, tmp_path / "s.npy").codes.tolist() == [[0, 0, 0], [3, 3, 3]]


# --- transition matrix -------------------------------------------------------------------------
@pytest.mark.parametrize("fraction", [0.0, 1.0])
@pytest.mark.parametrize("d", [0, 1, 2, 3])
def test_golden_example_branch_factors_and_masks(d, fraction):
    cs = ConstraintSet.from_codes("golden", (10,) * 5, GOLDEN)
    tm = build_transition_matrix(cs, d, fraction)
    assert tm.max_branch == (2, 1, 2, 2, 1)
    assert tm.nodes_per_level == (1, 2, 2, 3, 4, 4)
    # dense levels take the sparse path iff asked to; CSR levels always propose candidates
    assert [tm.proposes_candidates(lv) for lv in range(5)] == [lv >= d or fraction > 0 for lv in range(5)]
    # walk every SID of the space's relevant prefixes through the mask backend: exactly GOLDEN survive
    sm = StaticMask(tm)
    assert _enumerate(sm, tm.codebook_sizes) == sorted(GOLDEN)
    assert _enumerate_candidates(sm, tm.codebook_sizes) == sorted(GOLDEN)


def _enumerate(sm, sizes):
    """All SIDs reachable through the mask backend (a DFS using only mask/advance)."""
    out = []
    state = sm.init_state(1, torch.device("cpu"))
    frontier = [((), state)]
    for level in range(len(sizes)):
        nxt = []
        for prefix, st_ in frontier:
            allowed, aux = sm.mask(level, st_)
            for tok in torch.nonzero(allowed[0])[:, 0].tolist():
                if level + 1 < len(sizes):
                    new = sm.advance(level, st_, aux, torch.zeros(1, dtype=torch.long), torch.tensor([tok]))
                    nxt.append((prefix + (tok,), new))
                else:
                    out.append(prefix + (tok,))
        frontier = nxt
    return sorted(out)


def _enumerate_candidates(sm, sizes):
    """All SIDs reachable through the sparse path: every row at once, `candidates` where the level
    proposes them (else the dense `apply`), and the advance by picked slot (or by token when dense)."""
    dev = torch.device("cpu")
    prefixes, state = [()], sm.init_state(1, dev)
    for level, size in enumerate(sizes):
        lp = torch.zeros(len(prefixes), size)
        found = sm.candidates(level, state, lp)
        if found is None:
            masked, aux = sm.apply(level, state, lp)
            row, tok = torch.nonzero(torch.isfinite(masked), as_tuple=True)
            pick = None
        else:
            cand, codes, aux = found
            row, slot = torch.nonzero(torch.isfinite(cand), as_tuple=True)
            tok, pick = codes[row, slot].long(), row * cand.shape[1] + slot
        new = [prefixes[r] + (t,) for r, t in zip(row.tolist(), tok.tolist())]
        if level + 1 < len(sizes) and new:
            state = sm.advance(level, state, aux, row, tok, pick)
        prefixes = new
    return sorted(prefixes)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 5), min_size=2, max_size=5, unique=True),
    data=st.data(),
)
def test_trie_walk_finds_exactly_the_set_for_every_d(sizes, data):
    """Every d < L, on unequal codebooks (a wrong multiplier in a dense level's state advance shows from
    d = 3), each dense level on either path, through the dense mask and through sparse candidates."""
    space = list(itertools.product(*(range(t) for t in sizes)))
    chosen = data.draw(st.lists(st.sampled_from(space), min_size=1, max_size=24))
    fraction = data.draw(st.sampled_from([0.0, 0.5, 1.0]))
    cs = ConstraintSet.from_codes("h", tuple(sizes), chosen)
    for d in range(len(sizes)):
        tm = build_transition_matrix(cs, d, fraction)
        sm = StaticMask(tm)
        assert _enumerate(sm, tuple(sizes)) == sorted(set(chosen))
        assert _enumerate_candidates(sm, tuple(sizes)) == sorted(set(chosen))
        # max branch factor = the most children of any node per level
        for level in range(len(sizes)):
            kids: dict[tuple, set] = {}
            for sid in set(chosen):
                kids.setdefault(sid[:level], set()).add(sid[level])
            assert tm.max_branch[level] == max(len(v) for v in kids.values())


def _trie_children(allowed) -> dict[tuple, set]:
    """The dict trie of a set of SIDs: prefix -> its children's codes."""
    children: dict[tuple, set] = {}
    for sid in allowed:
        for t in range(len(sid)):
            children.setdefault(tuple(sid[:t]), set()).add(int(sid[t]))
    return children


def _trie_beam(log_probs, allowed, width, user, children=None):
    """Constrained beam search of one user over fixed per-level log-probs ([B*w, T] per level, w = 1 at
    level 0) with a dict trie (of `allowed`, or the given `children`): [(sid, score)] best first."""
    children = _trie_children(allowed) if children is None else children
    beams = [((), 0.0)]
    for level, lp in enumerate(log_probs):
        rows = user if level == 0 else user * width
        cands = [
            (prefix + (tok,), score + float(lp[rows + i, tok]))
            for i, (prefix, score) in enumerate(beams)
            for tok in sorted(children.get(prefix, ()))
        ]
        cands.sort(key=lambda c: -c[1])
        beams = cands[:width]
    return beams


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(2, 6), min_size=2, max_size=4, unique=True), data=st.data())
def test_sparse_and_dense_steps_decode_exactly_the_python_trie(sizes, data):
    """Through the beam core on fixed logits: sparse candidates (auto paths), the dense kernel on every
    level, and a Python trie walk return the same SIDs with the same scores, for every d and path."""
    from genrec.studies.static.static_decode import synthetic_decode

    space = list(itertools.product(*(range(t) for t in sizes)))
    allowed = sorted(set(data.draw(st.lists(st.sampled_from(space), min_size=1, max_size=30))))
    width = data.draw(st.integers(1, 8))
    d = data.draw(st.integers(0, len(sizes) - 1))
    fraction = data.draw(st.sampled_from([0.0, 0.5, 1.0]))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 10_000)))
    batch = 2
    logits = [
        torch.randn(batch if lv == 0 else batch * width, t, generator=gen) * 3 for lv, t in enumerate(sizes)
    ]
    sm = StaticMask(
        build_transition_matrix(ConstraintSet.from_codes("p", tuple(sizes), allowed), d, fraction)
    )
    sparse = synthetic_decode(sm, logits, batch, width)
    dense = synthetic_decode(sm, logits, batch, width, dense=True)
    assert torch.equal(sparse.scores, dense.scores)
    found = torch.isfinite(sparse.scores)
    assert torch.equal(sparse.codes[found], dense.codes[found])
    lps = [torch.log_softmax(x, dim=-1) for x in logits]
    for u in range(batch):
        ref = _trie_beam(lps, allowed, width, u)
        assert int(found[u].sum()) == len(ref)
        assert [tuple(c) for c in sparse.codes[u, : len(ref)].tolist()] == [sid for sid, _ in ref]
        np.testing.assert_allclose(sparse.scores[u, : len(ref)].numpy(), [sc for _, sc in ref], rtol=1e-5)


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_padding_beams_leave_the_trie_after_the_last_dense_level(fraction):
    """Fewer valid SIDs than beams: the padding beams' child-table slot at the last dense level is no
    child. They must go to the sink, not to a node of a later level whose edges hold codes beyond this
    level's codebook (the dense [R, T] form then read out of range; found by the property test
    above: sizes (2, 5, 4, 6), one SID, d = 2)."""
    from genrec.studies.static.static_decode import synthetic_decode

    sizes, batch, width = (2, 5, 4, 6), 2, 2
    gen = torch.Generator().manual_seed(0)
    logits = [
        torch.randn(batch if lv == 0 else batch * width, t, generator=gen) * 3 for lv, t in enumerate(sizes)
    ]
    tm = build_transition_matrix(ConstraintSet.from_codes("one", sizes, [(0, 4, 0, 4)]), 2, fraction)
    for dense in (False, True):
        out = synthetic_decode(StaticMask(tm), logits, batch, width, dense=dense)
        assert out.codes[:, 0].tolist() == [[0, 4, 0, 4]] * batch
        assert torch.isfinite(out.scores[:, 0]).all() and torch.isinf(out.scores[:, 1]).all()


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(2, 5), min_size=2, max_size=4, unique=True), data=st.data())
def test_chained_constraints_decode_the_intersection(sizes, data):
    """Three STATIC processors in a row (the first proposes candidates, the second makes them dense, the
    third proposes again): the search is the trie walk where a code is allowed iff every set allows it
    after the prefix (per level, as the masks compose; not the set intersection)."""
    from genrec.studies.static.static_decode import ReplayScorer
    from genrec.workloads.decoding.beam_core import run_beam_search
    from genrec.workloads.decoding.processors import ConstraintProcessor

    space = list(itertools.product(*(range(t) for t in sizes)))
    sets = [set(data.draw(st.lists(st.sampled_from(space), min_size=1, max_size=40))) for _ in range(3)]
    width = data.draw(st.integers(1, 6))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 10_000)))
    logits = [torch.randn(1 if lv == 0 else width, t, generator=gen) * 3 for lv, t in enumerate(sizes)]
    procs = [
        ConstraintProcessor(
            StaticMask(build_transition_matrix(ConstraintSet.from_codes("c", tuple(sizes), sorted(c)), d))
        )
        for d, c in zip((0, len(sizes) - 1, 1), sets)
    ]
    out = run_beam_search(ReplayScorer(logits), procs, 1, width, len(sizes), torch.device("cpu"))
    tries = [_trie_children(c) for c in sets]
    both = {p: set.intersection(*(t.get(p, set()) for t in tries)) for p in tries[0]}
    ref = _trie_beam([torch.log_softmax(x, -1) for x in logits], None, width, 0, both)
    found = torch.isfinite(out.scores[0])
    assert int(found.sum()) == len(ref)
    assert [tuple(c) for c in out.codes[0, : len(ref)].tolist()] == [sid for sid, _ in ref]


def test_candidates_equal_the_dense_kernel_at_every_level():
    """Each level's sparse candidates, made dense, are bit for bit the fused dense kernel's output, on
    states of the level, the sink and padding, with unequal codebooks (reads past a node clamp)."""
    from genrec.kernels.constrained_mask_torch import dense_from_candidates

    sizes = (7, 3, 9, 4, 6)
    cs = uniform_random(sizes, 300, seed=1)
    gen = torch.Generator().manual_seed(0)
    for d, fraction in itertools.product(range(len(sizes)), (0.0, 1.0)):
        tm = build_transition_matrix(cs, d, fraction)
        sm, bias_path = StaticMask(tm), StaticMask(build_transition_matrix(cs, d, 0.0))
        bases = [*tm.level_base, tm.num_states]
        for level in range(len(sizes)):
            if level >= d:
                lo, hi = bases[level - d], bases[level - d + 1]
                states = torch.cat([torch.randint(lo, hi, (13,), generator=gen), torch.tensor([0])]).int()
            else:
                states = torch.randint(0, math.prod(sizes[:level]), (14,), generator=gen)
            full = torch.log_softmax(torch.randn(len(states), sizes[level] + 5, generator=gen), -1)
            lp = full[:, 2 : 2 + sizes[level]]  # a row-strided slice, as decoders pass it
            found = sm.candidates(level, states, lp)
            assert (found is None) == (level < d and fraction == 0.0)
            if found is None:
                continue
            cand, codes, _ = found
            assert int(codes.max()) < sizes[level]  # every code indexes the level's log-probs
            dense = (
                bias_path.apply(level, states, lp)[0]
                if level < d
                else vntk_apply(lp, states, tm.row_ptr, tm.edges, tm.max_branch[level])[0]
            )
            assert torch.equal(dense_from_candidates(cand, codes, sizes[level]), dense)


def test_dense_levels_refused_with_reason():
    cs = uniform_random((2048,) * 4, 100)
    with pytest.raises(ConstraintError, match="d <= 2"):
        build_transition_matrix(cs, 3)
    with pytest.raises(ConstraintError, match="0 <= d < L"):
        build_transition_matrix(ConstraintSet.from_codes("g", (10,) * 5, GOLDEN), 5)


def test_memory_within_paper_u_max():
    for d in (0, 1, 2):
        cs = uniform_random((64,) * 6, 20_000, seed=d)
        tm = build_transition_matrix(cs, d)
        mem = tm.memory_bytes()["total"]
        assert mem <= tm.u_max_bytes(), (d, mem, tm.u_max_bytes())


# --- decoder -----------------------------------------------------------------------------------
def test_golden_example_decodes_exactly_the_set():
    ctx = make_ctx((10,) * 5, seed=0, item_codes=np.array(GOLDEN + [(9, 9, 9, 9, 9), (0, 1, 2, 3, 4)]))
    ctx.constraints.register(ConstraintSet.from_codes("golden", ctx.codec, GOLDEN))
    dec = get_decoder("static")
    for d in (0, 1, 2):
        res = dec.decode(
            ctx,
            [[0], [4, 5]],
            make_params(dec, {"beam_width": 6, "k": 6, "constraint": "golden", "dense_levels": d}),
        )
        for b in range(2):
            got = [tuple(c) for c, ok in zip(res.codes[b].tolist(), res.valid[b].tolist()) if ok]
            assert sorted(got) == sorted(GOLDEN)
            assert res.codes[b, 4:].eq(-1).all() and torch.isinf(res.scores[b, 4:]).all()
            assert res.item_ids[b, 4:].eq(-1).all()
        assert res.counters["missing"] == 4


@settings(max_examples=15, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 4), min_size=2, max_size=3),
    seed=st.integers(0, 10_000),
    width=st.integers(1, 6),
    d=st.integers(0, 2),
    n_allowed=st.integers(1, 10),
)
def test_static_equals_brute_force_constrained_beam(sizes, seed, width, d, n_allowed):
    ctx = make_ctx(sizes, seed)
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(ctx.item_codes), size=min(n_allowed, len(ctx.item_codes)), replace=False)
    allowed = [tuple(r) for r in ctx.item_codes[pick].tolist()]
    ctx.constraints.register(ConstraintSet.from_codes("sub", ctx.codec, allowed))
    dec = get_decoder("static")
    k = width
    histories = [list(rng.integers(0, len(ctx.item_codes), size=rng.integers(1, 4))) for _ in range(2)]
    res = dec.decode(
        ctx,
        histories,
        make_params(dec, {"beam_width": width, "k": k, "constraint": "sub", "dense_levels": d}),
    )
    for b, h in enumerate(histories):
        ref = brute_force_beam(ctx, h, allowed, width)[:k]
        n = len(ref)
        assert res.valid[b, :n].all() and not res.valid[b, n:].any()
        assert torch.isinf(res.scores[b, n:]).all()
        ref_scores = torch.tensor([s for _, s in ref])
        torch.testing.assert_close(res.scores[b, :n], ref_scores, atol=1e-4, rtol=1e-4)
        for j in range(n):
            got = tuple(res.codes[b, j].tolist())
            assert got in allowed
            if got != ref[j][0]:  # only a tie may swap SIDs
                assert any(abs(s - ref_scores[j]) < 1e-4 and sid == got for sid, s in ref)


def test_static_all_items_matches_beam_when_unconstraining():
    """With every SID of the space allowed, static = plain beam search."""
    codec = SIDCodec((3, 3, 3))
    ctx = make_ctx((3, 3, 3), seed=2, item_codes=codec.keys_to_codes(np.arange(27)))
    beam, static = get_decoder("beam"), get_decoder("static")
    a = beam.decode(ctx, [[1, 2]], make_params(beam, {"beam_width": 5, "k": 5}))
    b = static.decode(ctx, [[1, 2]], make_params(static, {"beam_width": 5, "k": 5}))
    assert torch.equal(a.codes, b.codes)
    torch.testing.assert_close(a.scores, b.scores)


def test_static_rules_params_and_errors():
    ctx = make_ctx((4, 4, 4), seed=1)
    dec = get_decoder("static")
    res = dec.decode(ctx, [[0]], make_params(dec, {"beam_width": 8, "k": 8, "constraint": "cold_start"}))
    cold = {tuple(c) for c in ctx.item_codes[ctx.popularity == 0].tolist()}
    assert {tuple(c) for c, ok in zip(res.codes[0].tolist(), res.valid[0].tolist()) if ok} <= cold
    res = dec.decode(
        ctx,
        [[0]],
        make_params(
            dec, {"beam_width": 4, "k": 4, "constraint": "random", "constraint_size": 3, "dense_levels": 3}
        ),
    )
    assert res.valid[0].sum() == 3 and "decode_mask" in res.timings_ms
    with pytest.raises(UserInputError, match="constraint_size"):
        make_params(dec, {"constraint": "random"})
    with pytest.raises(UserInputError, match="unknown constraint"):
        dec.decode(ctx, [[0]], make_params(dec, {"constraint": "nope", "k": 2, "beam_width": 2}))
    with pytest.raises(UserInputError, match="kernel"):
        make_params(dec, {"kernel": "cuda"})


@pytest.mark.parametrize("backend", ["cpu_trie", "ppv_exact", "ppv_approx", "hash_bitmap"])
def test_baseline_backends_decode_like_static(backend):
    ctx = make_ctx((6, 6, 6), seed=4)
    dec = get_decoder("static")
    base = {"beam_width": 5, "k": 5, "constraint": "random", "constraint_size": 20, "dense_levels": 1}
    ref = dec.decode(ctx, [[0, 1], [3]], make_params(dec, base))
    res = dec.decode(ctx, [[0, 1], [3]], make_params(dec, {**base, "backend": backend}))
    cset = ctx.constraints.constraint_set(make_params(dec, base))
    if backend in ("cpu_trie", "ppv_exact"):  # exact backends: identical search
        assert torch.equal(res.codes, ref.codes) and torch.equal(res.scores, ref.scores)
    elif backend == "ppv_approx":  # top-50 >= T here, so also exact
        assert torch.equal(res.codes, ref.codes)
    finite = torch.isfinite(res.scores).reshape(-1)
    found = res.codes.reshape(-1, 3)[finite].numpy()
    in_set = cset.contains(found)
    if backend != "hash_bitmap":
        assert in_set.all()
        return
    # hash bitmap: it has no false negatives, so each SID it returns is in the set or is one of its
    # false positives (passes the bitmap at every level, fails the exact trie), and SIDs it shares with
    # STATIC score the same (scores are the model's, whatever the mask). With the store's bitmap and
    # with a tiny one, where false positives must show up and are counted.
    exact = StaticMask(build_transition_matrix(cset, 0))
    tiny = HashBitmap(cset, bits_per_prefix=1)
    small = backbone_beam_search(ctx, [[0, 1], [3]], BeamParams(k=5, beam_width=5), tiny)
    default = ctx.constraints.mask_backend(make_params(dec, base), ctx.device, 1, "hash_bitmap")
    false_positives = []
    for result, bitmap in ((res, default), (small, tiny)):
        for u in range(result.codes.shape[0]):
            static_scores = {tuple(c): sc for c, sc in zip(ref.codes[u].tolist(), ref.scores[u].tolist())}
            returned = [
                (tuple(c), sc)
                for c, sc in zip(result.codes[u].tolist(), result.scores[u].tolist())
                if sc > -math.inf
            ]
            for sid, sc in returned:
                assert _passes_every_level(bitmap, sid)
                assert _passes_every_level(exact, sid) == bool(cset.contains(np.asarray([sid]))[0])
                if sid in static_scores:
                    assert sc == pytest.approx(static_scores[sid], abs=1e-5)
        found_sids = result.codes.reshape(-1, 3)[torch.isfinite(result.scores).reshape(-1)].numpy()
        false_positives.append(int((~cset.contains(found_sids)).sum()))
    assert false_positives[0] == int((~in_set).sum()) and false_positives[1] > 0


def _passes_every_level(backend, sid) -> bool:
    """Whether the backend's mask allows each code of `sid` after its prefix (one beam, walked alone)."""
    state = backend.init_state(1, torch.device("cpu"))
    for level, code in enumerate(sid):
        allowed, aux = backend.mask(level, state)
        if not bool(allowed[0, code]):
            return False
        if level + 1 < len(sid):
            state = backend.advance(level, state, aux, torch.zeros(1, dtype=torch.long), torch.tensor([code]))
    return True


def test_hash_bitmap_false_positives_are_measured():
    cs = uniform_random((512, 64, 64), 200, seed=0)
    hb = HashBitmap(cs, bits_per_prefix=2)  # a small bitmap: false positives must show up
    sm = StaticMask(build_transition_matrix(cs, 0))
    m_hash, _ = hb.mask(0, hb.init_state(1, torch.device("cpu")))
    m_true, _ = sm.mask(0, sm.init_state(1, torch.device("cpu")))
    assert (m_hash | ~m_true).all()  # no false negatives
    fp = (m_hash & ~m_true).sum() / (~m_true).sum()
    assert 0 < fp < 1


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 10_000), d=st.integers(0, 2), width=st.integers(1, 6))
def test_live_updates_decode_like_a_rebuilt_index(seed, d, width):
    ctx = make_ctx((4, 4, 4), seed=seed)
    rng = np.random.default_rng(seed)
    items = ctx.item_codes
    base_rows = rng.choice(len(items), size=len(items) // 2, replace=False)
    live = LiveStaticMask(ConstraintSet.from_codes("live", ctx.codec, items[base_rows]), dense_levels=d)
    current = {tuple(r) for r in items[base_rows].tolist()}
    for _ in range(2):
        rem = items[rng.choice(len(items), size=4, replace=False)]
        add = items[rng.choice(len(items), size=4, replace=False)]
        live.remove(rem)
        live.add(add)
        current = (current - {tuple(r) for r in rem.tolist()}) | {tuple(r) for r in add.tolist()}
        assert {tuple(r) for r in live.current_codes().tolist()} == current
        rebuilt = StaticMask(
            build_transition_matrix(ConstraintSet.from_codes("r", ctx.codec, sorted(current)), d)
        )
        hist = [[0, 1], [2]]
        a = backbone_beam_search(ctx, hist, BeamParams(k=width, beam_width=width), live)
        b = backbone_beam_search(ctx, hist, BeamParams(k=width, beam_width=width), rebuilt)
        assert torch.equal(a.codes, b.codes) and torch.equal(a.scores, b.scores)
    live.merge()
    assert {tuple(r) for r in live.current_codes().tolist()} == current and not live.delta


def test_static_step_benchmark_smoke(tmp_path):
    from genrec.studies.static.static_step import main

    out = tmp_path / "b.json"
    argv = [
        "--device",
        "cpu",
        "--vocab",
        "16",
        "--levels",
        "3",
        "--sizes",
        "60",
        "--beam",
        "3",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--live-updates",
        "5",
        "--dense-levels",
        "1",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    res = json.loads(out.read_text())["results"][0]
    rows = {r["backend"]: r for r in res["rows"]}
    assert rows["static_torch"]["compliance"] == 1.0 and rows["ppv_exact"]["compliance"] == 1.0
    assert rows["static_dense"]["compliance"] == 1.0
    assert res["within_u_max"] and res["live_updates"]["updates"] == 10
    # the per-level split: both STATIC paths, every level, and which path each level took
    for name in ("static_torch", "static_dense"):
        row = rows[name]
        assert len(row["level_ms"]) == len(row["mask_ms"]) == len(row["paths"]) == 3
        assert all(m <= p for m, p in zip(row["mask_ms"], row["processor_ms"]))
    assert (
        rows["static_dense"]["paths"] == ["dense"] * 3 and rows["static_torch"]["paths"][1:] == ["sparse"] * 2
    )
    assert rows["static_torch"]["returned"] == rows["static_dense"]["returned"]


def test_static_ratios_compare_whole_steps_and_overheads_over_unconstrained():
    from genrec.studies.static.static_step import add_static_ratios, summary_table

    def row(backend, step, base=1.0):
        return {"backend": backend, "step_ms_median": step, "overhead_ms": step - base}

    rows = [row("unconstrained", 1.0), row("static_torch", 1.5), row("cpu_trie", 3.0), row("ppv_exact", 11.0)]
    add_static_ratios(rows)
    by = {r["backend"]: r for r in rows}
    assert by["cpu_trie"]["speedup_of_static_torch"] == pytest.approx(2.0)
    assert by["cpu_trie"]["overhead_vs_static_torch"] == pytest.approx(4.0)  # 2.0 / 0.5 ms
    assert by["ppv_exact"]["overhead_vs_static_torch"] == pytest.approx(20.0)
    assert "overhead_vs_static_torch" not in by["unconstrained"]
    assert "20.0x" in summary_table([{"set_size": 10, "rows": rows}])


def test_first_seen_rank_orders_items_by_first_interaction():
    import pandas as pd

    from genrec.workloads.constraints.sets import first_seen_rank

    class FakeDataset:
        num_items = 4
        interactions = pd.DataFrame(
            {
                "user_id": [0, 0, 1, 1],
                "item_id": [0, 1, 1, 2],
                "position": [0, 1, 1, 2],
                "split": ["train", "test", "train", "valid"],
            }
        )

    rank = first_seen_rank(FakeDataset())
    assert rank[0] < rank[1] < rank[2] and np.isinf(rank[3])  # item 3 never seen: newest
