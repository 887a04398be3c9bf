"""The Triton VNTK kernel equals the torch VNTK (under the Triton interpreter on CPU machines)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

triton = pytest.importorskip(
    "triton", reason="triton is not installed (pip install triton; CPU uses the interpreter)"
)

from genrec.kernels.constrained_mask import vntk_apply_triton, vntk_triton  # noqa: E402
from genrec.kernels.constrained_mask_torch import vntk as vntk_torch  # noqa: E402
from genrec.kernels.constrained_mask_torch import vntk_apply as vntk_apply_torch  # noqa: E402
from genrec.workloads.constraints.sets import ConstraintSet, uniform_random  # noqa: E402
from genrec.workloads.constraints.transition import build_transition_matrix  # noqa: E402
from genrec.workloads.constraints.vntk import StaticMask  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    "sizes, n, d", [((10,) * 5, 4, 0), ((8, 8, 8, 8), 300, 0), ((8, 8, 8, 8), 300, 2), ((40, 3, 3), 200, 0)]
)
def test_triton_vntk_equals_torch(sizes, n, d):
    if n == 4:
        cs = ConstraintSet.from_codes(
            "g", sizes, [(1, 2, 3, 4, 5), (1, 2, 3, 6, 7), (1, 2, 8, 9, 0), (2, 3, 4, 5, 6)]
        )
    else:
        cs = uniform_random(sizes, n, seed=n)
    tm = build_transition_matrix(cs, d).to(DEVICE)
    rng = np.random.default_rng(0)
    for level in range(d, len(sizes)):
        lo = tm.level_base[level - d]
        hi = tm.level_base[level - d + 1] if level - d + 1 < len(tm.level_base) else tm.num_states
        # states of this level plus the sink (0), in random order, repeated like beams
        states = torch.as_tensor(np.r_[rng.integers(lo, hi, size=13), 0], dtype=torch.int32, device=DEVICE)
        args = (states, tm.row_ptr, tm.edges, tm.max_branch[level], sizes[level])
        for a, b in zip(vntk_torch(*args), vntk_triton(*args)):
            assert torch.equal(a, b)
        # a level's slice of full-vocabulary log-probs: row-strided, as the decoder passes it
        full = torch.log_softmax(torch.randn(len(states), sizes[level] + 7, device=DEVICE), -1)
        lp = full[:, 3 : 3 + sizes[level]]
        apply_args = (lp, states, tm.row_ptr, tm.edges, tm.max_branch[level])
        for a, b in zip(vntk_apply_torch(*apply_args), vntk_apply_triton(*apply_args)):
            assert torch.equal(a, b)
        masked = vntk_apply_torch(*apply_args)[0]  # fused form = mask + masked fill
        torch.testing.assert_close(masked, lp.masked_fill(~vntk_torch(*args)[0], float("-inf")))


def test_triton_vntk_branch_wider_than_one_block():
    # one root with 2000 children: B_0 = 2000 > the kernel's 1024-lane block, so two blocks per row
    cs = ConstraintSet.from_codes("wide", (4096, 2), [(i, i % 2) for i in range(0, 4000, 2)])
    tm = build_transition_matrix(cs, 0).to(DEVICE)
    states = torch.tensor([1, 0, 1], dtype=torch.int32, device=DEVICE)
    args = (states, tm.row_ptr, tm.edges, tm.max_branch[0], 4096)
    for a, b in zip(vntk_torch(*args), vntk_triton(*args)):
        assert torch.equal(a, b)


def test_static_mask_with_triton_kernel_walks_the_same_trie():
    cs = uniform_random((6, 6, 6), 50, seed=3)
    tm = build_transition_matrix(cs, 1).to(DEVICE)
    ref, tri = StaticMask(tm, "torch"), StaticMask(tm, "triton")
    state = torch.tensor([0, 0], dtype=torch.int64, device=DEVICE)
    parents = torch.tensor([0, 1], device=DEVICE)
    m1, a1 = ref.mask(0, state)
    m2, a2 = tri.mask(0, state)
    assert torch.equal(m1, m2)
    tok = torch.nonzero(m1[0])[:2, 0]
    s1 = ref.advance(0, state, a1, parents, tok)
    s2 = tri.advance(0, state, a2, parents, tok)
    for level in (1, 2):
        m1, a1 = ref.mask(level, s1)
        m2, a2 = tri.mask(level, s2)
        assert torch.equal(m1, m2)
        if level == 1:
            tok = m1.float().argmax(1)
            s1 = ref.advance(level, s1, a1, parents, tok)
            s2 = tri.advance(level, s2, a2, parents, tok)
            assert torch.equal(s1, s2)
