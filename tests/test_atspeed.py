"""AtSpeed: strict verification is lossless, tree verification equals separate scoring, and relaxed
verification samples from the target's distribution (Algorithm 2; exact for K = 1)."""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from genrec.workloads.decoding.base import DecoderContext, get_decoder, make_params
from genrec.workloads.decoding.draft_tree import DraftLevel, DraftTree, verify_logits
from genrec.workloads.decoding.relaxed_sampling import (
    drafted_distribution,
    relaxed_level,
    resample,
    sample_without_replacement,
)
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec


def random_model(codec, seed, dim=16, std=0.5):
    torch.manual_seed(seed)
    m = GRTransformer(
        ModelConfig(vocab_size=codec.vocab_size, dim=dim, n_layers=1, n_heads=2, max_seq_len=96)
    )
    for p in m.parameters():
        torch.nn.init.normal_(p, std=std)
    return m.eval()


def cold_every_third(rng, n):
    """Train counts with a zero every third item, so the cold-start set is never empty."""
    popularity = rng.integers(0, 3, n)
    popularity[::3] = 0
    return popularity


def make_ctx(sizes, seed, draft="random"):
    codec = SIDCodec(tuple(sizes))
    rng = np.random.default_rng(seed)
    n = max(4, codec.num_sids // 2)
    items = codec.keys_to_codes(rng.choice(codec.num_sids, size=n, replace=False))
    target = random_model(codec, seed)
    drafts = {
        "random": random_model(codec, seed + 1, dim=8),
        "self": target,
        "untrained": random_model(codec, 7, 8, 0.02),
    }
    return DecoderContext(
        target, codec, np.asarray(items), 4, cold_every_third(rng, len(items)), None, drafts[draft]
    )


def same_top_k(a, b):
    fa, fb = torch.isfinite(a.scores), torch.isfinite(b.scores)
    assert torch.equal(fa, fb)
    assert torch.equal(a.codes[fa], b.codes[fb])
    torch.testing.assert_close(a.scores[fa], b.scores[fb], atol=1e-5, rtol=1e-5)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 6), min_size=2, max_size=4),
    seed=st.integers(0, 10_000),
    k=st.integers(1, 5),
    extra=st.integers(0, 5),
    gamma=st.integers(1, 4),
    batch=st.integers(1, 4),
    tree=st.booleans(),
    constraint=st.sampled_from(["none", "cold_start"]),
    draft=st.sampled_from(["random", "untrained", "self"]),
    level_softmax=st.booleans(),
)
def test_strict_equals_target_beam_search(
    sizes, seed, k, extra, gamma, batch, tree, constraint, draft, level_softmax
):
    """strict AtSpeed returns the target's beam search, also when both models score each level over its own
    tokens (`level_softmax`, the same flag on beam)."""
    ctx = make_ctx(sizes, seed, draft)
    rng = np.random.default_rng(seed)
    hist = [list(rng.integers(0, len(ctx.item_codes), rng.integers(1, 4))) for _ in range(batch)]
    beam, at = get_decoder("beam"), get_decoder("atspeed_strict")
    base = {"beam_width": k, "k": k, "constraint": constraint, "level_softmax": level_softmax}
    want = beam.decode(ctx, hist, make_params(beam, base))
    got = at.decode(
        ctx, hist, make_params(at, {**base, "draft_beams": k + extra, "gamma": gamma, "tree_attention": tree})
    )
    same_top_k(got, want)


def test_a_draft_equal_to_the_target_is_always_accepted():
    ctx = make_ctx((5, 5, 5, 5), seed=1, draft="self")
    at = get_decoder("atspeed_strict")
    res = at.decode(
        ctx, [[0, 1], [2], [3, 4]], make_params(at, {"beam_width": 4, "k": 4, "draft_beams": 8, "gamma": 3})
    )
    assert res.counters["target_calls"] == 2  # the prefill + one verification of all 4 levels
    assert res.counters["accepted_steps"] == 3.0
    assert all(res.counters[f"acceptance_level_{j}"] == 1.0 for j in (1, 2, 3))
    assert {"prefill", "draft", "verify", "system"} <= set(res.timings_ms)


