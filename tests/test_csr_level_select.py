"""The one-launch CSR level select (Triton, under the interpreter on CPU machines) equals its torch
reference and the beam core's sparse path: random constraint sets with unequal codebooks and every
d < L, padding beams, forced ties, beam widths above the candidate count, several candidate chunks."""

from __future__ import annotations

import itertools
import os
from unittest import mock

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

triton = pytest.importorskip(
    "triton", reason="triton is not installed (pip install triton; CPU uses the interpreter)"
)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from genrec.kernels import csr_level_select as cls  # noqa: E402
from genrec.kernels.constrained_mask_torch import csr_level_select as csr_level_select_torch  # noqa: E402
from genrec.studies.static.static_decode import synthetic_decode  # noqa: E402
from genrec.workloads.constraints.sets import ConstraintSet  # noqa: E402
from genrec.workloads.constraints.transition import build_transition_matrix  # noqa: E402
from genrec.workloads.constraints.vntk import StaticMask  # noqa: E402
from genrec.workloads.decoding.beam_core import replay_processors, run_beam_search  # noqa: E402
from genrec.workloads.decoding.processors import ConstraintProcessor  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NEG_INF = float("-inf")


def level_states(tm, level: int, rows: int, rng: np.random.Generator) -> torch.Tensor:
    """Random CSR states of `level` (repeats, like beams sharing a prefix), some of them the sink."""
    bases = [*tm.level_base, tm.num_states]
    lo, hi = bases[level - tm.dense_levels], bases[level - tm.dense_levels + 1]
    states = rng.integers(lo, hi, size=rows)
    states[rng.random(rows) < 0.15] = 0
    return torch.as_tensor(states, dtype=torch.int32)


def tied(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """Values rounded to quarters on a random half of the entries: many exact repeats (ties)."""
    keep = torch.as_tensor(rng.random(x.shape) < 0.5)
    return torch.where(keep, x, torch.round(x * 4) / 4)


def children(tm, state: int) -> dict[int, int]:
    """token -> next state of a CSR state (the row lookup)."""
    lo, hi = int(tm.row_ptr[state]), int(tm.row_ptr[state + 1])
    return {int(t): int(n) for t, n in tm.edges[lo:hi].tolist()}


def check_outputs(tm, lp, scores, states, out, exact=True):
    """Every finite output is a distinct real child with its edge's next state and the right score;
    -inf outputs are (parent 0, code 0, sink)."""
    best, parent, code, nxt = (x.cpu() for x in out)
    batch, w = scores.shape
    lp, scores, states = lp.cpu(), scores.cpu(), states.cpu()
    for b in range(batch):
        seen = set()
        for k in range(best.shape[1]):
            j, c, s = int(parent[b, k]), int(code[b, k]), int(nxt[b * best.shape[1] + k])
            if not torch.isfinite(best[b, k]):
                assert (j, c, s) == (0, 0, 0)
                continue
            kids = children(tm, int(states[b * w + j]))
            assert c in kids and kids[c] == s and (j, c) not in seen
            seen.add((j, c))
            value = scores[b, j] + lp[b * w + j, c]
            if exact:
                assert best[b, k] == value
            else:
                torch.testing.assert_close(best[b, k], value, rtol=1e-5, atol=1e-5)


def above_kth(out, beam_width: int) -> list[set]:
    """Per user, the (parent, code) of outputs scoring strictly above the user's W-th score: the part of
    the top W that no tie can change."""
    best, parent, code, _ = (x.cpu() for x in out)
    return [
        {(int(parent[b, k]), int(code[b, k])) for k in range(beam_width) if best[b, k] > best[b, -1]}
        for b in range(best.shape[0])
    ]


@st.composite
def level_case(draw):
    sizes = tuple(draw(st.lists(st.integers(2, 6), min_size=2, max_size=4, unique=True)))
    space = list(itertools.product(*(range(t) for t in sizes)))
    chosen = draw(st.lists(st.sampled_from(space), min_size=1, max_size=40))
    d = draw(st.integers(0, len(sizes) - 1))
    level = draw(st.integers(d, len(sizes) - 1))
    batch = draw(st.integers(1, 3))
    w = 1 if level == 0 else draw(st.integers(1, 8))
    beam_width = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**16))
    return sizes, chosen, d, level, batch, w, beam_width, seed


