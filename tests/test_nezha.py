"""NEZHA: draft head, batched head beam search vs references, device verification, training, CLI."""

import itertools
import math

import numpy as np
import pytest
import torch
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.decoding.base import DecoderContext, ItemIndex, get_decoder
from genrec.workloads.decoding.nezha import (
    NezhaParams,
    PythonSetVerifier,
    head_beam_search,
    reference_decode,
)
from genrec.workloads.decoding.prefix_keys import PrefixKeySets
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.checkpoint import load_checkpoint, save_checkpoint
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.nezha_head import (
    HeadConfig,
    append_placeholders,
    build_head,
    head_states,
    sid_log_prob,
)
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec
from genrec.workloads.training.train_config import TrainConfig
from genrec.workloads.training.trainer import train

DIM = 16
# every head the decoders drive: NEZHA and its training-time ablations, and MTP
HEADS = [
    ("nezha", "full"),
    ("nezha", "no_context"),
    ("nezha", "no_placeholder"),
    ("nezha", "add"),
    ("mtp", "full"),
]


def random_head(kind, sizes, variant="full", seed=0):
    torch.manual_seed(seed)
    head = build_head(HeadConfig.for_variant(kind, DIM, sizes, variant)).eval()
    with torch.no_grad():  # larger weights than the init, so scores are well spread (no ties)
        for p in head.parameters():
            p.normal_(0, 0.7)
    return head


def random_items(sizes, n, seed):
    rng = np.random.default_rng(seed)
    space = math.prod(sizes)
    keys = rng.choice(space, size=min(n, space), replace=False)
    return np.asarray(SIDCodec(sizes).keys_to_codes(keys))


def index_and_sets(codec, items):
    index = ItemIndex(codec, items)
    return index, PrefixKeySets(codec, index.keys), PythonSetVerifier(codec, items)


def finite_results(codes, scores):
    out = []
    for u in range(codes.shape[0]):
        out.append(
            [
                (tuple(int(c) for c in codes[u, j]), float(scores[u, j]))
                for j in range(codes.shape[1])
                if math.isfinite(float(scores[u, j]))
            ]
        )
    return out


def assert_same_lists(batched, reference):
    assert len(batched) == len(reference)
    for got, want in zip(batched, reference):
        assert [c for c, _ in got] == [c for c, _ in want]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-5, atol=1e-5)


# --- batched search vs the per-beam reference of Algorithm 3 ---------------------------------------------
@pytest.mark.parametrize("kind,variant", HEADS)
@pytest.mark.parametrize("verify", ["final", "every", "none"])
def test_batched_head_search_equals_per_beam_reference(kind, variant, verify):
    sizes = (5, 4, 6)
    codec = SIDCodec(sizes)
    head = random_head(kind, sizes, variant, seed=1)
    _, prefixes, pyset = index_and_sets(codec, random_items(sizes, 40, seed=2))
    states = torch.randn(5, codec.levels + 1, DIM, generator=torch.Generator().manual_seed(3))
    if not head.config.needs_placeholders:
        states = states[:, :1]
    with torch.no_grad():
        res = head_beam_search(head, states, 3, codec, prefixes if verify != "none" else None, verify)
    ref = reference_decode(head, states, 3, codec, pyset, verify)
    assert_same_lists(finite_results(res.codes, res.scores), ref)
    if verify != "none":
        assert all(pyset.contains(c) for user in ref for c, _ in user)


