"""The Triton staged attention equals the torch reference and plain attention over a per-beam-copied
cache (under the Triton interpreter on CPU machines): random shapes, left-padded prompts, beam widths
1..512, decoded lengths 0..L, single steps and tree-masked blocks, the indexed (in-place reorder) cache."""

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

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_extend import VOCAB, make_model, random_prompts  # noqa: E402
from test_shared_prefix_attention import plain_reference, random_case  # noqa: E402

from genrec.kernels import shared_prefix_attention as spa  # noqa: E402
from genrec.kernels import shared_prefix_attention_triton as tri  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(atol=1e-5, rtol=1e-4)


def on_device(case):
    return tuple(x.to(DEVICE) if isinstance(x, torch.Tensor) else x for x in case)


def check_case(case):
    case = on_device(case)
    got = tri.shared_prefix_attention(*case)
    torch.testing.assert_close(got, spa.shared_prefix_attention_torch(*case), **TOL)
    torch.testing.assert_close(got, plain_reference(*case), **TOL)


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 3),
    w=st.integers(1, 6),
    h=st.integers(1, 2),
    s=st.integers(1, 9),
    t=st.integers(0, 4),
    n=st.integers(1, 4),
    tree=st.booleans(),
    seed=st.integers(0, 10_000),
    groups=st.sampled_from([1, 2, 3]),
)
def test_triton_equals_torch_and_plain_attention(b, w, h, s, t, n, tree, seed, groups):
    """groups > 1: grouped-query attention (h key/value heads, h * groups query heads)."""
    check_case(random_case(seed, b, w, h, s, t, n, tree=tree, groups=groups))


@pytest.mark.parametrize(
    "b, w, h, s, t, n, hd, groups",
    [
        (1, 512, 1, 5, 3, 1, 2, 1),  # BW = 512: the shared stage's M dimension spans 8 program blocks
        (2, 3, 2, 70, 2, 1, 8, 1),  # a prompt longer than one key tile, ragged across users
        (2, 2, 1, 6, 1, 17, 4, 1),  # a block of 17 tokens: the unshared stage's tl.dot path
        (1, 2, 2, 4, 20, 2, 6, 1),  # 22 decoded keys: two key tiles in the unshared stage; hd not 2^k
        (1, 40, 2, 5, 2, 1, 4, 4),  # GQA, 4 query heads per key head: W * g = 160 rows, 3 M blocks
        (2, 2, 1, 6, 1, 5, 4, 4),  # GQA block: g * n = 20 query rows take the unshared stage's tl.dot
    ],
)
def test_triton_explicit_shapes(b, w, h, s, t, n, hd, groups):
    check_case(random_case(7, b, w, h, s, t, n, hd=hd, tree=n > 1, groups=groups))


def test_stages_return_the_torch_stages_output_and_lse():
    q, pk, pv, pmask, bk, bv, t, mask = on_device(random_case(3, 2, 3, 2, 7, 3, 2, tree=True))
    scaled = q / q.shape[-1] ** 0.5
    for got, ref in (
        (tri.prefix_stage(q, pk, pv, pmask), spa.prefix_stage(scaled, pk, pv, pmask)),
        (tri.beam_stage(q, bk, bv, t, mask), spa.beam_stage(scaled, bk, bv, t, mask)),
    ):
        torch.testing.assert_close(got[0], ref[0], **TOL)
        torch.testing.assert_close(got[1], ref[1], **TOL)
    out_a, lse_a = tri.prefix_stage(q, pk, pv, pmask)
    out_b, lse_b = tri.beam_stage(q, bk, bv, t, mask)
    torch.testing.assert_close(
        tri.merge_states(out_a, lse_a, out_b, lse_b), spa.merge_attention_states(out_a, lse_a, out_b, lse_b)
    )


@settings(max_examples=15, deadline=None)
@given(
    b=st.integers(1, 2),
    w=st.integers(1, 5),
    t=st.integers(1, 4),
    n=st.integers(1, 3),
    seed=st.integers(0, 999),
    groups=st.sampled_from([1, 2]),
)
def test_beam_rows_table_reads_the_gathered_steps(b, w, t, n, seed, groups):
    """The indexed cache: step j of row r read from row beam_rows[r, j] equals attention over a cache
    into which those steps were copied."""
    q, pk, pv, pmask, bk, bv, _, mask = random_case(seed, b, w, 2, 5, t, n, tree=n > 1, groups=groups)
    g = torch.Generator().manual_seed(seed)
    rows = b * w
    table = torch.randint(0, rows, (rows, bk.shape[2]), generator=g)
    table[:, t:] = torch.arange(rows)[:, None]  # the new block lives in the row itself
    steps = torch.arange(bk.shape[2])
    copied_k, copied_v = bk[table, :, steps].permute(0, 2, 1, 3), bv[table, :, steps].permute(0, 2, 1, 3)
    ref = spa.shared_prefix_attention_torch(q, pk, pv, pmask, copied_k, copied_v, t, mask)
    args = on_device((q, pk, pv, pmask, bk, bv, t, mask))
    got = tri.shared_prefix_attention(*args, beam_rows=table.to(DEVICE))
    torch.testing.assert_close(got.cpu(), ref, **TOL)


def test_backend_is_registered_by_name():
    assert "triton" in spa.ATTENTION_BACKENDS
    backend = spa.get_attention_backend("triton")
    assert backend is tri.shared_prefix_attention and backend.reads_beam_rows


@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("indexed", [False, True], ids=["copying", "indexed"])
def test_model_decodes_the_same_with_either_backend(indexed, gqa):
    """Cached steps with reorders and a tree-masked block: the triton backend gives the torch logits
    (gqa: 2 key/value heads for 4 query heads, with Qwen3's q/k norm)."""
    rng = np.random.default_rng(0)
    model = make_model(seed=1, **(dict(n_kv_heads=2, qk_norm=True) if gqa else {})).to(DEVICE)
    prompt, pmask = random_prompts(rng, 2, VOCAB, 6)
    pre = model.prefill(prompt.to(DEVICE), pmask.to(DEVICE))
    beams = 3
    caches = {name: pre.cache.expand(beams, 6, indexed=indexed) for name in ("torch", "triton")}
    for _ in range(3):
        tok = torch.from_numpy(rng.integers(3, 40, size=(2 * beams, 1))).to(DEVICE)
        outs = {name: model.extend(tok, c, attention=name).logits for name, c in caches.items()}
        torch.testing.assert_close(outs["triton"], outs["torch"], **TOL)
        parent = torch.from_numpy(rng.integers(0, beams, size=(2, beams)) + np.arange(2)[:, None] * beams)
        for c in caches.values():
            c.reorder(parent.reshape(-1).to(DEVICE))
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool).expand(2 * beams, 3, 3)
    block = torch.from_numpy(rng.integers(3, 40, size=(2 * beams, 3))).to(DEVICE)
    outs = {
        name: model.extend(block, c, tree.to(DEVICE), attention=name).logits for name, c in caches.items()
    }
    torch.testing.assert_close(outs["triton"], outs["torch"], **TOL)