def make_inputs(sizes, chosen, d, level, batch, w, seed):
    tm = build_transition_matrix(ConstraintSet.from_codes("p", sizes, chosen), d)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    lp = tied(torch.log_softmax(torch.randn(batch * w, sizes[level], generator=gen) * 2, -1), rng)
    scores = tied(torch.randn(batch, w, generator=gen), rng)
    scores[torch.as_tensor(rng.random((batch, w)) < 0.2)] = NEG_INF  # padding beams
    states = level_states(tm, level, batch * w, rng)
    return tm, lp, scores, states


@settings(max_examples=40, deadline=None)
@given(case=level_case(), small_chunks=st.booleans())
def test_level_select_equals_the_torch_reference(case, small_chunks):
    """Same scores bit for bit (sorted), the same beams above each user's W-th score, valid children
    with their next states; `small_chunks` reads 4 candidates at a time (many running top-W merges)."""
    sizes, chosen, d, level, batch, w, beam_width, seed = case
    tm, lp, scores, states = make_inputs(sizes, chosen, d, level, batch, w, seed)
    args = (lp, scores, states, tm.row_ptr, tm.edges, tm.max_branch[level], beam_width)
    ref = csr_level_select_torch(*args)
    small = {"MAX_CHUNK": 4, "MIN_LANES": 2} if small_chunks else {"MAX_CHUNK": cls.MAX_CHUNK}
    with mock.patch.multiple(cls, **small):
        tm_dev = tm.to(DEVICE)
        dev_args = (lp, scores, states, tm_dev.row_ptr, tm_dev.edges)
        got = cls.csr_level_select_triton(*(x.to(DEVICE) for x in dev_args), *args[5:])
    assert torch.equal(got[0].cpu().sort(dim=1).values, ref[0].sort(dim=1).values)
    assert above_kth(got, beam_width) == above_kth(ref, beam_width)
    check_outputs(tm, lp, scores, states, got)
    check_outputs(tm, lp, scores, states, ref)


@settings(max_examples=15, deadline=None)
@given(case=level_case())
def test_fused_log_softmax_matches_up_to_rounding(case):
    sizes, chosen, d, level, batch, w, beam_width, seed = case
    tm, _, scores, states = make_inputs(sizes, chosen, d, level, batch, w, seed)
    logits = torch.randn(batch * w, sizes[level], generator=torch.Generator().manual_seed(seed)) * 3
    args = (logits, scores, states, tm.row_ptr, tm.edges, tm.max_branch[level], beam_width)
    ref = csr_level_select_torch(*args, logits=True)
    tm_dev = tm.to(DEVICE)
    dev = (logits.to(DEVICE), scores.to(DEVICE), states.to(DEVICE), tm_dev.row_ptr, tm_dev.edges)
    got = cls.csr_level_select_triton(*dev, *args[5:], logits=True)
    torch.testing.assert_close(got[0].cpu().sort(dim=1).values, ref[0].sort(dim=1).values)
    check_outputs(tm, torch.log_softmax(logits, -1), scores, states, got, exact=False)


def test_wide_root_spans_several_chunks():
    # one root with 1500 children (d = 0, level 0): w * B_0 = 1500 > MAX_CHUNK candidates per user
    cs = ConstraintSet.from_codes("wide", (4096, 2), [(i, i % 2) for i in range(0, 3000, 2)])
    tm = build_transition_matrix(cs, 0).to(DEVICE)
    lp = torch.log_softmax(torch.randn(2, 4096, generator=torch.Generator().manual_seed(1)), -1).to(DEVICE)
    scores = torch.tensor([[0.0], [NEG_INF]], device=DEVICE)
    states = torch.tensor([1, 1], dtype=torch.int32, device=DEVICE)
    args = (lp, scores, states, tm.row_ptr, tm.edges, tm.max_branch[0], 70)
    got, ref = cls.csr_level_select_triton(*args), csr_level_select_torch(*args)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)  # random log-probs: no ties, so even the order agrees
    assert torch.isinf(got[0][1]).all() and not got[3][70:].any()


