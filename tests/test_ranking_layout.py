"""Feature reorganisation is lossless: permuted columns with remapped weight rows give X @ W, and
MaRI over the fragmented and the neat layout both equal the vanilla MatMul."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.ranking.layout import (
    Chunk,
    FeatureLayout,
    chunk_inputs,
    fragmented_layout,
    mari_chunked,
    reorganize,
    reorganize_linear_weight,
)


@settings(max_examples=40, deadline=None)
@given(
    du=st.integers(1, 40),
    di=st.integers(1, 40),
    dc=st.integers(0, 20),
    chunk=st.integers(1, 16),
    b=st.integers(1, 7),
    d=st.integers(1, 9),
    seed=st.integers(0, 999),
)
def test_reorganisation_is_lossless(du, di, dc, chunk, b, d, seed):
    layout = fragmented_layout(du, di, dc, chunk)
    assert layout.width == du + di + dc
    p = layout.neat_permutation()
    assert sorted(p.tolist()) == list(range(layout.width))
    g = torch.Generator().manual_seed(seed)
    x, w = (
        torch.randn(b, layout.width, generator=g, dtype=torch.float64),
        torch.randn(layout.width, d, generator=g, dtype=torch.float64),
    )
    xn, wn = reorganize(x, w, layout)
    torch.testing.assert_close(xn @ wn, x @ w)
    # the neat order really is [user | item | cross]
    kinds = [c.kind for c in layout.chunks for _ in range(c.width)]
    assert [kinds[i] for i in p.tolist()] == ["user"] * du + ["item"] * di + ["cross"] * dc
    lin = torch.nn.Linear(layout.width, d).double()
    torch.testing.assert_close(x[:, p] @ reorganize_linear_weight(lin.weight, layout).T, x @ lin.weight.T)


@settings(max_examples=30, deadline=None)
@given(
    du=st.integers(1, 30),
    di=st.integers(1, 30),
    dc=st.integers(0, 10),
    chunk=st.integers(1, 8),
    b=st.integers(1, 6),
    seed=st.integers(0, 999),
)
def test_fragmented_and_neat_mari_equal_vanilla(du, di, dc, chunk, b, seed):
    g = torch.Generator().manual_seed(seed)
    layout = fragmented_layout(du, di, dc, chunk)
    d = 5
    w, bias = torch.randn(layout.width, d, generator=g), torch.randn(d, generator=g)
    is_user = torch.tensor([c.kind == "user" for c in layout.chunks for _ in range(c.width)])
    user = torch.randn(1, layout.width, generator=g) * is_user
    cand = torch.randn(b, layout.width, generator=g) * ~is_user
    vanilla = torch.addmm(bias, torch.where(is_user, user.expand(b, -1), cand), w)
    frag = mari_chunked(*chunk_inputs(user, cand, w, layout), bias)
    p = layout.neat_permutation()
    neat = mari_chunked(*chunk_inputs(user[:, p], cand[:, p], w[p], layout.neat()), bias)
    torch.testing.assert_close(frag, vanilla, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(neat, vanilla, rtol=1e-4, atol=1e-4)
    assert len(layout.neat().chunks) == 2 + (dc > 0)


def test_fragmented_layout_interleaves_kinds():
    layout = fragmented_layout(100, 60, 40, 50)
    assert [c.kind for c in layout.chunks][:3] == ["user", "cross", "item"]
    assert FeatureLayout((Chunk("user", 3),)).neat_permutation().tolist() == [0, 1, 2]