@pytest.mark.parametrize("kind,variant", HEADS)
def test_beam_logits_equal_level_logits_on_states_repeated_per_beam(kind, variant):
    sizes, users, beams = (7, 5, 6), 3, 4
    head = random_head(kind, sizes, variant, seed=4)
    gen = torch.Generator().manual_seed(5)
    states = torch.randn(users, len(sizes) + 1, DIM, generator=gen)
    s = torch.randn(users * beams, DIM, generator=gen) if head.config.kind == "nezha" else None
    if kind == "nezha" and not head.config.use_context:
        s = None
    with torch.no_grad():
        for level in range(len(sizes)):
            fast = head.beam_logits(level, states, s, beams)
            slow = head.level_logits(level, states.repeat_interleave(beams, dim=0), s)
            torch.testing.assert_close(fast, slow.view(users, beams, -1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["nezha", "mtp"])
def test_head_search_equals_exhaustive_search_when_beam_holds_every_prefix(kind):
    sizes = (3, 3, 2)  # 9 prefixes of length 2 and every level's codebook fit in a beam of 9
    codec = SIDCodec(sizes)
    head = random_head(kind, sizes, seed=4)
    states = torch.randn(3, codec.levels + 1, DIM, generator=torch.Generator().manual_seed(5))
    if kind == "mtp":
        states = states[:, :1]
    all_codes = torch.as_tensor(list(itertools.product(*(range(t) for t in sizes))))
    items = random_items(sizes, 7, seed=6)
    _, prefixes, pyset = index_and_sets(codec, items)
    with torch.no_grad():
        free = head_beam_search(head, states, 9, codec, None, "none")
        checked = head_beam_search(head, states, 9, codec, prefixes, "final")
        for u in range(states.shape[0]):
            lp = sid_log_prob(head, states[u : u + 1].expand(len(all_codes), -1, -1), all_codes)
            order = torch.argsort(lp, descending=True)
            want = [tuple(all_codes[i].tolist()) for i in order[:9]]
            assert [tuple(c) for c in free.codes[u].tolist()] == want
            np.testing.assert_allclose(free.scores[u].numpy(), lp[order[:9]].numpy(), rtol=1e-5)
            valid_want = [c for c in (tuple(all_codes[i].tolist()) for i in order) if pyset.contains(c)]
            got = finite_results(checked.codes[u : u + 1], checked.scores[u : u + 1])[0]
            assert [c for c, _ in got] == valid_want[:9]


# --- verification: device structure vs Python set --------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    n_items=st.integers(1, 60),
    n_queries=st.integers(1, 80),
    seed=st.integers(0, 2**16),
)
def test_prefix_key_sets_agree_with_python_sets(sizes, n_items, n_queries, seed):
    sizes = tuple(sizes)
    codec = SIDCodec(sizes)
    items = random_items(sizes, n_items, seed)
    _, prefixes, pyset = index_and_sets(codec, items)
    rng = np.random.default_rng(seed + 1)
    queries = np.stack([rng.integers(0, t, size=n_queries) for t in sizes], axis=1)
    queries[: min(len(items), n_queries) // 2] = items[: min(len(items), n_queries) // 2]  # some hits
    w = codec.radix_weights()
    for level in range(codec.levels):
        keys = torch.as_tensor(codec.codes_to_keys(queries) // w[level])
        got = prefixes.contains(level, keys).tolist()
        want = [pyset.contains(tuple(int(c) for c in q[: level + 1])) for q in queries]
        assert got == want


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    n_items=st.integers(1, 60),
    seed=st.integers(0, 2**16),
    dense=st.booleans(),
)
def test_valid_children_and_the_fast_mask_equal_the_python_set_on_every_child(sizes, n_items, seed, dense):
    sizes = tuple(sizes)
    codec = SIDCodec(sizes)
    items = random_items(sizes, n_items, seed)
    pyset = PythonSetVerifier(codec, items)
    # dense: one child table per level; otherwise every child is searched (the large-catalogue path)
    prefixes = PrefixKeySets(codec, ItemIndex(codec, items).keys, max_child_table=1 << 20 if dense else 0)
    assert all((t is not None) == dense for t in prefixes.child_tables)
    rng = np.random.default_rng(seed + 1)
    random_codes = np.stack([rng.integers(0, t, 20) for t in sizes], axis=1)
    for level in range(codec.levels):
        # parents: valid prefixes of the items, plus random (mostly invalid) ones
        parent_codes = np.concatenate([items, random_codes])[:, :level]
        parent_keys = np.zeros(len(parent_codes), dtype=np.int64)
        for j in range(level):  # the mixed-radix key of the first `level` codes
            parent_keys = parent_keys * sizes[j] + parent_codes[:, j]
        got = prefixes.valid_children(level, torch.as_tensor(parent_keys)).tolist()
        want = [[pyset.contains((*map(int, p), c)) for c in range(sizes[level])] for p in parent_codes]
        assert got == want
        # the search's per-step mask, on the valid parents only (its contract): -inf where invalid
        n = len(items)
        logp = torch.as_tensor(rng.normal(size=(n, sizes[level])), dtype=torch.float32)
        masked = prefixes.mask_invalid_children(level, torch.as_tensor(parent_keys[:n]), logp)
        assert torch.equal(masked, logp.masked_fill(~torch.as_tensor(want[:n]), float("-inf")))


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4))
def test_codec_keys_are_a_bijection_onto_the_sid_space(sizes):
    codec = SIDCodec(tuple(sizes))
    keys = np.arange(codec.num_sids)
    codes = codec.keys_to_codes(keys)
    assert (codes < np.array(sizes)).all() and (codes >= 0).all()
    assert len({tuple(c) for c in codes.tolist()}) == codec.num_sids
    np.testing.assert_array_equal(codec.codes_to_keys(codes), keys)


