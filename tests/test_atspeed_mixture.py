"""AtSpeed's mixture teacher data D' (paper section 3.1): the beam search over (1 - lambda) q + lambda p
equals the target's beam at lambda = 1 and the draft's at 0, and a slow enumeration of every catalogue
SID in between; the teacher file stores target log-probs; bad input is refused; a mixture file trains."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.decoding.base import DecoderContext, get_decoder, make_params
from genrec.workloads.decoding.mixture_model import (
    MixtureModel,
    check_mix_lambda,
    mixture_context,
    mixture_log_probs,
)
from genrec.workloads.errors import UserInputError
from genrec.workloads.evaluation import load_context
from genrec.workloads.models.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import BOS, SIDCodec
from genrec.workloads.training.teacher import (
    TeacherMixture,
    build_teacher_data,
    load_teacher,
    teacher_examples,
    teacher_table,
    write_parquet_atomic,
)
from genrec.workloads.training.train_config import TrainConfig
from genrec.workloads.training.trainer import train

K = 3
HISTORIES = [[1, 2, 3], [4], [5, 6, 7, 8, 9], [0, 0]]


def random_model(vocab: int, seed: int, dim: int = 16, std: float = 0.5, max_seq_len: int = 96):
    """Spread-out weights, so the draft's and the target's distributions differ clearly."""
    torch.manual_seed(seed)
    m = GRTransformer(ModelConfig(vocab_size=vocab, dim=dim, n_layers=1, n_heads=2, max_seq_len=max_seq_len))
    for p in m.parameters():
        torch.nn.init.normal_(p, std=std)
    return m.eval()


def make_ctx(sizes=(3, 4, 3), seed=0, items=None) -> DecoderContext:
    """Target and draft on one codec; by default every SID is an item (or the first `items` keys)."""
    codec = SIDCodec(sizes)
    n = codec.num_sids if items is None else items
    codes = np.asarray(codec.keys_to_codes(np.random.default_rng(seed).permutation(codec.num_sids)[:n]))
    target = random_model(codec.vocab_size, seed)
    draft = random_model(codec.vocab_size, seed + 1, dim=8)
    return DecoderContext(target, codec, codes, 4, None, None, draft)


def histories(ctx: DecoderContext) -> list[list[int]]:
    """HISTORIES as item ids of this catalogue (small catalogues have fewer than 10 items)."""
    return [[x % len(ctx.item_codes) for x in h] for h in HISTORIES]


def beam(ctx: DecoderContext, width: int, k: int = K):
    dec = get_decoder("beam")
    params = make_params(dec, {"beam_width": width, "k": k, "constraint": "all"})
    return dec.decode(ctx, histories(ctx), params)


# --- (a) the end points --------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lambda_one_is_the_target_beam_search_and_zero_the_drafts(seed):
    ctx = make_ctx(seed=seed, items=25)
    draft_ctx = DecoderContext(ctx.draft_model, ctx.codec, ctx.item_codes, ctx.max_items)
    for mix, alone in ((1.0, ctx), (0.0, draft_ctx)):
        got, want = beam(mixture_context(ctx, mix), 5), beam(alone, 5)
        assert torch.equal(got.codes, want.codes) and torch.equal(got.valid, want.valid)
        torch.testing.assert_close(got.scores, want.scores, atol=1e-5, rtol=0)
    half = beam(mixture_context(ctx, 0.5), 5)  # and in between it is neither (the test can tell)
    assert not torch.equal(half.codes, beam(ctx, 5).codes)


# --- (b) the slow reference ------------------------------------------------------------------------
@torch.no_grad()
def reference_top_k(ctx: DecoderContext, history: list[int], mix: float, k: int):
    """Every catalogue SID scored by sum over levels of log((1 - mix) q + mix p), each model's
    full-vocabulary softmax from a full forward of [BOS] prompt SID (no cache); the best k."""
    prompt = ctx.prompts([history])[0][0].tolist()
    scored = []
    for sid in ctx.item_codes.tolist():
        toks = ctx.codec.codes_to_tokens(np.asarray(sid)).tolist()
        full = torch.tensor([prompt + toks])
        q = torch.softmax(ctx.draft_model(full)[0][0].double(), -1)
        p = torch.softmax(ctx.model(full)[0][0].double(), -1)
        m = (1 - mix) * q + mix * p
        n = len(prompt)
        scored.append((sum(math.log(float(m[n - 1 + t, tok])) for t, tok in enumerate(toks)), tuple(sid)))
    scored.sort(key=lambda s: -s[0])
    return scored[:k]


def check_against_reference(ctx: DecoderContext, mix: float) -> None:
    # beam width >= number of items: every valid prefix survives every level, so the beam is exact
    res = beam(mixture_context(ctx, mix), len(ctx.item_codes), K)
    for b, history in enumerate(histories(ctx)):
        ref = reference_top_k(ctx, history, mix, K)
        assert [tuple(c) for c in res.codes[b].tolist()] == [sid for _, sid in ref]
        np.testing.assert_allclose(res.scores[b].numpy(), [s for s, _ in ref], atol=2e-5)


@pytest.mark.parametrize("mix", [0.3, 0.5, 0.9])
def test_mixture_beam_equals_the_enumerated_mixture_top_k(mix):
    check_against_reference(make_ctx((3, 4, 3), seed=4, items=20), mix)


@settings(max_examples=12, deadline=None)
@given(
    mix=st.floats(0.0, 1.0),
    seed=st.integers(0, 10_000),
    sizes=st.lists(st.integers(2, 4), min_size=2, max_size=3),
)
def test_mixture_is_a_distribution_and_its_beam_equals_the_reference(mix, seed, sizes):
    ctx = make_ctx(tuple(sizes), seed=seed)
    tokens, mask = ctx.prompts(histories(ctx))
    q = ctx.draft_model.prefill(tokens, mask).logits
    p = ctx.model.prefill(tokens, mask).logits
    log_m = mixture_log_probs(q, p, mix)
    torch.testing.assert_close(log_m.exp().sum(-1), torch.ones(len(HISTORIES)), atol=1e-5, rtol=0)
    assert bool((log_m <= 1e-6).all())
    check_against_reference(ctx, mix)


# --- (d) bad input ---------------------------------------------------------------------------------
def test_lambda_outside_zero_one_and_models_of_two_codecs_are_refused():
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(UserInputError, match=r"--mix-lambda must be in \[0, 1\]"):
            check_mix_lambda(bad)
        with pytest.raises(UserInputError, match="mix-lambda"):
            TeacherMixture(bad)
    ctx = make_ctx()
    with pytest.raises(UserInputError, match="one codec"):
        MixtureModel(random_model(ctx.codec.vocab_size + 3, 0), ctx.model, 0.5)
    ctx.draft_model = None
    with pytest.raises(UserInputError, match="--mix-draft DIR"):
        mixture_context(ctx, 0.5)


# --- the teacher file ------------------------------------------------------------------------------
def save_random_draft(out, target_dir, codec_sizes=None):
    """A random checkpoint beside the target (same codec and window unless `codec_sizes`)."""
    target = load_checkpoint(target_dir)
    codec = SIDCodec(codec_sizes) if codec_sizes else target.codec
    model = random_model(codec.vocab_size, 11, dim=16, std=0.3, max_seq_len=target.model.config.max_seq_len)
    meta = {"dataset": target.meta["dataset"]}
    return save_checkpoint(out, Checkpoint(model, codec, target.max_items, meta))


@pytest.fixture(scope="module")
def draft_dir(tiny_model_dir, tmp_path_factory):
    return save_random_draft(tmp_path_factory.mktemp("mix") / "draft", tiny_model_dir)


@pytest.fixture(scope="module")
def mixture_file(tiny_model_dir, synth_dir, draft_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("mix") / "mixture.parquet"
    argv = ["atspeed", "teacher", "--target", str(tiny_model_dir), "--data", str(synth_dir)]
    argv += ["--k", str(K), "--out", str(out), "--mix-draft", str(draft_dir), "--mix-lambda", "0.5"]
    assert run_cli([*argv, "--batch-size", "128", "--device", "cpu", "--quiet"]) == 0
    return out


@torch.no_grad()
def full_forward_log_prob(model, item_tokens, codec, prompt, sid) -> float:
    toks = codec.codes_to_tokens(np.asarray(sid)).tolist()
    head = [BOS] + item_tokens[prompt].reshape(-1).tolist()
    logits = model(torch.tensor([head + toks]))[0][0].double()
    n = len(head)
    return sum(float(torch.log_softmax(logits[n - 1 + t], -1)[tok]) for t, tok in enumerate(toks))


def test_mixture_file_stores_target_log_probs_of_the_mixture_top_k(
    mixture_file, tiny_model_dir, synth_dir, draft_dir
):
    teacher = load_teacher(mixture_file)
    assert teacher.kind == "mixture" and teacher.mix_lambda == 0.5 and teacher.k == K
    assert teacher.manifest["mix_draft"] == str(draft_dir.resolve())
    ctx, ds, _ = load_context(tiny_model_dir, synth_dir, "cpu", draft_dir=draft_dir)
    assert len(teacher) == len(teacher_examples(ds, ctx.max_items))
    assert bool(ctx.index.lookup(torch.as_tensor(teacher.codes))[1].all())  # catalogue items only
    assert bool((np.diff(teacher.logprobs, axis=1) <= 0).all())  # best first under the target
    mixed = mixture_context(ctx, 0.5)
    dec = get_decoder("beam")
    params = make_params(dec, {"beam_width": K, "k": K, "constraint": "all"})
    for i in (0, 7, len(teacher) - 1):
        res = dec.decode(mixed, [teacher.prompts[i]], params)  # row i is the mixture's top-K of example i
        assert {tuple(c) for c in res.codes[0].tolist()} == {tuple(c) for c in teacher.codes[i].tolist()}
        for k in range(K):  # (c) ... scored by the target, teacher-forced (a full forward here)
            ref = full_forward_log_prob(
                ctx.model, ctx.item_tokens, ctx.codec, teacher.prompts[i], teacher.codes[i, k]
            )
            assert teacher.logprobs[i, k] == pytest.approx(ref, abs=1e-4)
    plain = dec.decode(ctx, teacher.prompts[:64], params).codes.numpy()
    assert not np.array_equal(plain, teacher.codes[:64])  # the draft changed some rows (it was used)


def test_mixture_file_at_lambda_one_is_the_beam_file(tiny_model_dir, synth_dir, draft_dir, tmp_path):
    ctx, ds, _ = load_context(tiny_model_dir, synth_dir, "cpu", draft_dir=draft_dir)
    beam_file = build_teacher_data(ctx, ds, K, tmp_path / "b.parquet", batch_size=128, progress=False)
    mix = TeacherMixture(1.0, str(draft_dir))
    mix_file = build_teacher_data(
        ctx, ds, K, tmp_path / "m.parquet", batch_size=128, progress=False, mixture=mix
    )
    a, b = load_teacher(beam_file), load_teacher(mix_file)
    assert np.array_equal(a.codes, b.codes) and b.kind == "mixture" and a.mix_lambda is None
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_old_files_load_and_a_mixture_file_must_name_draft_and_lambda(tmp_path, synth_dir, tiny_model_dir):
    ctx, ds, _ = load_context(tiny_model_dir, synth_dir, "cpu")
    examples = teacher_examples(ds, ctx.max_items)[:4]
    codes = np.repeat(ctx.item_codes[None, :K], len(examples), axis=0)
    manifest = {  # a v1 beam manifest, written before the mixture existed
        "format": "genrec-atspeed-teacher", "format_version": 1, "target": "", "dataset": "", "k": K,
        "kind": "beam", "seed": 0, "batch_size": 4, "max_items": ctx.max_items, "constraint": "all",
        "codebook_sizes": list(ctx.codec.codebook_sizes), "examples": len(examples),
    }  # fmt: skip
    old = write_parquet_atomic(
        teacher_table(examples, codes, np.zeros((4, K)), "beam", manifest), tmp_path / "o.parquet"
    )
    assert load_teacher(old).kind == "beam" and load_teacher(old).mix_lambda is None
    bad = {**manifest, "kind": "mixture"}
    path = write_parquet_atomic(
        teacher_table(examples, codes, np.zeros((4, K)), "mixture", bad), tmp_path / "m.parquet"
    )
    with pytest.raises(UserInputError, match="mix_draft"):
        load_teacher(path)
    odd = {**manifest, "kind": "guess"}
    path = write_parquet_atomic(
        teacher_table(examples, codes, np.zeros((4, K)), "guess", odd), tmp_path / "g.parquet"
    )
    with pytest.raises(UserInputError, match="teacher kind 'guess'"):
        load_teacher(path)


def test_cli_refuses_bad_mixture_options(synth_dir, tiny_model_dir, draft_dir, tmp_path, capsys):
    out = tmp_path / "t.parquet"
    base = ["atspeed", "teacher", "--target", str(tiny_model_dir), "--data", str(synth_dir), "--k", "3"]
    base += ["--out", str(out), "--quiet"]
    cases = [
        (["--mix-lambda", "0.5"], "pass --mix-draft DIR too"),
        (["--mix-draft", str(draft_dir), "--sampling"], "drop one of them"),
        (["--mix-draft", str(draft_dir), "--mix-lambda", "1.5"], "must be in [0, 1]"),
        (["--mix-draft", str(tmp_path / "nope")], "not a genrec checkpoint"),
    ]
    other = save_random_draft(tmp_path / "other", tiny_model_dir, codec_sizes=(8, 8, 16))
    cases.append((["--mix-draft", str(other)], "must share the target's codec"))
    for extra, message in cases:
        assert run_cli([*base, *extra]) == 2, extra
        assert message in capsys.readouterr().err, extra
    assert not out.exists()


# --- (e) training from a mixture file --------------------------------------------------------------
@pytest.mark.parametrize("objective", ["atspeed_s", "seqkd"])
def test_a_mixture_file_trains_a_draft(objective, synth_dir, tiny_model_dir, mixture_file, tmp_path):
    cfg = TrainConfig(
        model_size="tiny", epochs=1, batch_size=64, warmup_steps=1, max_steps=1, device="cpu",
        objective=objective, target=str(tiny_model_dir), teacher=str(mixture_file), alpha=0.5,
    )  # fmt: skip
    train(synth_dir, tmp_path / "draft", cfg, progress=False)
    config = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert config["teacher_kind"] == "mixture" and config["teacher_k"] == K
    assert math.isfinite(config["history"][0]["train_align_loss"])