def test_without_tree_attention_it_takes_one_call_per_level():
    ctx = make_ctx((5, 5, 5, 5), seed=1, draft="self")
    at = get_decoder("atspeed_strict")
    p = {"beam_width": 4, "k": 4, "draft_beams": 8, "gamma": 3, "tree_attention": False}
    res = at.decode(ctx, [[0, 1]], make_params(at, p))
    assert res.counters["target_calls"] == 1 + 3  # the prefill + one call per drafted level


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 3), n=st.integers(1, 4), t=st.integers(0, 2))
def test_tree_verification_equals_scoring_each_sequence_separately(seed, k, n, t):
    """Every node's logits from the one tree call equal a full forward of that node's own path."""
    codec = SIDCodec((4, 4, 4, 4))
    model = random_model(codec, seed)
    g = torch.Generator().manual_seed(seed)
    prompt_tokens = torch.randint(3, codec.vocab_size, (2, 5), generator=g)
    mask = torch.ones(2, 5, dtype=torch.bool)
    prompt = model.prefill(prompt_tokens, mask).cache
    committed = torch.randint(0, 4, (2, k, t), generator=g)
    levels = [
        DraftLevel(
            torch.randint(0, k if (j == 0 and t) else (n if j else 1), (2, n), generator=g),
            torch.randint(0, 4, (2, n), generator=g),
        )
        for j in range(4 - t - 1)
    ]
    tree = DraftTree(committed if t else committed[:, :1], levels)
    logits, calls = verify_logits(model, prompt, tree, codec, tree_attention=True)
    assert calls == 1
    # rebuild each drafted node's path by hand and run the plain forward
    for b in range(2):
        for j in range(len(levels)):
            for i in range(n):
                path, node_parent, jj = [], i, j
                while jj >= 0:
                    path.append(int(levels[jj].code[b, node_parent]) + codec.level_offset(t + jj))
                    node_parent = int(levels[jj].parent[b, node_parent])
                    jj -= 1
                path += [
                    int(committed[b, node_parent, l]) + codec.level_offset(l) for l in reversed(range(t))
                ]
                full = torch.cat([prompt_tokens[b], torch.tensor(path[::-1])])[None]
                want = model(full)[0][0, -1]
                torch.testing.assert_close(
                    logits[b, tree.drafted_index(j, torch.tensor(i))], want, atol=2e-5, rtol=1e-4
                )


# --- relaxed verification -----------------------------------------------------------------------------------
def direct_algorithm_2_k1(p, q, rng):
    """One SD level of Algorithm 2 with K = 1, written out: y ~ q, keep it with prob min(1, p/q),
    else draw from norm(max(0, p - q))."""
    y = rng.choice(len(q), p=q)
    if rng.random() <= p[y] / q[y]:
        return y
    res = np.maximum(0, p - q)
    return rng.choice(len(p), p=res / res.sum())


def test_relaxed_rule_matches_algorithm_2_on_enumerable_distributions():
    rng = np.random.default_rng(0)
    m, trials = 6, 20_000
    p = rng.dirichlet(np.ones(m))
    q = rng.dirichlet(np.ones(m) * 0.5)
    gen = torch.Generator().manual_seed(1)
    p_log = torch.log(torch.tensor(p, dtype=torch.float32)).expand(trials, m)
    q_log = torch.log(torch.tensor(q, dtype=torch.float32)).expand(trials, m)
    drafted, _ = sample_without_replacement(q_log, 1, gen)
    ratio = torch.exp(p_log.gather(1, drafted) - q_log.gather(1, drafted))
    keep = torch.rand(ratio.shape, generator=gen) <= ratio
    chosen, real = resample(p_log, q_log, drafted, keep, 1, gen)
    assert bool(real.all())
    ours = np.bincount(chosen[:, 0].numpy(), minlength=m)
    direct = np.bincount([direct_algorithm_2_k1(p, q, rng) for _ in range(trials)], minlength=m)
    # both are samples of p (the speculative-sampling identity)
    assert stats.chisquare(ours, p * trials).pvalue > 1e-3
    assert stats.chisquare(direct, p * trials).pvalue > 1e-3
    # keep rate: sum_y min(p, q)
    assert abs(float(keep.float().mean()) - np.minimum(p, q).sum()) < 0.02


