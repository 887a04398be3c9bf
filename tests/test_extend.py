"""`extend` (n tokens per row, tree masks), `keep`/`truncate` and `expand` against full recomputation.

The reference runs every row's whole sequence (prompt + decoded steps + the new block) through the
full forward with an explicit attention mask and RoPE positions, so it shares no cache code."""

from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_model import make_model, random_prompts

from genrec.kernels import shared_prefix_attention as spa

VOCAB = 40
TOL = dict(atol=2e-5, rtol=1e-4)


FORMS = {"one_pass": spa.ONE_PASS_SLACK, "staged": -(10**9)}  # the torch backend's two CPU forms


def random_tree(rng, rows, n):
    """[rows, n, n] ancestor masks of random trees whose parents come first (parent[i] < i)."""
    out = torch.zeros(rows, n, n, dtype=torch.bool)
    for r in range(rows):
        parent = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]  # -1: a root of the block
        for i in range(n):
            j = i
            while j >= 0:
                out[r, i, j] = True
                j = parent[j]
    return out


@torch.no_grad()
def recompute(model, prompt, pmask, steps, block, tree):
    """Reference hidden states [R, n, D] of `block` after `steps`, by one full forward per row set.

    prompt/pmask [R, S] (left-padded), steps [R, t] (all visible), block [R, n], tree [R, n, n]."""
    rows, s = prompt.shape
    t, n = steps.shape[1], block.shape[1]
    tokens = torch.cat([prompt, steps, block], dim=1)
    total = s + t + n
    plen = pmask.long().sum(-1)
    pos = torch.zeros(rows, total, dtype=torch.long)
    pos[:, :s] = (pmask.long().cumsum(-1) - 1).clamp(min=0)
    pos[:, s : s + t] = plen[:, None] + torch.arange(t)
    pos[:, s + t :] = plen[:, None] + t + tree.sum(-1) - 1
    attn = torch.zeros(rows, total, total, dtype=torch.bool)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    attn[:, :s, :s] = causal & pmask[:, None, :]
    attn[:, s:, :s] = pmask[:, None, :]  # decoded and new tokens see every real prompt token
    attn[:, s : s + t, s : s + t] = torch.ones(t, t, dtype=torch.bool).tril()
    attn[:, s + t :, s : s + t] = True
    attn[:, s + t :, s + t :] = tree
    attn |= torch.eye(total, dtype=torch.bool)  # pad queries see themselves (their output is unused)
    hidden = model.hidden_states(tokens, positions=pos, attn_mask=attn)
    return hidden[:, s + t :]


@pytest.mark.parametrize("form", sorted(FORMS))
@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    beams=st.integers(1, 3),
    prior=st.integers(0, 3),
    n=st.integers(1, 5),
    use_tree=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_extend_equals_full_recomputation(form, batch, beams, prior, n, use_tree, seed):
    rng = np.random.default_rng(seed)
    model = make_model(seed=seed % 5)
    prompt, pmask = random_prompts(rng, batch, VOCAB, 8)
    rows = batch * beams
    cache = model.prefill(prompt, pmask).cache.expand(beams, prior + n)
    steps = torch.from_numpy(rng.integers(3, VOCAB, size=(rows, prior)))
    block = torch.from_numpy(rng.integers(3, VOCAB, size=(rows, n)))
    tree = (
        random_tree(rng, rows, n)
        if use_tree
        else torch.ones(n, n, dtype=torch.bool).tril().expand(rows, n, n)
    )
    with mock.patch.object(spa, "ONE_PASS_SLACK", FORMS[form]):  # planned with few beam keys, or never
        if prior:
            model.extend(steps, cache)  # a causal block: the earlier decoded steps
        out = model.extend(block, cache, tree if use_tree else None)
    ref = recompute(
        model, prompt.repeat_interleave(beams, 0), pmask.repeat_interleave(beams, 0), steps, block, tree
    )
    torch.testing.assert_close(out.hidden, ref, **TOL)
    torch.testing.assert_close(out.logits, model.lm_head(ref), **TOL)
    assert cache.steps == prior + n


