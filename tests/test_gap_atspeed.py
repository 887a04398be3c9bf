"""AtSpeed behaviours no other fast test pins down (issue 36):

- the draft's log-probability of a decided prefix, level l read from the position that predicts level
  l (the one after level l-1's token), against a plain forward of each sequence on its own; and, through
  `decode`, a draft equal to the target is accepted at every drafted level of every SD step, including
  the later ones that start from decided prefixes (where that log-probability is used);
- strict verification under a constraint with fewer valid SIDs than K: the same top-K as beam search
  slot for slot, missing slots included, and a target beam that does not exist needs no drafted match.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from genrec.workloads.decoding.atspeed import prefix_log_prob
from genrec.workloads.decoding.base import DecoderContext, get_decoder, make_params
from genrec.workloads.decoding.scorers import LevelReader
from genrec.workloads.models.transformer import GRTransformer, ModelConfig
from genrec.workloads.sid_codec import SIDCodec


def random_model(codec: SIDCodec, seed: int, dim: int = 16, std: float = 0.5) -> GRTransformer:
    torch.manual_seed(seed)
    m = GRTransformer(
        ModelConfig(vocab_size=codec.vocab_size, dim=dim, n_layers=1, n_heads=2, max_seq_len=96)
    )
    for p in m.parameters():
        torch.nn.init.normal_(p, std=std)
    return m.eval()


def make_ctx(sizes: tuple[int, ...], seed: int, draft: str) -> DecoderContext:
    """Half the SID space as the catalogue, a random target and a draft (itself, or another model)."""
    codec = SIDCodec(tuple(sizes))
    rng = np.random.default_rng(seed)
    n = max(4, codec.num_sids // 2)
    items = np.asarray(codec.keys_to_codes(rng.choice(codec.num_sids, size=n, replace=False)))
    target = random_model(codec, seed)
    other = target if draft == "self" else random_model(codec, seed + 1, dim=8)
    return DecoderContext(target, codec, items, 4, rng.integers(0, 3, n), None, other)


def histories(ctx: DecoderContext, seed: int, batch: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(0, len(ctx.item_codes), rng.integers(1, 4))] for _ in range(batch)]


def acceptance(counters: dict) -> dict[str, float]:
    return {k: v for k, v in counters.items() if k.startswith("acceptance_level_")}


# --- 1. the draft's log-probability of a decided prefix ----------------------------------------------------
@torch.no_grad()
def per_sequence_log_prob(
    model: GRTransformer, codec: SIDCodec, prompt: torch.Tensor, codes: list[int], level_softmax: bool = False
):
    """log p(codes | prompt) by one plain forward of prompt + codes: level l's log-softmax (over the whole
    vocabulary, restricted to level l's tokens; with `level_softmax` over level l's tokens only) is read at
    the position just before level l's token."""
    tokens = torch.tensor([int(c) + codec.level_offset(l) for l, c in enumerate(codes)], dtype=torch.long)
    logits = model(torch.cat([prompt, tokens])[None])[0][0].float()
    total = 0.0
    for level, code in enumerate(codes):
        start, end = codec.level_range(level)
        row = logits[len(prompt) - 1 + level]
        row = (
            torch.log_softmax(row[start:end], -1) if level_softmax else torch.log_softmax(row, -1)[start:end]
        )
        total += float(row[code])
    return total


@settings(max_examples=20, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 6), min_size=2, max_size=5),
    seed=st.integers(0, 10_000),
    g=st.integers(1, 3),
    w=st.integers(1, 4),
    t_frac=st.floats(0, 1),
    level_softmax=st.booleans(),
)
@torch.no_grad()
def test_prefix_log_prob_equals_a_forward_of_each_sequence(sizes, seed, g, w, t_frac, level_softmax):
    codec = SIDCodec(tuple(sizes))
    t = 1 + int(t_frac * (codec.levels - 1)) if codec.levels > 1 else 1
    t = min(t, codec.levels)
    model = random_model(codec, seed)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, codec.vocab_size, (g, 5), generator=gen)
    codes = torch.stack([torch.randint(0, sizes[l], (g, w), generator=gen) for l in range(t)], dim=-1)
    out = model.prefill(prompt, torch.ones(g, 5, dtype=torch.bool))
    # the prefix positions' logits the way the decoder gets them: one cached extend of every beam's prefix
    offsets = torch.tensor([codec.level_offset(l) for l in range(t)])
    cache = out.cache.expand(w, codec.levels)
    read = LevelReader(model, codec, level_softmax)  # logits, or hidden states read level by level
    outs = read.of(model.extend((codes + offsets).view(g * w, t), cache))
    got = prefix_log_prob(read.of(out), outs, codes, read)
    want = torch.tensor(
        [
            [
                per_sequence_log_prob(model, codec, prompt[b], codes[b, j].tolist(), level_softmax)
                for j in range(w)
            ]
            for b in range(g)
        ]
    )
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("decoder", ["atspeed_strict", "atspeed_relaxed"])
@settings(max_examples=10, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 4), min_size=4, max_size=5),
    seed=st.integers(0, 10_000),
    k=st.integers(1, 5),
    gamma=st.integers(1, 2),
    tree=st.booleans(),
)
@example(sizes=[2, 2, 3, 3], seed=0, k=5, gamma=1, tree=True)  # 4 decided beams of 5 after step one
def test_a_draft_equal_to_the_target_is_accepted_in_every_sd_step(decoder, sizes, seed, k, gamma, tree):
    """Later SD steps start from decided prefixes: the draft's beams there are ranked by its log-prob of
    those prefixes (strict: N = K leaves no room for a wrong ranking) and relaxed's q is built on it, so a
    draft identical to the target must still agree with it everywhere (p = q, the same top-K). Small
    codebooks leave fewer than K decided beams at some levels: those missing beams must stay out of
    the draft's search (a duplicate of a real beam would take one of its N slots)."""
    ctx = make_ctx(tuple(sizes), seed, "self")
    at = get_decoder(decoder)
    params = make_params(
        at, {"beam_width": k, "k": k, "draft_beams": k, "gamma": gamma, "tree_attention": tree}
    )
    res = at.decode(ctx, histories(ctx, seed, 3), params)
    assert res.counters["sd_steps"] > 3  # some user took more than one SD step
    assert acceptance(res.counters) and all(v == 1.0 for v in acceptance(res.counters).values()), res.counters