def follows(values: np.ndarray, probs: np.ndarray) -> bool:
    """Chi-square: `values` (indices) are draws of `probs` (zero-probability cells must stay empty)."""
    counts = np.bincount(values, minlength=len(probs))
    zero = probs <= 0
    if counts[zero].any():
        return False
    return stats.chisquare(counts[~zero], probs[~zero] / probs[~zero].sum() * len(values)).pvalue > 1e-3


def relaxed_rows(p, q, trials, n, k, seed):
    """`relaxed_level` for `trials` rows of one root level: N i.i.d. draws from q (the with-replacement
    reading the paper's analysis uses), checked against p."""
    gen = torch.Generator().manual_seed(seed)
    m = len(p)
    p_log = torch.log(torch.tensor(p, dtype=torch.float32)).expand(trials, m)
    q_log = torch.log(torch.tensor(q, dtype=torch.float32)).expand(trials, m)
    draws = torch.multinomial(q_log.exp(), n, replacement=True, generator=gen)
    drafted = DraftLevel(torch.zeros_like(draws), draws)
    beams = torch.zeros(trials, 1, dtype=torch.long)
    return relaxed_level(p_log, q_log, drafted, torch.zeros(trials, n), beams, m, k, gen), draws


def direct_relaxed_level(p, q, n, k, rng):
    """The level rule written out for one row: N i.i.d. drafts from q, each kept with probability
    min(1, p/q); at least K kept: K of the kept drawn by Gumbel-top-K over log p (None otherwise)."""
    d = rng.choice(len(q), size=n, p=q)
    kept = d[rng.random(n) <= p[d] / q[d]]
    if len(kept) < k:
        return None
    keys = np.log(p[kept]) - np.log(-np.log(rng.random(len(kept))))
    return kept[np.argsort(-keys)[:k]]


@pytest.mark.parametrize("n, k", [(1, 1), (3, 1), (6, 2)])
def test_relaxed_level_accepts_at_k_kept_of_n_and_samples_like_algorithm_2(n, k):
    """Each drafted y ~ q is kept with probability min(1, p/q), so the level passes with
    P(Binomial(N, a) >= K), a = sum min(p, q); the K that go on are drawn from the kept, weighted by p
    (compared with a direct implementation); a failed level's missing sequences follow
    norm(max(0, p - q)). With N = K = 1 the output follows p exactly (speculative sampling)."""
    rng = np.random.default_rng(n * 10 + k)
    m, trials = 6, 40_000
    p, q = rng.dirichlet(np.ones(m)), rng.dirichlet(np.ones(m) * 0.5)
    a = np.minimum(p, q).sum()
    out, draws = relaxed_rows(p, q, trials, n, k, seed=n + k)
    accept = out.accept.numpy()
    assert abs(accept.mean() - stats.binom.sf(k - 1, n, a)) < 0.01
    if k == 1:
        ours = np.bincount(out.next_flat[out.accept][:, 0].numpy(), minlength=m)
        direct = [direct_relaxed_level(p, q, n, k, rng) for _ in range(trials)]
        theirs = np.bincount([int(x[0]) for x in direct if x is not None], minlength=m)
        both = np.array([ours, theirs])
        assert stats.chi2_contingency(both[:, both.sum(0) > 0]).pvalue > 1e-3
        # nothing kept: the single output is a residual draw
        assert follows(out.final_flat[~out.accept][:, 0].numpy(), np.maximum(p - q, 0))
    if n == k == 1:  # over all rows: exactly p
        assert follows(torch.where(out.accept, out.next_flat[:, 0], out.final_flat[:, 0]).numpy(), p)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 8), k=st.integers(1, 4))
