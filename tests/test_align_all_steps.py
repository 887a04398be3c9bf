"""All-step teacher data (the paper's Table 5 "w/ AD"): the stored step beams are the target's beam
search after every level (a slow per-user reference), the file round-trips and is refused where it
does not fit, prefix completion lands on catalogue items, and every sequence objective on all-step
data equals a slow per-sequence reference that scores each step beam alone (no completion)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from test_align import SIZES, World, plain_rows, softmax
from test_atspeed_mixture import histories, make_ctx

from genrec.workloads.decoding.base import get_decoder, make_params
from genrec.workloads.decoding.beam_core import level_beams
from genrec.workloads.decoding.params import BeamParams
from genrec.workloads.errors import UserInputError
from genrec.workloads.evaluation import load_context
from genrec.workloads.models.inputs import training_windows
from genrec.workloads.training.align import AlignFlags, AlignObjective
from genrec.workloads.training.align_context_tree import build_context_tree, context_logits
from genrec.workloads.training.align_sequences import all_step_sequences
from genrec.workloads.training.teacher import TeacherData, load_teacher
from genrec.workloads.training.teacher_steps import MISSING, beam_with_steps, step_coverage
from genrec.workloads.training.train_config import TrainConfig
from genrec.workloads.training.trainer import train

K = 3


def beam_params(k: int) -> BeamParams:
    """What the teacher asks the `beam` decoder for: beam K, top K, catalogue items only."""
    return make_params(get_decoder("beam"), {"beam_width": k, "k": k, "constraint": "all"})


# --- the step beams against a slow beam search ------------------------------------------------------
@torch.no_grad()
def reference_step_beams(ctx, history: list[int], k: int) -> list[list[tuple[tuple[int, ...], float]]]:
    """Per level, the K kept (prefix, score) pairs of a plain beam search: every prefix scored by a full
    forward of [BOS] prompt prefix (no cache), children restricted to catalogue prefixes."""
    codec = ctx.codec
    prompt = ctx.prompts([history])[0][0].tolist()
    valid = {tuple(c[:t]) for c in ctx.item_codes.tolist() for t in range(1, codec.levels + 1)}
    beams, out = [((), 0.0)], []
    for t in range(codec.levels):
        scored = []
        for prefix, score in beams:
            toks = [codec.level_offset(j) + c for j, c in enumerate(prefix)]
            lp = torch.log_softmax(ctx.model(torch.tensor([prompt + toks]))[0][0][-1].double(), -1)
            for c in range(codec.codebook_sizes[t]):
                if prefix + (c,) in valid:
                    scored.append((prefix + (c,), score + float(lp[codec.level_offset(t) + c])))
        beams = sorted(scored, key=lambda s: -s[1])[:k]
        out.append(beams)
    return out


@pytest.mark.parametrize("seed, sizes, items", [(0, (3, 4, 3), 25), (1, (4, 3, 2, 3), 30), (2, (2, 5, 3), 6)])
def test_step_beams_are_the_beam_search_after_every_level(seed, sizes, items):
    ctx = make_ctx(sizes, seed=seed, items=items)
    k = min(K, items)
    result, steps = beam_with_steps(ctx, histories(ctx), beam_params(k))
    for b, history in enumerate(histories(ctx)):
        ref = reference_step_beams(ctx, history, k)
        for t in range(ctx.codec.levels - 1):
            kept = [tuple(c[: t + 1]) for c in steps[b, t].tolist() if c[0] != MISSING]
            assert kept == [p for p, _ in ref[t]]  # same beams, same order (best first)
            assert all(c[t + 1 :] == [MISSING] * (ctx.codec.levels - t - 1) for c in steps[b, t].tolist())
        assert [tuple(c) for c in result.codes[b].tolist()] == [p for p, _ in ref[-1]]


def test_a_step_with_fewer_valid_prefixes_than_k_marks_the_empty_beams():
    ctx = make_ctx((2, 5, 3), seed=2, items=6)  # at most 2 first codes: step 1 keeps 2 of 4 beams
    _, steps = beam_with_steps(ctx, histories(ctx), beam_params(4))
    first = steps[:, 0, :, 0]
    assert ((first != MISSING).sum(-1) == len({c[0] for c in ctx.item_codes.tolist()})).all()
    assert (first[:, 2:] == MISSING).all()


def test_step_coverage_counts_the_step_beams_the_final_top_k_descends_from():
    codes = np.array([[[0, 1, 2], [0, 1, 0], [1, 0, 0]]])  # K = 3 final SIDs, L = 3
    steps = np.full((1, 2, 3, 3), MISSING)
    steps[0, 0, :, 0] = [0, 2, 1]  # step 1: 0 and 1 have descendants, 2 does not
    steps[0, 1, :2, :2] = [[0, 1], [2, 2]]  # step 2 kept two beams: only (0, 1) has one
    assert step_coverage(codes, steps) == pytest.approx([2 / 3, 1 / 2])


def test_level_beams_of_no_choices_is_empty():
    assert level_beams([]) == []


# --- the teacher file ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def step_teacher(tiny_model_dir, synth_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher") / "steps.parquet"
    argv = ["atspeed", "teacher", "--target", str(tiny_model_dir), "--data", str(synth_dir), "--k", "4"]
    assert run_cli([*argv, "--all-steps", "--out", str(out), "--quiet"]) == 0
    plain = out.with_name("plain.parquet")
    assert run_cli([*argv, "--out", str(plain), "--quiet"]) == 0
    return load_teacher(out), load_teacher(plain)


def test_the_all_step_file_holds_the_plain_file_and_each_examples_step_beams(
    step_teacher, tiny_model_dir, synth_dir
):
    steps, plain = step_teacher
    assert plain.step_codes is None and steps.manifest["all_steps"] is True
    np.testing.assert_array_equal(steps.codes, plain.codes)  # the final top-K is the plain beam's
    ctx, _, _ = load_context(tiny_model_dir, synth_dir, "cpu")
    rows = [0, 7, len(steps) - 1]  # row i is example i's: decoded again, one at a time
    for i in rows:
        _, want = beam_with_steps(ctx, [steps.prompts[i]], beam_params(steps.k))
        np.testing.assert_array_equal(steps.step_codes[i], want[0])
    assert_finals_descend_from_step_beams(steps)


def test_a_sampled_all_step_file_draws_what_the_plain_sample_file_draws(
    tiny_model_dir, synth_dir, tmp_path, capsys
):
    argv = ["atspeed", "teacher", "--target", str(tiny_model_dir), "--data", str(synth_dir), "--k", "4"]
    argv += ["--sampling", "--seed", "5", "--batch-size", "16", "--quiet"]
    steps, plain = tmp_path / "steps.parquet", tmp_path / "plain.parquet"
    assert run_cli([*argv, "--all-steps", "--out", str(steps)]) == 0
    shares = step_coverage(load_teacher(steps).codes, load_teacher(steps).step_codes)
    line = f"per level 1..L-1: {', '.join(f'{x:.1%}' for x in shares)}"
    assert line in capsys.readouterr().out and all(0.0 < x <= 1.0 for x in shares)
    assert run_cli([*argv, "--out", str(plain)]) == 0
    with_steps, alone = load_teacher(steps), load_teacher(plain)
    assert with_steps.kind == "sample" and with_steps.step_codes is not None
    np.testing.assert_array_equal(with_steps.codes, alone.codes)  # the same draws, seed for seed
    assert_finals_descend_from_step_beams(with_steps)


def test_all_steps_with_a_mixture_is_refused_and_writes_nothing(tiny_model_dir, synth_dir, tmp_path, capsys):
    out = tmp_path / "t.parquet"
    argv = ["atspeed", "teacher", "--target", str(tiny_model_dir), "--data", str(synth_dir), "--k", "4"]
    argv += ["--mix-draft", str(tiny_model_dir), "--all-steps", "--out", str(out), "--quiet"]
    assert run_cli(argv) != 0
    assert "--all-steps" in capsys.readouterr().err and not out.exists()


def assert_finals_descend_from_step_beams(teacher: TeacherData) -> None:
    """Every final SID's first t codes are one of step t's beams (a search only extends kept beams)."""
    levels = teacher.codes.shape[-1]
    for t in range(levels - 1):
        prefixes = teacher.step_codes[:, t, :, : t + 1]
        finals = teacher.codes[:, :, : t + 1]
        assert (finals[:, :, None, :] == prefixes[:, None, :, :]).all(-1).any(-1).all()


def test_training_with_all_steps_needs_a_step_file_and_a_sequence_objective(
    step_teacher, tiny_model_dir, synth_dir, tmp_path
):
    steps, plain = step_teacher
    base = dict(model_size="tiny", epochs=1, max_steps=2, target=str(tiny_model_dir), all_steps=True)
    with pytest.raises(UserInputError, match="--all-steps"):
        train(synth_dir, tmp_path / "a", TrainConfig(objective="atspeed_s", teacher=str(plain.path), **base))
    assert not (tmp_path / "a").exists()
    with pytest.raises(UserInputError, match=r"--all-steps \(w/ AD\) applies"):
        TrainConfig(objective="wordkd", **base).validate()
    result = train(
        synth_dir,
        tmp_path / "b",
        TrainConfig(objective="atspeed_s", teacher=str(steps.path), **base),
        progress=False,
    )
    assert math.isfinite(result.best_val_loss)


# --- the context tree ---------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n_seq=st.integers(1, 7), batch=st.integers(1, 3))
def test_every_context_is_scored_once_as_a_plain_row_would_score_it(seed, n_seq, batch):
    """Random catalogue prefixes of random lengths: each sequence level's context is its own prefix,
    the contexts are distinct, and the tree's logits there equal a plain forward of [BOS] prompt prefix."""
    w = World(seed % 50, batch=batch)
    rng = np.random.default_rng(seed)
    levels = len(SIZES)
    codes = w.item_codes[rng.integers(0, len(w.item_codes), size=(batch, n_seq))]
    lengths = rng.integers(1, levels + 1, size=n_seq)
    tree = build_context_tree(w.prompts, codes, lengths, w.item_tokens, w.codec, 8)
    with torch.no_grad():
        logits = context_logits(w.draft, tree)
    for b, prompt in enumerate(w.prompts):
        n = int((tree.length[b] > 0).sum()) + 1
        seen = {tuple(tree.prefix[b, c, : tree.length[b, c]].tolist()) for c in range(n)}
        assert len(seen) == n  # one context per distinct prefix
        for s in range(n_seq):
            for t in range(lengths[s]):
                c = int(tree.ctx[b, s, t])
                assert tree.length[b, c] == t and tree.prefix[b, c, :t].tolist() == codes[b, s, :t].tolist()
                toks = [w.codec.level_offset(j) + int(x) for j, x in enumerate(codes[b, s, :t])]
                plain = plain_rows(w.draft, w.item_tokens, prompt, toks + [0])[t]
                assert torch.allclose(logits[b, c], torch.tensor(plain), atol=1e-5)