# --- 2. strict verification with fewer than K valid completions ---------------------------------------------
def assert_same_slots(got, want) -> None:
    """The same answer slot for slot: SIDs, items, validity, scores (-inf where missing), missing count."""
    assert torch.equal(got.codes, want.codes)
    assert torch.equal(got.item_ids, want.item_ids)
    assert torch.equal(got.valid, want.valid)
    assert torch.equal(torch.isfinite(got.scores), torch.isfinite(want.scores))
    finite = torch.isfinite(want.scores)
    torch.testing.assert_close(got.scores[finite], want.scores[finite], atol=1e-5, rtol=1e-5)
    assert got.counters["missing"] == want.counters["missing"]


@settings(max_examples=15, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 5), min_size=2, max_size=4),
    seed=st.integers(0, 10_000),
    k=st.integers(2, 6),
    size=st.integers(1, 5),
    extra=st.integers(0, 4),
    gamma=st.integers(1, 3),
    batch=st.integers(1, 3),
    tree=st.booleans(),
    draft=st.sampled_from(["self", "other"]),
    rule=st.sampled_from(["random", "uniform"]),  # uniform: SIDs of the space, some no item (invalid)
)
def test_strict_under_a_small_constraint_equals_beam_search_slot_for_slot(
    sizes, seed, k, size, extra, gamma, batch, tree, draft, rule
):
    ctx = make_ctx(tuple(sizes), seed, draft)
    hist = histories(ctx, seed, batch)
    constraint = {"constraint": rule, "constraint_size": min(size, k - 1), "constraint_seed": seed}
    beam, at = get_decoder("beam"), get_decoder("atspeed_strict")
    base = {"beam_width": k, "k": k, **constraint}
    want = beam.decode(ctx, hist, make_params(beam, base))
    assert want.counters["missing"] > 0  # fewer valid SIDs than K: the last level has missing beams
    p = {**base, "draft_beams": k + extra, "gamma": gamma, "tree_attention": tree}
    got = at.decode(ctx, hist, make_params(at, p))
    assert_same_slots(got, want)
    if draft == "self":  # the target's missing beams need no drafted match: every level is accepted
        assert all(v == 1.0 for v in acceptance(got.counters).values()), got.counters


@settings(max_examples=10, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 5), min_size=2, max_size=4),
    seed=st.integers(0, 10_000),
    k=st.integers(2, 6),
    size=st.integers(1, 5),
    extra=st.integers(0, 4),
    gamma=st.integers(1, 3),
    draft=st.sampled_from(["self", "other"]),
    q_support=st.sampled_from(["decided", "drafted"]),
)
def test_relaxed_under_a_constraint_smaller_than_k_returns_every_sid_like_beam_search(
    sizes, seed, k, size, extra, gamma, draft, q_support
):
    """With fewer valid SIDs than K every level keeps all its valid prefixes, so relaxed verification
    (random as it is) must return exactly beam search's answer: every SID of the set, the rest missing."""
    ctx = make_ctx(tuple(sizes), seed, draft)
    hist = histories(ctx, seed, 2)
    # fewer SIDs than K, and no more than the catalogue holds (sizes [2, 2]: 4 items)
    n = min(size, k - 1, len(ctx.item_codes))
    constraint = {"constraint": "random", "constraint_size": n, "constraint_seed": seed}
    beam, at = get_decoder("beam"), get_decoder("atspeed_relaxed")
    base = {"beam_width": k, "k": k, **constraint}
    want = beam.decode(ctx, hist, make_params(beam, base))
    p = {**base, "draft_beams": k + extra, "gamma": gamma, "seed": seed, "q_support": q_support}
    assert_same_slots(at.decode(ctx, hist, make_params(at, p)), want)
