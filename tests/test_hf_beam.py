"""The `hf_beam` decoder (HF generate(num_beams) on the same weights) against `beam` and `xgr`: same
top-K scores and SIDs up to ties, missing slots reported alike, its parameters checked."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from genrec.workloads.decoding.base import (  # noqa: E402
    DecoderContext,
    decoder_names,
    get_decoder,
    make_params,
)
from genrec.workloads.decoding.hf_beam import hf_copy  # noqa: E402
from genrec.workloads.errors import UserInputError  # noqa: E402
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.transformer import GRTransformer  # noqa: E402
from genrec.workloads.sid_codec import SIDCodec  # noqa: E402


def make_ctx(sizes, seed, max_items=5) -> DecoderContext:
    codec = SIDCodec(tuple(sizes))
    torch.manual_seed(seed)
    model = GRTransformer(
        ModelConfig(vocab_size=codec.vocab_size, dim=32, n_layers=2, n_heads=4, max_seq_len=128)
    )
    for p in model.parameters():  # far from uniform, so the searches have real choices to make
        torch.nn.init.normal_(p, std=0.5)
    rng = np.random.default_rng(seed)
    keys = rng.choice(codec.num_sids, size=min(60, codec.num_sids), replace=False)
    return DecoderContext(model.eval(), codec, codec.keys_to_codes(keys), max_items)


def histories(ctx: DecoderContext, batch: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    n = len(ctx.item_codes)
    return [rng.integers(0, n, size=rng.integers(1, ctx.max_items + 3)).tolist() for _ in range(batch)]


def decode(ctx, name, hist, **values):
    dec = get_decoder(name)
    return dec.decode(ctx, hist, make_params(dec, values))


def assert_same_top_k(res, ref, tol=1e-4):
    """Same scores position by position (missing slots -inf in both), same SIDs up to ties."""
    assert res.codes.shape == ref.codes.shape
    real = torch.isfinite(ref.scores)
    assert torch.equal(real, torch.isfinite(res.scores))
    torch.testing.assert_close(res.scores[real], ref.scores[real], atol=tol, rtol=tol)
    assert torch.equal(res.codes[~real], ref.codes[~real])  # missing: code -1 in both
    assert torch.equal(res.valid[~real], ref.valid[~real])
    for b, j in torch.nonzero(real).tolist():
        if torch.equal(res.codes[b, j], ref.codes[b, j]):
            assert res.item_ids[b, j] == ref.item_ids[b, j] and res.valid[b, j] == ref.valid[b, j]
            continue
        tied = torch.nonzero((ref.scores[b] - res.scores[b, j]).abs() < tol)[:, 0]
        assert any(torch.equal(res.codes[b, j], ref.codes[b, i]) for i in tied), (b, j)


@pytest.mark.parametrize(
    ("sizes", "width", "k"),
    [
        ((8, 8, 8), 4, 3),
        ((8, 8, 8), 32, 10),  # the serving comparison's width: more beams than level-1 codes
        ((6, 5, 7, 4), 16, 16),
        ((2, 2), 8, 8),  # only 4 SIDs exist: slots 5..8 are missing in both
    ],
)
def test_hf_beam_returns_beams_top_k(sizes, width, k):
    ctx = make_ctx(sizes, seed=width)
    hist = histories(ctx, 4, seed=k)
    ref = decode(ctx, "beam", hist, beam_width=width, k=k)
    res = decode(ctx, "hf_beam", hist, beam_width=width, k=k)
    assert_same_top_k(res, ref)
    assert res.counters["missing"] == ref.counters["missing"]
    assert set(res.timings_ms) >= {"system", "decode"}


def test_hf_beam_agrees_with_xgr_at_the_serving_width():
    ctx = make_ctx((16, 16, 16), seed=7, max_items=8)
    hist = histories(ctx, 6, seed=1)
    assert_same_top_k(
        decode(ctx, "hf_beam", hist, beam_width=32, k=10), decode(ctx, "xgr", hist, beam_width=32, k=10)
    )


def test_hf_beam_is_registered_and_copies_the_model_once():
    assert "hf_beam" in decoder_names()
    ctx = make_ctx((4, 4), seed=0)
    assert hf_copy(ctx.model, "sdpa") is hf_copy(ctx.model, "sdpa")
    assert hf_copy(ctx.model, "eager") is not hf_copy(ctx.model, "sdpa")


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"beam_width": 4, "k": 5}, "larger than the beam width"),
        ({"beam_width": 0, "k": 1}, "beam_width"),
        ({"attn_implementation": "flash"}, "attn_implementation"),
        ({"constraint": "all"}, "no parameter"),  # HF's search has no constraint index
    ],
)
def test_hf_beam_parameters_are_checked(values, match):
    with pytest.raises(UserInputError, match=match):
        make_params(get_decoder("hf_beam"), values)