@settings(max_examples=10, deadline=None)
@given(batch=st.integers(1, 3), beams=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_step_is_extend_with_one_token(batch, beams, seed):
    rng = np.random.default_rng(seed)
    model = make_model(seed=seed % 3)
    prompt, pmask = random_prompts(rng, batch, VOCAB, 6)
    out = model.prefill(prompt, pmask)
    a, b = out.cache.expand(beams, 3), out.cache.expand(beams, 3)
    for _ in range(3):
        tok = torch.from_numpy(rng.integers(3, VOCAB, size=batch * beams))
        s = model.step(tok, a)
        e = model.extend(tok[:, None], b)
        torch.testing.assert_close(s.logits, e.logits[:, 0], atol=0, rtol=0)
        torch.testing.assert_close(s.hidden, e.hidden[:, 0], atol=0, rtol=0)


@settings(max_examples=20, deadline=None)
@given(batch=st.integers(1, 3), n=st.integers(2, 5), after=st.integers(1, 2), seed=st.integers(0, 10_000))
def test_keep_then_steps_equals_recomputation_on_the_kept_path(batch, n, after, seed):
    """Verify a draft tree in one extend, commit one root-to-node path per row, decode on: the result
    equals recomputing the prompt + the kept path + the new steps."""
    rng = np.random.default_rng(seed)
    model = make_model(seed=seed % 5)
    prompt, pmask = random_prompts(rng, batch, VOCAB, 7)
    cache = model.prefill(prompt, pmask).cache.expand(1, 1 + n + after)
    first = torch.from_numpy(rng.integers(3, VOCAB, size=(batch, 1)))
    model.extend(first, cache)  # one committed step before the draft
    tree = random_tree(rng, batch, n)
    block = torch.from_numpy(rng.integers(3, VOCAB, size=(batch, n)))
    model.extend(block, cache, tree)
    # each row keeps the path from a root to a random node of its tree
    paths = []
    for r in range(batch):
        node = int(rng.integers(0, n))
        paths.append([j for j in range(n) if tree[r, node, j]])
    m = min(len(p) for p in paths)
    paths = [p[:m] for p in paths]  # equal lengths: a prefix of a root path is a root path
    index = torch.tensor(paths) + 1  # absolute step numbers (the first step is step 0)
    cache.keep(1, index)
    assert cache.steps == 1 + m
    kept = torch.gather(block, 1, index - 1)
    new = torch.from_numpy(rng.integers(3, VOCAB, size=(batch, after)))
    out = model.extend(new, cache)
    steps = torch.cat([first, kept], dim=1)
    causal = torch.ones(after, after, dtype=torch.bool).tril().expand(batch, after, after)
    ref = recompute(model, prompt, pmask, steps, new, causal)
    torch.testing.assert_close(out.hidden, ref, **TOL)


def test_truncate_drops_the_block_and_decoding_continues():
    rng = np.random.default_rng(0)
    model = make_model()
    prompt, pmask = random_prompts(rng, 2, VOCAB, 5)
    cache = model.prefill(prompt, pmask).cache.expand(1, 6)
    steps = torch.from_numpy(rng.integers(3, VOCAB, size=(2, 2)))
    model.extend(steps, cache)
    model.extend(torch.from_numpy(rng.integers(3, VOCAB, size=(2, 3))), cache)  # a rejected draft
    cache.truncate(2)
    nxt = torch.from_numpy(rng.integers(3, VOCAB, size=(2, 2)))
    out = model.extend(nxt, cache)
    ref = recompute(
        model, prompt, pmask, steps, nxt, torch.ones(2, 2, dtype=torch.bool).tril().expand(2, 2, 2)
    )
    torch.testing.assert_close(out.hidden, ref, **TOL)
    with pytest.raises(ValueError, match="truncate"):
        cache.truncate(9)


@settings(max_examples=10, deadline=None)
@given(batch=st.integers(2, 3), seed=st.integers(0, 10_000))
def test_expand_a_cache_with_decoded_steps_equals_recomputation(batch, seed):
    """beams 1 -> 3 after two decoded steps: every new beam row holds its user's steps (not another's)."""
    rng = np.random.default_rng(seed)
    model = make_model(seed=seed % 3)
    prompt, pmask = random_prompts(rng, batch, VOCAB, 6)
    cache = model.prefill(prompt, pmask).cache.expand(1, 4)
    steps = torch.from_numpy(rng.integers(3, VOCAB, size=(batch, 2)))
    model.extend(steps, cache)
    wide = cache.expand(3, 4)
    nxt = torch.from_numpy(rng.integers(3, VOCAB, size=(batch * 3, 1)))
    out = model.extend(nxt, wide)
    ref = recompute(
        model,
        prompt.repeat_interleave(3, 0),
        pmask.repeat_interleave(3, 0),
        steps.repeat_interleave(3, 0),
        nxt,
        torch.ones(batch * 3, 1, 1, dtype=torch.bool),
    )
    torch.testing.assert_close(out.hidden, ref, **TOL)


def test_bad_blocks_and_tree_masks_are_rejected():
    model = make_model()
    prompt, pmask = random_prompts(np.random.default_rng(0), 1, VOCAB, 4)
    cache = model.prefill(prompt, pmask).cache.expand(2, 3)
    with pytest.raises(ValueError, match="room"):
        model.extend(torch.ones(2, 4, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=r"\[2, n >= 1\]"):
        model.extend(torch.ones(3, 1, dtype=torch.long), cache)
    upper = torch.ones(2, 2, 2, dtype=torch.bool)  # sees a later token: not ancestors-first
    with pytest.raises(ValueError, match="diagonal"):
        model.extend(torch.ones(2, 2, dtype=torch.long), cache, upper)
    no_self = torch.zeros(2, 2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="diagonal"):
        model.extend(torch.ones(2, 2, dtype=torch.long), cache, no_self)
    with pytest.raises(ValueError, match="keep"):
        cache.keep(0, torch.zeros(1, 1, dtype=torch.long))