def test_relaxed_level_picks_k_of_the_kept_in_draft_order(seed, n, k):
    rng = np.random.default_rng(seed)
    m = 8
    p, q = rng.dirichlet(np.ones(m)), rng.dirichlet(np.ones(m))
    out, draws = relaxed_rows(p, q, 50, n, k, seed)
    for r in range(50):
        picked = out.next_nodes[r][out.next_real[r]].tolist()
        assert picked == sorted(picked) and len(set(picked)) == len(picked)
        if bool(out.accept[r]):
            assert len(picked) == k
            assert out.next_flat[r].tolist() == draws[r][out.next_nodes[r]].tolist()
        else:
            assert int(out.final_real[r].sum()) == k  # kept ones plus resampled ones fill K


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 6), w=st.integers(1, 6), t=st.integers(1, 5))
def test_q_over_the_decided_beams_is_the_drafted_q_renormalised(seed, n, w, t):
    """ "decided" normalises the draft's q over the decided beams' children (p's support); "drafted"
    (the authors' code) keeps q over all N drafted parents' children, so it is never larger there, and
    the two agree when the decided beams are all the drafted ones."""
    gen = torch.Generator().manual_seed(seed)
    q_lp = torch.log_softmax(torch.randn(2, n, t, generator=gen), -1)
    draft_scores = torch.randn(2, n, generator=gen)
    beams = torch.stack([torch.randperm(n, generator=gen)[: min(w, n)] for _ in range(2)])
    decided = drafted_distribution(q_lp, draft_scores, beams, "decided")
    drafted = drafted_distribution(q_lp, draft_scores, beams, "drafted")
    torch.testing.assert_close(decided.exp().sum(-1), torch.ones(2))
    assert bool((drafted <= decided + 1e-5).all())
    torch.testing.assert_close(decided, torch.log_softmax(drafted, -1))  # renormalising gives decided
    everyone = torch.arange(n).expand(2, n)
    torch.testing.assert_close(
        drafted_distribution(q_lp, draft_scores, everyone, "drafted"),
        drafted_distribution(q_lp, draft_scores, everyone, "decided"),
    )


def test_resample_keeps_the_accepted_and_never_repeats_them():
    gen = torch.Generator().manual_seed(3)
    p = torch.log_softmax(torch.randn(500, 12, generator=gen), -1)
    q = torch.log_softmax(torch.randn(500, 12, generator=gen), -1)
    drafted, _ = sample_without_replacement(q, 3, gen)
    keep = torch.rand(500, 3, generator=gen) < 0.5
    chosen, real = resample(p, q, drafted, keep, 3, gen)
    for r in range(500):
        kept = set(drafted[r][keep[r]].tolist())
        got = chosen[r][real[r]].tolist()
        assert kept <= set(got) and len(set(got)) == len(got)


@torch.no_grad()
def exact_sid_distribution(model, codec, history_tokens):
    """Ancestral sampling's p(SID) of every SID by enumeration (full forwards): each level's codes are
    drawn from the model's next-token distribution restricted to that level (renormalised there)."""
    sids = list(itertools.product(*(range(t) for t in codec.codebook_sizes)))
    n = len(history_tokens)
    p = []
    for sid in sids:
        toks = [c + codec.level_offset(l) for l, c in enumerate(sid)]
        logits = model(torch.tensor(history_tokens + toks)[None])[0][0]
        total = 0.0
        for l, c in enumerate(sid):
            start, end = codec.level_range(l)
            total += float(torch.log_softmax(logits[n - 1 + l, start:end].float(), -1)[c])
        p.append(np.exp(total))
    return sids, np.array(p) / np.sum(p)