def test_a_context_tree_refuses_an_empty_prompt():
    w = World(0, batch=1)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        build_context_tree([[]], w.codes[:1], np.full(K, len(SIZES)), w.item_tokens, w.codec, 8)


# --- the objectives on all-step data, against a slow per-sequence reference --------------------------
def step_world(seed: int = 0) -> tuple[World, np.ndarray]:
    """The test_align world plus, per example and step t, K distinct catalogue prefixes of t codes;
    example 0's step 1 keeps only 2 (the third slot empty, as a step with too few valid prefixes)."""
    w = World(seed)
    rng = np.random.default_rng(seed + 100)
    levels = len(SIZES)
    steps = np.full((len(w.prompts), levels - 1, K, levels), MISSING, dtype=np.int64)
    for b in range(len(w.prompts)):
        for t in range(1, levels):
            pool = sorted({tuple(c[:t]) for c in w.item_codes.tolist()})
            chosen = rng.choice(len(pool), size=K, replace=False)
            for j, i in enumerate(chosen):
                steps[b, t - 1, j, :t] = pool[i]
    steps[0, 0, 2] = MISSING
    w.teacher = TeacherData(
        path=None, manifest={"kind": "beam", "k": K, "all_steps": True}, user_id=w.teacher.user_id,
        prompts=w.prompts, target_item=w.teacher.target_item, codes=w.codes, logprobs=w.teacher.logprobs,
        step_codes=steps,
    )  # fmt: skip
    return w, steps


