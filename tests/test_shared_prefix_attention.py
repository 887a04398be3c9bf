"""The staged shared-prefix attention (two stages, each (output, lse), merged) against plain softmax
attention over the concatenated keys of a per-beam-copied cache."""

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.kernels import shared_prefix_attention as spa


def random_case(seed, b, w, h, s, t, n, hd=8, tree=True, groups=1):
    """A random staged-attention input; h key/value heads, h * groups query heads (GQA when > 1)."""
    g = torch.Generator().manual_seed(seed)
    rows = b * w
    q = torch.randn(rows, h * groups, n, hd, generator=g)
    pk, pv = torch.randn(b, h, s, hd, generator=g), torch.randn(b, h, s, hd, generator=g)
    lens = torch.randint(1, s + 1, (b,), generator=g)
    pmask = torch.arange(s)[None, :] >= (s - lens)[:, None]  # left-padded, last position real
    bk, bv = (
        torch.randn(rows, h, t + n + 2, hd, generator=g),
        torch.randn(rows, h, t + n + 2, hd, generator=g),
    )
    mask = None
    if tree:
        mask = torch.rand(rows, n, n, generator=g) < 0.5
        mask = (mask & torch.ones(n, n, dtype=torch.bool).tril()) | torch.eye(n, dtype=torch.bool)
    return q, pk, pv, pmask, bk, bv, t, mask


# random staged-attention inputs (random_case's arguments): users, beams, key/value heads, prompt, earlier
# steps, block, tree or causal, seed, query heads per key/value head
CASES = dict(
    b=st.integers(1, 3),
    w=st.integers(1, 6),
    h=st.integers(1, 3),
    s=st.integers(1, 9),
    t=st.integers(0, 4),
    n=st.integers(1, 4),
    tree=st.booleans(),
    seed=st.integers(0, 10_000),
    groups=st.sampled_from([1, 1, 2, 3]),
)


def plain_reference(q, pk, pv, pmask, bk, bv, t, mask):
    """Copy the prompt per beam, concatenate the keys, one softmax."""
    rows, _, n, _ = q.shape
    w = rows // pk.shape[0]
    k = torch.cat([pk.repeat_interleave(w, 0), bk[:, :, : t + n]], dim=2)
    v = torch.cat([pv.repeat_interleave(w, 0), bv[:, :, : t + n]], dim=2)
    block = mask if mask is not None else torch.ones(n, n, dtype=torch.bool).tril().expand(rows, n, n)
    visible = torch.cat(
        [
            pmask.repeat_interleave(w, 0)[:, None, :].expand(rows, n, -1),
            torch.ones(rows, n, t, dtype=torch.bool),
            block,
        ],
        dim=-1,
    )
    return spa.plain_attention(q, k, v, visible)


@pytest.mark.parametrize("fused", [True, False], ids=["aten-fused", "matmul"])
@settings(max_examples=30, deadline=None)
@given(**CASES)
def test_staged_attention_equals_plain_attention(fused, b, w, h, s, t, n, tree, seed, groups):
    case = random_case(seed, b, w, h, s, t, n, tree=tree, groups=groups)
    # fused=False: the matmul form, which the GPU machine runs (and the reference for the fused op)
    with mock.patch.object(spa, "_CPU_FUSED", spa._CPU_FUSED if fused else None):
        got = spa.shared_prefix_attention_torch(*case)
    torch.testing.assert_close(got, plain_reference(*case), atol=1e-5, rtol=1e-4)


@settings(max_examples=40, deadline=None)
@given(**CASES)
def test_one_pass_equals_plain_attention(b, w, h, s, t, n, tree, seed, groups):
    """The one-pass form (one softmax per user over its prompt and all its beams' keys, siblings masked)
    against the per-beam-copied reference, trees and GQA included."""
    case = random_case(seed, b, w, h, s, t, n, tree=tree, groups=groups)
    q, pk, pv, pmask, bk, bv, t, mask = case
    planned = spa.plan_one_pass(pmask, t, mask, w, n, h * groups, h, q.dtype)
    assert set(planned) == {"one_pass"}  # w * (t + n) <= 24 keys: the one-pass form pays
    got = spa.shared_prefix_attention_torch(*case, **planned)
    torch.testing.assert_close(got, plain_reference(*case), atol=1e-5, rtol=1e-4)


def test_one_pass_is_planned_only_where_it_pays():
    mask = torch.ones(2, 10, dtype=torch.bool)
    plan = spa.plan_one_pass
    assert plan(mask, 1, None, 20, 1, 4, 2, torch.float32)  # 40 beam keys per user
    assert not plan(mask, 1, None, 128, 1, 4, 2, torch.float32)  # 256 > ONE_PASS_SLACK + 10
    assert not plan(mask, 1, None, 20, 1, 4, 2, torch.bfloat16)  # half precision: the staged form in fp32
    assert spa.get_attention_backend("torch").plan is plan


def test_merge_is_the_softmax_over_the_union_of_keys():
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 5, 11)
    v = torch.randn(2, 3, 11, 4)
    whole = torch.softmax(scores, -1) @ v
    out_a, lse_a = spa._softmax_stage(scores[..., :7], v[..., :7, :])
    out_b, lse_b = spa._softmax_stage(scores[..., 7:], v[..., 7:, :])
    torch.testing.assert_close(lse_a, torch.logsumexp(scores[..., :7], -1))
    torch.testing.assert_close(spa.merge_attention_states(out_a, lse_a, out_b, lse_b), whole)


def test_backends_are_chosen_by_name():
    assert spa.get_attention_backend("torch") is spa.shared_prefix_attention_torch
    assert "torch" in spa.ATTENTION_BACKENDS
    with pytest.raises(ValueError, match="unknown attention backend"):
        spa.get_attention_backend("nope")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_are_computed_in_fp32(dtype):
    """Half-precision caches (imported bf16/fp16 checkpoints): the result is the fp32 computation on
    the same (rounded) inputs, cast back, and GQA included."""
    case = random_case(5, 2, 3, 2, 6, 2, 3, groups=2)
    low = tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in case)
    up = tuple(x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in low)
    got = spa.shared_prefix_attention_torch(*low)
    assert got.dtype == dtype
    torch.testing.assert_close(got, spa.shared_prefix_attention_torch(*up).to(dtype), atol=0, rtol=0)