# --- the placeholder prompt: one prefill gives all L+1 states ---------------------------------------------
def test_one_prefill_gives_all_states_equal_to_separate_forwards():
    codec = SIDCodec((6, 5, 4))
    torch.manual_seed(0)
    model = GRTransformer(ModelConfig(vocab_size=codec.vocab_size, dim=32, n_layers=2, n_heads=2)).eval()
    tokens = torch.tensor([[0, 0, 1, 7, 13, 18], [1, 8, 14, 19, 6, 12]])
    mask = tokens != 0
    sp = [codec.placeholder_token(l) for l in range(codec.levels)]
    full, fmask = append_placeholders(tokens, mask, sp)
    cfg = HeadConfig("nezha", 32, codec.codebook_sizes)
    out = model.prefill(full, fmask, return_all_hidden=True)
    states = head_states(out.all_hidden, cfg)
    assert states.shape == (2, codec.levels + 1, 32)
    for j in range(codec.levels + 1):  # h_j = the last state of the prompt cut after <SP_j>
        cut = tokens.shape[1] + j
        with torch.no_grad():
            alone = model.hidden_states(full[:, :cut], fmask[:, :cut])[:, -1]
        torch.testing.assert_close(states[:, j], alone, rtol=1e-5, atol=1e-5)


# --- ablation switches ----------------------------------------------------------------------------------
def test_ablation_switches_change_what_they_claim():
    sizes = (4, 4, 4)
    states = torch.randn(3, 4, DIM, generator=torch.Generator().manual_seed(0))
    other = states.clone()
    other[:, 0] += 1.0  # a different context h_0
    moved = states.clone()
    moved[:, 1:] += 1.0  # different placeholder states
    codes = torch.tensor([[0, 1, 2], [3, 3, 3], [1, 0, 2]])
    full = random_head("nezha", sizes)
    no_ctx = random_head("nezha", sizes, "no_context")
    no_sp = random_head("nezha", sizes, "no_placeholder")
    add = random_head("nezha", sizes, "add")
    with torch.no_grad():
        # NEZHA-1: no state, no transition; logits ignore h_0 and the chosen codes
        assert no_ctx.init_state(states) is None and len(no_ctx.rnn) == 0 and len(no_ctx.code_embed) == 0
        for a, b in zip(no_ctx(states, codes), no_ctx(other, codes.flip(0))):
            torch.testing.assert_close(a, b)
        # NEZHA-2: the placeholder states are not read (and not needed in the prompt)
        assert not no_sp.config.needs_placeholders and full.config.needs_placeholders
        for a, b in zip(no_sp(states, codes), no_sp(moved, codes)):
            torch.testing.assert_close(a, b)
        assert not torch.allclose(full(states, codes)[1], full(moved, codes)[1])
        # NEZHA-3: the transition is an addition of the code embedding
        s = add.init_state(states)
        torch.testing.assert_close(add.transition(0, s, codes[:, 0]), s + add.code_embed[0](codes[:, 0]))
        assert len(add.rnn) == 0 and len(full.rnn) == len(sizes) - 1
        # the full head's later levels depend on the chosen earlier codes
        assert not torch.allclose(full(states, codes)[2], full(states, codes.flip(0))[2])
    with pytest.raises(ValueError, match="variant"):
        HeadConfig.for_variant("mtp", DIM, sizes, "add")