def test_relaxed_with_k1_samples_the_target_distribution():
    """K = 1: relaxed verification is speculative sampling, so its SIDs follow the target's own sampling
    (beam_sample with one beam), whatever the draft; chi-square against the enumerated distribution."""
    codec = SIDCodec((3, 3, 2))
    items = np.array(list(itertools.product(range(3), range(3), range(2))))
    target, draft = random_model(codec, 5, std=0.3), random_model(codec, 9, dim=8, std=0.6)
    ctx = DecoderContext(target, codec, items, 4, None, None, draft)
    n = 3000
    hist = [[1, 4]] * n
    prompt, _ = ctx.prompts(hist[:1])
    sids, p = exact_sid_distribution(target, codec, prompt[0].tolist())
    index = {s: i for i, s in enumerate(sids)}
    rel, samp = get_decoder("atspeed_relaxed"), get_decoder("beam_sample")
    out_rel = rel.decode(
        ctx, hist, make_params(rel, {"beam_width": 1, "k": 1, "draft_beams": 1, "gamma": 2, "seed": 4})
    )
    out_smp = samp.decode(ctx, hist, make_params(samp, {"beam_width": 1, "k": 1, "seed": 4}))
    for out in (out_rel, out_smp):
        counts = np.bincount([index[tuple(c)] for c in out.codes[:, 0].tolist()], minlength=len(sids))
        assert stats.chisquare(counts, p * n).pvalue > 1e-3
    assert 0 < out_rel.counters["accepted_steps"] <= 2


@pytest.mark.parametrize("n, q_support", [(5, "decided"), (12, "decided"), (12, "drafted")])
def test_relaxed_returns_k_distinct_valid_sequences_with_target_scores(n, q_support):
    ctx = make_ctx((4, 4, 4), seed=2)
    rel = get_decoder("atspeed_relaxed")
    params = {"beam_width": 5, "k": 5, "draft_beams": n, "constraint": "all", "q_support": q_support}
    res = rel.decode(ctx, [[0], [1, 2]], make_params(rel, params))
    for b in range(2):
        rows = [tuple(c) for c in res.codes[b].tolist()]
        assert len(set(rows)) == 5 and bool(res.valid[b].all())
        assert bool((res.scores[b, :-1] >= res.scores[b, 1:]).all())


def test_atspeed_needs_a_draft_and_valid_params():
    ctx = make_ctx((3, 3), seed=0)
    ctx.draft_model = None
    at = get_decoder("atspeed_strict")
    with pytest.raises(UserInputError, match="needs a draft model"):
        at.decode(ctx, [[0]], make_params(at, {"beam_width": 2, "k": 2}))
    with pytest.raises(UserInputError, match="draft_beams"):
        make_params(at, {"beam_width": 10, "k": 10, "draft_beams": 5})
    with pytest.raises(UserInputError, match="gamma"):
        make_params(at, {"gamma": 0})
    with pytest.raises(UserInputError, match="q_support"):
        make_params(at, {"q_support": "everything"})


def test_cli_eval_prints_beam_search_metrics_for_atspeed_strict(tiny_model_dir, tmp_path):
    """`genrec eval --decoder atspeed_strict --k 10` = `--decoder beam --beam-width 10 --k 10`, with an
    untrained draft (so most levels are rejected and corrected by the target)."""
    import json

    from conftest import run_cli
    from test_draft_plumbing import make_draft

    draft = make_draft(tmp_path / "draft", tiny_model_dir)
    rows = {}
    for name, extra in (
        ("beam", ["--decoder", "beam", "--beam-width", "10"]),
        (
            "atspeed_strict",
            ["--decoder", "atspeed_strict", "--draft", str(draft), "--param", "draft_beams=12"],
        ),
    ):
        out = tmp_path / f"{name}.jsonl"
        argv = ["eval", "--model", str(tiny_model_dir), *extra, "--k", "10", "--max-users", "40"]
        assert run_cli([*argv, "--quiet", "--no-baseline", "--output", str(out)]) == 0
        rows[name] = json.loads(out.read_text().splitlines()[0])
    assert rows["atspeed_strict"]["quality"] == rows["beam"]["quality"]
    assert rows["atspeed_strict"]["counters"]["target_calls"] > 0
