"""The decode buffer pool (issue 36, item 4): a buffer lent to one decode is never lent to another
before it comes back, under any order of acquires and releases and from many threads at once; two
`xgr` decodes running at the same time (as threaded Serve replicas run them) answer what the same
decodes answer one after the other."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.decoding.base import DecoderContext, get_decoder, make_params
from genrec.workloads.decoding.buffer_pool import BufferPool
from genrec.workloads.models.transformer import GRTransformer, ModelConfig
from genrec.workloads.sid_codec import SIDCodec


@dataclass(eq=False)
class Buffer:
    """A stand-in for a decode's buffers: which key it was built for."""

    key: str


class ExclusivePool(BufferPool):
    """The real pool, watched: records every time a buffer is lent while it is already lent."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lent: set[int] = set()
        self.violations: list[str] = []
        self.watch = threading.Lock()

    def acquire(self, key, build):
        value = super().acquire(key, build)
        with self.watch:
            if id(value) in self.lent:
                self.violations.append(f"buffer of {key} lent twice")
            self.lent.add(id(value))
        return value

    def release(self, key, value) -> None:
        with self.watch:
            self.lent.discard(id(value))
        super().release(key, value)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from("abcd")),
        st.tuples(st.just("release"), st.integers(0, 1_000)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, max_keys=st.integers(1, 3), max_free=st.integers(1, 3))
def test_a_lent_buffer_is_never_lent_again_before_it_is_returned(ops, max_keys, max_free):
    pool = BufferPool(max_keys=max_keys, max_free_per_key=max_free)
    lent: list[Buffer] = []  # out on loan now
    acquires = 0
    for op, arg in ops:
        if op == "acquire":
            got = pool.acquire(arg, lambda key=arg: Buffer(key))
            acquires += 1
            assert got.key == arg  # a buffer only serves the shape it was built for
            assert all(got is not other for other in lent)
            lent.append(got)
        elif lent:
            back = lent.pop(arg % len(lent))
            pool.release(back.key, back)
            # the next request of that shape gets a kept buffer (nothing built), never a lent one
            built = pool.built
            again = pool.acquire(back.key, lambda key=back.key: Buffer(key))
            assert pool.built == built and again.key == back.key
            assert all(again is not other for other in lent)
            pool.release(back.key, again)
        assert pool.built <= acquires


def test_threads_never_share_a_lent_buffer():
    pool = ExclusivePool(max_keys=2, max_free_per_key=2)
    start = threading.Barrier(6)

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        start.wait()
        for _ in range(300):
            key = "ab"[int(rng.integers(0, 2))]
            value = pool.acquire(key, lambda key=key: Buffer(key))
            assert value.key == key
            time.sleep(0)  # hold it while the others run
            pool.release(key, value)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not pool.violations, pool.violations[:3]


# --- two decodes at once ----------------------------------------------------------------------------------
def make_ctx(seed: int) -> DecoderContext:
    codec = SIDCodec((8, 8, 8))
    rng = np.random.default_rng(seed)
    codes = codec.keys_to_codes(rng.choice(codec.num_sids, size=300, replace=False))
    torch.manual_seed(seed)
    model = GRTransformer(
        ModelConfig(vocab_size=codec.vocab_size, dim=16, n_layers=1, n_heads=2, max_seq_len=64)
    )
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return DecoderContext(model.eval(), codec, codes, 4, popularity=rng.integers(0, 50, len(codes)))


def snapshot(res) -> tuple[torch.Tensor, ...]:
    return tuple(x.clone() for x in (res.codes, res.item_ids, res.valid, res.scores))


def same(res, snap: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(x, y) for x, y in zip((res.codes, res.item_ids, res.valid, res.scores), snap))


@pytest.mark.parametrize("constraint", ["none", "all"])  # dense levels write the lent selection outputs
def test_concurrent_xgr_decodes_equal_serial_ones(constraint):
    """Two threads decode requests of one shape (same batch, same BW: the same pooled buffers) at once,
    on a fresh context (so they also build its buffers and constraint index concurrently): every answer
    equals the same request decoded serially on an identical context, and no buffer is lent twice. All
    answers are compared after every decode has run: one that aliased a lent buffer would show too."""
    dec = get_decoder("xgr")
    params = make_params(dec, {"beam_width": 24, "k": 6, "constraint": constraint})
    rng = np.random.default_rng(0)
    requests = [[rng.integers(0, 300, 3).tolist() for _ in range(2)] for _ in range(8)]
    reference = make_ctx(seed=4)
    serial, kept = [], []  # the answers, and copies taken as each came back
    for hist in requests:
        serial.append(dec.decode(reference, hist, params))
        kept.append(snapshot(serial[-1]))

    ctx = make_ctx(seed=4)
    ctx.buffers = ExclusivePool()
    answers: dict[int, object] = {}
    start = threading.Barrier(2)

    def worker(part: int) -> None:
        start.wait()
        for i in range(part, len(requests), 2):
            answers[i] = dec.decode(ctx, requests[i], params)

    threads = [threading.Thread(target=worker, args=(part,)) for part in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not ctx.buffers.violations, ctx.buffers.violations[:3]
    for i in range(len(requests)):
        assert same(serial[i], kept[i]), f"serial answer {i} changed after later decodes"
        assert same(answers[i], kept[i]), f"threaded answer {i} differs from the serial one"