def test_verification_modes_filter_invalid_sids():
    sizes = (4, 4, 4)
    codec = SIDCodec(sizes)
    head = random_head("nezha", sizes, seed=3)
    _, prefixes, pyset = index_and_sets(codec, random_items(sizes, 6, seed=9))
    states = torch.randn(8, 4, DIM, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        none = head_beam_search(head, states, 5, codec, None, "none")
        final = head_beam_search(head, states, 5, codec, prefixes, "final")
        every = head_beam_search(head, states, 5, codec, prefixes, "every")
    flags = [[pyset.contains(tuple(c)) for c in u] for u in none.codes.tolist()]
    assert not all(all(f) for f in flags)  # 6 of 64 SIDs valid: the unverified drafts hallucinate
    assert final.drafts_valid == sum(map(sum, flags))
    for res in (final, every):
        for c, s in zip(res.codes.view(-1, 3).tolist(), res.scores.view(-1).tolist()):
            assert not math.isfinite(s) or pyset.contains(tuple(c))
    # every-step verification keeps only valid prefixes, so it can only find more valid SIDs
    assert int(torch.isfinite(every.scores).sum()) >= int(torch.isfinite(final.scores).sum())


# --- training, checkpoint, decoder, CLI ---------------------------------------------------------------
@pytest.fixture(scope="module")
def nezha_model_dir(synth_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "nezha"
    cfg = TrainConfig(
        model_size="tiny", epochs=2, batch_size=64, warmup_steps=10, max_items=5, objective="nezha"
    )  # short prompts keep this fast
    train(synth_dir, out, cfg, progress=False)
    return out


def test_nezha_training_lowers_head_loss_and_round_trips_the_head(nezha_model_dir):
    ckpt = load_checkpoint(nezha_model_dir)
    hist = ckpt.meta["history"]
    assert ckpt.meta["objective"] == "nezha" and len(hist) == 2
    assert hist[-1]["val_loss"] < hist[0]["val_loss"] and hist[-1]["train_loss"] < hist[0]["train_loss"]
    for h in hist:  # the per-level parts add up to the recorded validation loss
        assert len(h["val_level_loss"]) == 3 and sum(h["val_level_loss"]) == pytest.approx(h["val_loss"])
    assert ckpt.meta["history_blind_val_loss"] > 0
    head = ckpt.head
    assert head is not None and head.config.kind == "nezha" and head.config.codebook_sizes == (8, 8, 8)
    # the backbone's own state_dict has no head tensors (the HF bridge keeps working)
    assert not any(k.startswith("draft_head") for k in ckpt.model.state_dict())


def test_nezha_decoder_returns_valid_items_with_phase_timings(nezha_model_dir, synth_dir):
    from genrec.workloads.data.dataset import load_dataset

    ckpt = load_checkpoint(nezha_model_dir)
    ds = load_dataset(synth_dir)
    ctx = DecoderContext(ckpt.model, ckpt.codec, ds.item_codes(), ckpt.max_items, draft_head=ckpt.head)
    histories = [ex.history for ex in ds.eval_examples("test")[:16]]
    res = get_decoder("nezha").decode(ctx, histories, NezhaParams(beam_width=10, k=10))
    assert res.codes.shape == (16, 10, 3) and bool(res.valid.all()) and bool((res.item_ids >= 0).all())
    assert {"prefill", "draft", "verify", "decode"} <= set(res.timings_ms)
    assert res.counters["returned_valid"] == 160 and res.counters["model_calls"] == 1
    with pytest.raises(
        UserInputError,
        match="'mtp' needs a model trained with a mtp head, but this checkpoint has a 'nezha' head",
    ):
        get_decoder("mtp").decode(ctx, histories, NezhaParams())
    ctx.draft_head = None
    with pytest.raises(UserInputError, match="--objective nezha"):
        get_decoder("nezha").decode(ctx, histories, NezhaParams())


def test_cli_eval_with_the_nezha_decoder(nezha_model_dir, tmp_path, capsys):
    args = ["eval", "--model", str(nezha_model_dir), "--decoder", "nezha", "--beam-width", "10"]
    assert run_cli([*args, "--max-users", "64", "--quiet", "--no-baseline"]) == 0
    assert "nezha" in capsys.readouterr().out
    ckpt = load_checkpoint(nezha_model_dir)  # the same backbone saved without its head
    ckpt.head = None
    save_checkpoint(tmp_path / "plain", ckpt)
    assert not load_checkpoint(tmp_path / "plain").meta.get("head")
    assert run_cli(["eval", "--model", str(tmp_path / "plain"), "--decoder", "nezha", "--quiet"]) == 2


def test_latency_benchmark_times_every_decoder_on_the_same_users(tiny_model_dir, nezha_model_dir, tmp_path):
    import json

    from genrec.studies.nezha.nezha_latency import main

    argv = ["--beam-model", str(tiny_model_dir), "--nezha-model", str(nezha_model_dir), "--users", "12"]
    argv += ["--batch-size", "4", "--repeats", "1", "--warmup", "1", "--out", str(tmp_path / "lat.json")]
    out = main(argv)
    d = out["decoders"]
    assert set(d) == {"beam", "nezha", "nezha-4", "nezha-every"}
    assert json.loads((tmp_path / "lat.json").read_text())["decoders"].keys() == d.keys()
    assert out["speedup_beam_over_nezha"] == pytest.approx(d["beam"]["median_ms"] / d["nezha"]["median_ms"])
    prefill = d["nezha"]["phases_ms"]["prefill"]
    assert out["speedup_ceiling_free_draft"] == pytest.approx(d["beam"]["median_ms"] / prefill)
    assert d["nezha-4"]["phases_ms"]["verify"] < d["nezha"]["phases_ms"]["verify"]  # NEZHA-4 skips the check
    assert out["setup"]["users"] == 12 and out["setup"]["model_size"] == "tiny"
    assert out["setup"]["env"]["device"].startswith("cpu")  # the default: the CPU target
    every = d["nezha-every"]["phases_ms"]
    share = every["verify"] / d["nezha-every"]["median_ms"]
    assert out["verify_share_of_nezha_every"] == pytest.approx(share)


def test_latency_benchmark_can_time_hf_beam_search_on_the_beam_model(tiny_model_dir, nezha_model_dir):
    pytest.importorskip("transformers")
    from genrec.studies.nezha.nezha_latency import main

    argv = ["--beam-model", str(tiny_model_dir), "--nezha-model", str(nezha_model_dir), "--users", "8"]
    out = main([*argv, "--batch-size", "4", "--repeats", "1", "--warmup", "1", "--with-hf"])
    d = out["decoders"]
    # the same weights and the same search objective: HF's lists are ours (the tiny model has no ties)
    assert d["beam-hf"]["quality"] == pytest.approx(d["beam"]["quality"])
    assert d["beam-hf"]["users_with_k_valid"] == d["beam"]["users_with_k_valid"]
    ratio = d["beam-hf"]["median_ms"] / d["nezha"]["median_ms"]
    assert out["speedup_beam_hf_over_nezha"] == pytest.approx(ratio)


def test_train_config_rejects_unknown_objectives_and_misplaced_variants():
    with pytest.raises(UserInputError, match="objective"):
        TrainConfig(objective="medusa").validate()
    with pytest.raises(UserInputError, match="needs --objective nezha"):
        TrainConfig(objective="mtp", head_variant="add").validate()
    TrainConfig(objective="nezha", head_variant="no_context").validate()


def test_history_blind_loss_is_the_joint_or_the_summed_marginal_entropy():
    from genrec.workloads.training.nezha_objective import history_blind_loss

    def entropy(p):
        p = np.asarray(p, dtype=float) / np.sum(p)
        return float(-(p * np.log(p)).sum())

    # level 2 is a function of level 1, so the joint carries no more information than level 1
    codes = np.array([[0, 1], [0, 1], [1, 0], [2, 0], [2, 0], [2, 0]])
    h1, h2 = entropy([2, 1, 3]), entropy([4, 2])
    tiny = 1e-9  # (almost) no smoothing: evaluated on its own training targets, it is the entropy
    nezha = HeadConfig("nezha", DIM, (3, 2))
    assert history_blind_loss(nezha, codes, codes, tiny) == pytest.approx(h1)
    assert history_blind_loss(HeadConfig("mtp", DIM, (3, 2)), codes, codes, tiny) == pytest.approx(h1 + h2)
    nezha1 = HeadConfig.for_variant("nezha", DIM, (3, 2), "no_context")  # levels independent too
    assert history_blind_loss(nezha1, codes, codes, tiny) == pytest.approx(h1 + h2)
    # unseen validation SIDs get the smoothed probability alpha / (count + alpha * T), never zero
    unseen = np.array([[1, 1]])
    assert history_blind_loss(HeadConfig("mtp", DIM, (3, 2)), codes, unseen) == pytest.approx(
        -np.log(1.5 / 7.5) - np.log(2.5 / 7)
    )
    assert history_blind_loss(nezha, codes, unseen) == pytest.approx(
        -np.log(1.5 / 7.5) - np.log(0.5 / (1 + 0.5 * 2))
    )