def reference_all_step_loss(w: World, steps: np.ndarray, kind: str, n_align: int = K) -> float:
    """Every sequence (final SIDs of L codes, step-t beams of t codes) scored alone from a plain forward
    of [BOS] prompt sequence; its loss the mean over its own levels; the mean over the sequences (SeqKD:
    over every counted token). y_K of a group is its K-th beam, or its last where the step kept fewer."""
    codec, vocab = w.codec, w.codec.vocab_size
    valid = w.valid_prefixes()
    per_sequence, tokens = [], []
    for b, prompt in enumerate(w.prompts):
        groups = [[tuple(c) for c in w.codes[b].tolist()]]
        for t in range(1, len(SIZES)):
            groups.append([tuple(c[:t]) for c in steps[b, t - 1].tolist() if c[0] != MISSING])
        for group in groups:
            tok = [[codec.level_offset(j) + c for j, c in enumerate(y)] for y in group]
            p_last = plain_rows(w.target, w.item_tokens, prompt, tok[-1])
            p_k = [softmax(p_last[t])[tok[-1][t]] for t in range(len(tok[-1]))]
            for y, ty in list(zip(group, tok))[:n_align]:
                q_rows = plain_rows(w.draft, w.item_tokens, prompt, ty)
                p_rows = plain_rows(w.target, w.item_tokens, prompt, ty)
                terms = []
                for t in range(len(y)):
                    q, p = softmax(q_rows[t]), softmax(p_rows[t])
                    if kind == "seqkd":
                        tokens.append(-math.log(q[ty[t]]))
                        continue
                    lo = codec.level_offset(t)
                    ok = [lo + c for c in range(SIZES[t]) if y[:t] + (c,) in valid]
                    support = sorted(ok, key=lambda v: -q[v])[:K]
                    zq, zp = sum(q[v] for v in support), sum(p[v] for v in support)
                    qn = {v: q[v] / zq for v in support}
                    pn = {v: p[v] / zp for v in support}
                    if kind == "atspeed_r":
                        terms.append(0.5 * sum(abs(pn[v] - qn[v]) for v in support))
                    else:
                        rkld = sum(qn[v] * math.log(qn[v] / pn[v]) for v in support)
                        terms.append(rkld - p_k[t] * sum(qn[v] * math.log(qn[v]) for v in support))
                if kind != "seqkd":
                    per_sequence.append(sum(terms) / len(terms))
    del vocab
    values = tokens if kind == "seqkd" else per_sequence
    return sum(values) / len(values)


