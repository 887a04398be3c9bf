"""Histories longer than the model's window keep their most recent items (issue 36, item 5): in the
Serve app's request parsing (`parse_recommend`, then the replica's batch decoder), in every model
decoder's prompts and in `genrec eval`; and the other limits request parsing applies: the history
limit counts the history as sent, the request's token cost counts what is decoded, error messages
are clipped keeping their start and end, and oversized, over-deep or over-long-number bodies are
refused before they are parsed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.platform.params import parse_decoder_params
from genrec.platform.serve.batch_decoder import BatchDecoder
from genrec.platform.serve.requests import (
    MAX_BODY_BYTES,
    MAX_DETAIL_CHARS,
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    Limits,
    RequestError,
    clip,
    parse_recommend,
)
from genrec.workloads.decoding.base import DecoderContext, get_decoder, make_params
from genrec.workloads.evaluation import EvalConfig, evaluate
from genrec.workloads.models.transformer import GRTransformer, ModelConfig
from genrec.workloads.sid_codec import BOS, PAD, SIDCodec

NUM_ITEMS = 100


def limits(window: int, policy: str = "truncate", **kw) -> Limits:
    return Limits(
        num_items=NUM_ITEMS,
        max_history=window,
        max_k=50,
        history_policy=policy,
        decoders=("beam",),
        default_decoder="beam",
        defaults={"beam": parse_decoder_params("beam", {"beam_width": 4, "k": 3})},
        constraint_sets={},
        **kw,
    )


def body(history: list[int], **fields) -> bytes:
    return json.dumps({"history": history, **fields}).encode()


# --- over HTTP: request parsing and the replica's batch -----------------------------------------------------
HISTORIES = st.lists(st.integers(0, NUM_ITEMS - 1), min_size=1, max_size=40)


@settings(max_examples=100, deadline=None)
@given(history=HISTORIES, window=st.integers(1, 12), width=st.integers(1, 6))
def test_a_long_history_keeps_its_most_recent_items(history, window, width):
    job = parse_recommend(body(history, beam_width=width, k=1), limits(window))
    kept = history[max(0, len(history) - window) :]  # the last `window` items, oldest first
    assert list(job.history) == kept
    assert job.truncated_from == (len(history) if len(history) > window else 0)
    assert bool(job.notes) == (len(history) > window)
    # the request's cost is what is decoded: widest beam x (kept items + answer) x levels
    assert job.tokens == width * (len(kept) + 1) * 3


@settings(max_examples=50, deadline=None)
@given(history=HISTORIES, window=st.integers(1, 12))
def test_the_reject_policy_refuses_only_histories_beyond_the_window(history, window):
    lim = limits(window, policy="reject")
    if len(history) <= window:
        assert list(parse_recommend(body(history), lim).history) == history
        return
    with pytest.raises(RequestError) as e:
        parse_recommend(body(history), lim)
    assert e.value.status == 422 and f"window is {window}" in e.value.message


def test_the_history_limit_counts_the_history_as_sent():
    """max_history_items bounds what a client may send, before truncation to the window."""
    lim = limits(3, max_history_items=10)
    assert list(parse_recommend(body(list(range(10))), lim).history) == [7, 8, 9]
    with pytest.raises(RequestError) as e:
        parse_recommend(body(list(range(11))), lim)
    assert e.value.status == 422 and "max_history_items=10" in e.value.message


def test_a_long_request_costs_what_is_decoded():
    """A history far beyond the window is admitted when its kept part fits max_batch_tokens."""
    lim = limits(2, max_batch_tokens=4 * (2 + 1) * 3)  # beam 4 x (2 items + answer) x 3 levels
    job = parse_recommend(body(list(range(50)), beam_width=4), lim)
    assert job.history == (48, 49) and job.tokens == lim.max_batch_tokens


class RecordingHost:
    """A DecoderHost stand-in that records the histories it is asked to decode."""

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def decode(self, histories, decoder, params):
        self.seen += [list(h) for h in histories]
        row = SimpleNamespace(item_ids=[1], sids=[[0, 0, 0]], scores=[0.0], valid=[True])
        return SimpleNamespace(
            items=[row] * len(histories), decoder=decoder, params=params, decode_ms=1.0, timings_ms={}
        )


def test_the_replica_decodes_the_kept_items():
    lim = limits(4)
    jobs = [parse_recommend(body(list(range(n)), k=1), lim) for n in (2, 9, 30)]
    host = RecordingHost()
    answers = BatchDecoder(host, lim).decode([(job, 0.0, float("inf")) for job in jobs], 0.0)
    assert host.seen == [[0, 1], [5, 6, 7, 8], [26, 27, 28, 29]]
    assert [a["history_truncated"] for a in answers] == [False, True, True]


# --- the limits on the body itself --------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(piece=st.text(max_size=30), reps=st.integers(0, 200), limit=st.integers(10, 1200))
def test_clip_keeps_the_start_and_the_end(piece, reps, limit):
    text = "".join(f"{i}{piece}" for i in range(reps))  # long and different at each end
    out = clip(text, limit)
    if len(text) <= limit:
        assert out == text
        return
    half = limit // 2
    assert out.startswith(text[:half]) and out.endswith(text[-half:])
    assert f"({len(text) - 2 * half} characters left out)" in out
    assert len(out) <= limit + 60  # the marker is short


def test_error_messages_echo_a_huge_bad_value_only_clipped():
    bad = "x" * 50_000
    with pytest.raises(RequestError) as e:
        parse_recommend(body([1], decoder=bad), limits(4))
    assert e.value.status == 422 and len(e.value.message) <= MAX_DETAIL_CHARS + 60
    assert e.value.message.startswith("`decoder`") and e.value.message.endswith("['beam']")


@pytest.mark.parametrize(
    "raw, status, words",
    [
        (b'{"history": [1' + b" " * MAX_BODY_BYTES + b"]}", 413, "the limit is"),
        (b'{"history": [' + b"1" * (MAX_INT_DIGITS + 1) + b"]}", 400, f"the limit is {MAX_INT_DIGITS}"),
        (b'{"history": [-' + b"1" * MAX_INT_DIGITS + b"]}", 422, "unknown item ids"),  # 20 digits: parsed
        (
            b'{"history": [1], "params": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}",
            400,
            "deeper",
        ),
        (
            b'{"history": [1], "params": {"x": "' + b"[" * 100 + b'"}}',
            422,
            "no parameter 'x'",
        ),  # in a string: no depth
        (b'{"history": [1], "k": NaN}', 400, "finite numbers"),
    ],
)
def test_oversized_and_malformed_bodies_are_refused_with_the_limit(raw, status, words):
    with pytest.raises(RequestError) as e:
        parse_recommend(raw, limits(4))
    assert e.value.status == status and words in e.value.message, e.value.message


# --- in the decoders' prompts and in eval ----------------------------------------------------------------
def random_ctx(sizes: tuple[int, ...], item_codes: np.ndarray, max_items: int, seed: int = 0, draft=False):
    codec = SIDCodec(sizes)
    torch.manual_seed(seed)
    model = GRTransformer(
        ModelConfig(vocab_size=codec.vocab_size, dim=16, n_layers=1, n_heads=2, max_seq_len=64)
    )
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    popularity = np.arange(len(item_codes))
    return DecoderContext(
        model.eval(), codec, item_codes, max_items, popularity, None, model if draft else None
    )


def catalogue(sizes: tuple[int, ...], n: int, seed: int = 0) -> np.ndarray:
    codec = SIDCodec(sizes)
    return np.asarray(
        codec.keys_to_codes(np.random.default_rng(seed).choice(codec.num_sids, n, replace=False))
    )


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    max_items=st.integers(1, 6),
    seed=st.integers(0, 1000),
)
def test_prompts_hold_the_last_items_left_padded(lengths, max_items, seed):
    items = catalogue((4, 4, 4), 30, seed)
    ctx = random_ctx((4, 4, 4), items, max_items)
    rng = np.random.default_rng(seed)
    histories = [rng.integers(0, 30, n).tolist() for n in lengths]
    tokens, mask = ctx.prompts(histories)
    rows = []  # by hand: BOS, then each kept item's level-offset tokens
    for h in histories:
        kept = h[-max_items:]
        rows.append(
            [BOS] + [int(c) + ctx.codec.level_offset(l) for i in kept for l, c in enumerate(items[i])]
        )
    width = max(len(r) for r in rows)
    assert tokens.tolist() == [[PAD] * (width - len(r)) + r for r in rows]
    assert mask.tolist() == [[False] * (width - len(r)) + [True] * len(r) for r in rows]


DECODERS = {
    "beam": {"beam_width": 4, "k": 4},
    "xgr": {"beam_width": 4, "k": 4},
    "static": {"beam_width": 4, "k": 4, "constraint": "all"},
    "atspeed_strict": {"beam_width": 4, "k": 4, "draft_beams": 4, "gamma": 1},
}


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_every_model_decoder_reads_a_long_history_by_its_last_items(name):
    items = catalogue((4, 4, 4), 30)
    ctx = random_ctx((4, 4, 4), items, max_items=2, draft=True)
    dec = get_decoder(name)
    params = make_params(dec, DECODERS[name])
    long = [[3, 9, 14, 20, 1, 7], [5, 11, 2, 8, 6]]
    got = dec.decode(ctx, long, params)
    last = dec.decode(ctx, [h[-2:] for h in long], params)
    first = dec.decode(ctx, [h[:2] for h in long], params)
    assert torch.equal(got.codes, last.codes) and torch.equal(got.scores, last.scores)
    assert not torch.equal(got.codes, first.codes)  # the window's choice shows in the answer


def test_eval_ranks_each_user_by_the_most_recent_items(tmp_path):
    from genrec.workloads.data.dataset import load_dataset
    from genrec.workloads.data.synth import SynthConfig, synth_dataset

    cfg = SynthConfig(
        seed=0, num_users=30, num_items=40, levels=3, codebook_size=4, min_history=6, max_history=12
    )
    root, _ = synth_dataset(cfg, tmp_path / "data")
    ds = load_dataset(root)
    ctx = random_ctx(tuple(ds.codec.codebook_sizes), ds.item_codes(), max_items=3)
    out = evaluate(
        ctx, ds, EvalConfig(params={"beam_width": 5}, ks=(5,), batch_size=8, warmup_batches=0), progress=False
    )
    examples = ds.eval_examples("test")
    assert min(len(ex.history) for ex in examples) > 3  # every history is longer than the window
    dec, params = get_decoder("beam"), make_params(get_decoder("beam"), {"beam_width": 5, "k": 5})
    by_recent = dec.decode(ctx, [ex.history[-3:] for ex in examples], params).item_ids.tolist()
    by_oldest = dec.decode(ctx, [ex.history[:3] for ex in examples], params).item_ids.tolist()
    assert out.ranked == by_recent
    assert out.ranked != by_oldest


# --- the same window in training: every target's context is the items just before it ----------------------
SEQUENCES = st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=30), min_size=1, max_size=4)


@settings(max_examples=100, deadline=None)
@given(sequences=SEQUENCES, max_items=st.integers(1, 8))
def test_head_examples_condition_on_the_items_just_before_each_target(sequences, max_items):
    from genrec.workloads.training.nezha_objective import head_examples

    want = [(list(seq[:t])[-max_items:], seq[t]) for seq in sequences for t in range(1, len(seq))]
    assert head_examples(sequences, max_items) == want


@settings(max_examples=100, deadline=None)
@given(sequences=SEQUENCES, max_items=st.integers(1, 8))
def test_training_windows_give_each_target_once_with_the_most_recent_context(sequences, max_items):
    from genrec.workloads.models.inputs import training_windows

    windows = training_windows(sequences, max_items)
    targets = []  # (sequence, position) of every labelled item, from the windows
    position = {}
    for s, seq in enumerate(sequences):
        for t in range(1, len(seq)):
            position.setdefault(s, []).append(t)
    it = iter(windows)
    for s, seq in enumerate(sequences):
        covered = 0
        while covered < len(seq) - 1:
            window, n = next(it)
            end = 1 + covered + n  # the window's last item is seq[end - 1]
            # a contiguous slice ending at its last target, holding at most max_items items before it
            assert window == list(seq[max(0, end - 1 - max_items) : end])
            assert 1 <= n <= len(window) - 1
            targets += [(s, p) for p in range(end - n, end)]
            covered += n
    assert next(it, None) is None
    assert targets == [(s, p) for s, ps in position.items() for p in ps]  # each target exactly once