def test_refuses_without_cuda_or_interpreter_and_wide_beams():
    with mock.patch.object(cls, "_INTERPRETED", False):
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            cls.triton_runs_on(torch.device("cpu"))
    cls.triton_runs_on(torch.device("cuda"))  # no error: the check is about where it can run
    tm = build_transition_matrix(ConstraintSet.from_codes("g", (3, 3), [(0, 1), (2, 2)]), 0)
    lp, scores, states = torch.zeros(1, 3), torch.zeros(1, 1), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="beam width"):
        cls.csr_level_select_triton(lp, scores, states, tm.row_ptr, tm.edges, 2, cls.MAX_BEAM + 1)
    # the benchmark arm refuses before building anything, naming the fix
    from genrec.studies.static.static_level_select import level_select_unavailable

    with mock.patch.dict(os.environ, {"TRITON_INTERPRET": "0"}):
        assert "--device cuda" in level_select_unavailable("cpu")
    assert level_select_unavailable("cuda") is None


def kernel_decode(sm, logits, batch, width, fused_lse=False):
    """The beam core up to the last dense level, then every CSR level by the kernel: (codes, scores)."""
    tm, d = sm.tm, sm.tm.dense_levels
    procs = [ConstraintProcessor(sm)]
    dev = logits[0].device
    if d:
        out = run_beam_search(_Replay(logits), procs, batch, width, d, dev)
        codes, scores = out.codes, out.scores
        states = replay_processors(procs, codes, tm.codebook_sizes)[0].node
    else:
        codes = torch.zeros(batch, 1, 0, dtype=torch.long, device=dev)
        scores = torch.zeros(batch, 1, device=dev)
        states = sm.init_state(batch, dev)
    for level in range(d, tm.levels):
        lp = logits[level] if fused_lse else torch.log_softmax(logits[level], -1)
        scores, parent, code, states = cls.csr_level_select_triton(
            lp, scores, states, tm.row_ptr, tm.edges, tm.max_branch[level], width, logits=fused_lse
        )
        codes = torch.cat([codes.gather(1, parent[..., None].expand(-1, -1, level)), code[..., None]], 2)
    return codes, scores


class _Replay:
    """Fixed logits per level (the benchmark's ReplayScorer without its timing)."""

    def __init__(self, logits):
        self.logits = logits

    def level_log_probs(self, level):
        return torch.log_softmax(self.logits[level], -1)

    def advance(self, level, parent, token):
        return None


@pytest.mark.parametrize("d", [0, 1, 2])
def test_kernel_decode_returns_the_static_decoders_sids(d):
    """The beam core's static search (synthetic_decode: what the `static` decoder runs, on fixed logits)
    and the kernel driving every CSR level return the same SIDs and scores; fewer SIDs than beams
    leaves -inf padding in both."""
    sizes, batch, width = (5, 3, 6, 4), 2, 6
    rng = np.random.default_rng(d)
    space = np.array(list(itertools.product(*(range(t) for t in sizes))))
    cs = ConstraintSet.from_codes("t", sizes, space[rng.choice(len(space), 40, replace=False)])
    sm = StaticMask(build_transition_matrix(cs, d).to(DEVICE))
    gen = torch.Generator().manual_seed(d)
    logits = [
        (torch.randn(batch if lv == 0 else batch * width, t, generator=gen) * 3).to(DEVICE)
        for lv, t in enumerate(sizes)
    ]
    ref = synthetic_decode(sm, logits, batch, width)
    codes, scores = kernel_decode(sm, logits, batch, width)
    found = torch.isfinite(ref.scores)
    assert torch.equal(scores, ref.scores) and torch.equal(codes[found], ref.codes[found])
    codes, scores = kernel_decode(sm, logits, batch, width, fused_lse=True)
    torch.testing.assert_close(scores, ref.scores)
    assert torch.equal(codes[found], ref.codes[found])


def test_static_step_level_select_arm(tmp_path):
    import json

    from genrec.studies.static.static_step import main

    out = tmp_path / "s.json"
    argv = f"--device {DEVICE} --vocab 16 --levels 3 --sizes 300 --batch 2 --beam 4 --dense-levels 1 "
    argv += "--backends static_torch --repeats 1 --warmup 0 --threads 1 --level-select"
    assert main([*argv.split(), "--out", str(out)]) == 0
    (res,) = json.loads(out.read_text())["results"]
    rows = res["level_select_us"]
    assert [r["level"] for r in rows] == [1, 2]
    for r in rows:
        assert r["exact"] and r["triton_us_median"] > 0 and r["torch_us_median"] > 0
        assert r["triton_speedup"] == pytest.approx(r["torch_us_median"] / r["triton_us_median"])
        assert ("triton_graph_us_median" in r) == (DEVICE == "cuda")  # CUDA graphs only on CUDA