@pytest.mark.parametrize("kind", ["seqkd", "atspeed_s", "atspeed_r"])
@pytest.mark.parametrize("top1", [False, True])
def test_all_step_objectives_equal_the_per_sequence_reference(kind, top1):
    w, steps = step_world()
    objective = AlignObjective(
        kind, 1.0, AlignFlags(all_steps=True, top1=top1), w.draft, w.target, w.teacher, w.codec,
        w.item_tokens, w.item_codes, w.windows, 8, torch.device("cpu"), False,
    )  # fmt: skip
    got = objective.loss(np.arange(len(w.prompts))).item()
    want = reference_all_step_loss(w, steps, kind, 1 if top1 else K)
    assert got == pytest.approx(want, rel=5e-6, abs=1e-7)  # float32 against float64


def test_all_step_sequences_weigh_each_step_by_its_own_levels():
    w, steps = step_world()
    seqs = all_step_sequences(w.codes, steps, K)
    levels = len(SIZES)
    weight = seqs.weight.numpy().reshape(len(w.prompts), levels, K, levels)
    assert (weight[:, 0] == 1).all()  # the final SIDs: every level
    for t in range(1, levels):  # step t: its first t levels, nothing past them
        assert (weight[1:, t, :, :t] == 1).all() and (weight[:, t, :, t:] == 0).all()
    assert (weight[0, 1, 2] == 0).all()  # the empty slot counts nowhere ...
    codes = seqs.codes.reshape(len(w.prompts), levels, K, levels)
    np.testing.assert_array_equal(codes[0, 1, 2], codes[0, 1, 1])  # ... and repeats the last kept beam
    assert seqs.kth.tolist() == [g * K + K - 1 for g in range(levels) for _ in range(K)]
    assert seqs.lengths.tolist() == [levels] * K + [t for t in range(1, levels) for _ in range(K)]


def test_training_windows_of_the_step_file_match_the_trainer(step_teacher, synth_dir, tiny_model_dir):
    steps, _ = step_teacher
    ctx, ds, _ = load_context(tiny_model_dir, synth_dir, "cpu")
    windows = [
        w for seq in ds.user_sequences(("train",)).values() for w, _ in training_windows([seq], ctx.max_items)
    ]
    assert len(windows) == len(steps) == steps.step_codes.shape[0]
