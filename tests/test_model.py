"""The transformer's KV-cache API against full recomputation, and checkpoint round trips."""

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.errors import UserInputError
from genrec.workloads.models.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from genrec.workloads.models.inputs import build_prompts, build_training_batch, training_windows
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import BOS, SIDCodec


def make_model(vocab=40, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4, max_seq_len=128, **kw)
    return GRTransformer(cfg).eval()


def random_prompts(rng, batch, vocab, max_len):
    lens = rng.integers(1, max_len + 1, size=batch)
    s = int(lens.max())
    tokens = torch.zeros(batch, s, dtype=torch.long)
    mask = torch.zeros(batch, s, dtype=torch.bool)
    for i, n in enumerate(lens):
        tokens[i, s - n :] = torch.from_numpy(rng.integers(3, vocab, size=n))
        mask[i, s - n :] = True
    return tokens, mask


def recompute_logits(model, tokens, mask, appended):
    """Reference: run the whole (prompt + appended) sequence from scratch, return last logits."""
    full = torch.cat([tokens, appended], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(appended, dtype=torch.bool)], dim=1)
    logits, hidden = model(full, full_mask)
    return logits[:, -1], hidden[:, -1]


@settings(max_examples=15, deadline=None)
@given(batch=st.integers(1, 3), beams=st.integers(1, 4), steps=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_cached_decoding_equals_recomputation(batch, beams, steps, seed):
    rng = np.random.default_rng(seed)
    model = make_model(seed=seed % 7)
    tokens, mask = random_prompts(rng, batch, 40, 9)
    out = model.prefill(tokens, mask)
    ref_logits, ref_hidden = recompute_logits(model, tokens, mask, tokens[:, :0])
    torch.testing.assert_close(out.logits, ref_logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out.hidden, ref_hidden, atol=1e-5, rtol=1e-4)

    cache = out.cache.expand(beams, steps)
    # per-row decoded history, reordered like beam search does
    history = torch.zeros(batch * beams, 0, dtype=torch.long)
    for _ in range(steps):
        nxt = torch.from_numpy(rng.integers(3, 40, size=batch * beams))
        step = model.step(nxt, cache)
        history = torch.cat([history, nxt[:, None]], dim=1)
        ref_l, ref_h = recompute_logits(
            model, tokens.repeat_interleave(beams, 0), mask.repeat_interleave(beams, 0), history
        )
        torch.testing.assert_close(step.logits, ref_l, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(step.hidden, ref_h, atol=1e-5, rtol=1e-4)
        # random parents within each user's group of beams
        parent = torch.from_numpy(
            (np.arange(batch)[:, None] * beams + rng.integers(0, beams, size=(batch, beams))).reshape(-1)
        )
        cache.reorder(parent)
        history = history[parent]


def test_left_padding_does_not_change_a_row():
    model = make_model()
    a = torch.tensor([[5, 6, 7, 8]])
    padded = torch.tensor([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    alone = model.prefill(a, torch.ones_like(a, dtype=torch.bool)).logits
    together = model.prefill(padded, mask).logits
    torch.testing.assert_close(together[0], alone[0], atol=1e-5, rtol=1e-4)


def test_prefill_all_hidden_matches_forward():
    model = make_model()
    tokens = torch.randint(3, 40, (2, 7))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    out = model.prefill(tokens, mask, return_all_hidden=True)
    _, hidden = model(tokens, mask)
    torch.testing.assert_close(out.all_hidden, hidden)


def test_step_errors_are_clear():
    model = make_model()
    tokens = torch.randint(3, 40, (2, 5))
    out = model.prefill(tokens, torch.ones_like(tokens, dtype=torch.bool))
    with pytest.raises(ValueError, match="expand"):
        model.step(torch.zeros(2, dtype=torch.long), out.cache)
    cache = out.cache.expand(3, 1)
    with pytest.raises(ValueError, match="6 tokens"):
        model.step(torch.zeros(2, dtype=torch.long), cache)
    model.step(torch.zeros(6, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="no room"):
        model.step(torch.zeros(6, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="left-padded"):
        model.prefill(tokens, torch.tensor([[1, 1, 1, 1, 0]] * 2, dtype=torch.bool))


def test_prompts_and_training_labels():
    codec = SIDCodec((4, 5))
    item_tokens = codec.codes_to_tokens(np.array([[0, 0], [1, 2], [3, 4]]))
    tokens, mask = build_prompts([[0, 1, 2], [2]], item_tokens, max_items=2)
    assert tokens.tolist()[0] == [BOS, *item_tokens[1], *item_tokens[2]]
    assert mask[1].tolist() == [False, False, True, True, True]
    tok, m, lab = build_training_batch([[0, 1, 2]], item_tokens, num_targets=[1])
    # only the last item's two tokens are labelled, each at the position before it
    assert (lab != -100).sum() == 2 and lab[0, -3:-1].tolist() == list(item_tokens[2])
    tok, m, lab = build_training_batch([[0, 1, 2]], item_tokens)
    assert (lab != -100).sum() == 4


@settings(max_examples=50, deadline=None)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=5), max_items=st.integers(1, 8))
def test_training_windows_cover_each_target_once(lengths, max_items):
    seqs = [list(range(100 * i, 100 * i + n)) for i, n in enumerate(lengths)]
    targets = []
    for window, n in training_windows(seqs, max_items):
        assert 2 <= len(window) <= max_items + 1 and 1 <= n < len(window)
        targets += window[-n:]
    assert sorted(targets) == sorted(x for s in seqs for x in s[1:])


def test_checkpoint_round_trip(tmp_path):
    model = make_model()
    codec = SIDCodec((4, 5))
    save_checkpoint(tmp_path / "ck", Checkpoint(model, codec, 7, {"dataset": "somewhere"}))
    assert not list(tmp_path.glob(".ck.tmp-*"))
    loaded = load_checkpoint(tmp_path / "ck")
    assert loaded.codec == codec and loaded.max_items == 7 and loaded.meta["dataset"] == "somewhere"
    x = torch.randint(3, 40, (2, 6))
    torch.testing.assert_close(loaded.model(x)[0], model(x)[0])
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["model"]["dim"] == 32


def test_checkpoint_errors(tmp_path):
    with pytest.raises(UserInputError, match="not a genrec checkpoint"):
        load_checkpoint(tmp_path)
