"""Our model and beam search against Hugging Face transformers on the same weights (peers extra)."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from genrec.workloads.decoding.base import DecoderContext, get_decoder, make_params  # noqa: E402
from genrec.workloads.decoding.hf_beam import SIDLevelMask, generate_sid_beams  # noqa: E402
from genrec.workloads.models.hf_bridge import to_hf_llama  # noqa: E402
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.transformer import GRTransformer  # noqa: E402
from genrec.workloads.sid_codec import SIDCodec  # noqa: E402

# HF fills beams that have no real candidate with scores near -1e9; ours uses -inf
REAL = -1e8


def random_model(codec: SIDCodec, seed: int, std: float = 0.5, **kw) -> GRTransformer:
    torch.manual_seed(seed)
    cfg = dict(dim=32, n_layers=2, n_heads=4, max_seq_len=128) | kw
    model = GRTransformer(ModelConfig(vocab_size=codec.vocab_size, **cfg))
    for p in model.parameters():  # far from uniform, so beam search has real choices to make
        torch.nn.init.normal_(p, std=std)
    return model.eval()


def make_ctx(sizes, seed, max_items=5) -> DecoderContext:
    codec = SIDCodec(tuple(sizes))
    rng = np.random.default_rng(seed)
    keys = rng.choice(codec.num_sids, size=min(60, codec.num_sids), replace=False)
    return DecoderContext(random_model(codec, seed), codec, codec.keys_to_codes(keys), max_items)


def random_histories(ctx: DecoderContext, batch: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    n = len(ctx.item_codes)
    return [rng.integers(0, n, size=rng.integers(1, ctx.max_items + 3)).tolist() for _ in range(batch)]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_hf_llama_logits_equal_ours_on_left_padded_batches(attn):
    ctx = make_ctx((8, 8, 8), seed=1)
    tokens, mask = ctx.prompts(random_histories(ctx, 5, seed=2))
    assert not bool(mask.all()), "the batch should contain left padding"
    hf = to_hf_llama(ctx.model, attn_implementation=attn)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours, _ = ctx.model(tokens, mask)
        theirs = hf(input_ids=tokens, attention_mask=mask.long(), position_ids=positions).logits
    torch.testing.assert_close(theirs[mask], ours[mask], atol=1e-4, rtol=1e-4)


def test_processor_keeps_only_the_level_of_each_step():
    codec = SIDCodec((3, 4))
    proc = SIDLevelMask(codec, prompt_len=5)
    scores = torch.zeros(2, codec.vocab_size)
    for step in range(codec.levels):
        out = proc(torch.zeros(2, 5 + step, dtype=torch.long), scores)
        start, end = codec.level_range(step)
        assert torch.isfinite(out[:, start:end]).all()
        assert torch.isinf(out).sum() == 2 * (codec.vocab_size - (end - start))
    with pytest.raises(ValueError):
        proc(torch.zeros(2, 5 + codec.levels, dtype=torch.long), scores)


def assert_same_top_k(codes, scores, ref_codes, ref_scores, tol=1e-4):
    """Same scores (where real) and same SIDs up to ties in score."""
    real = ref_scores > REAL
    assert torch.equal(real, scores > REAL)
    torch.testing.assert_close(scores[real], ref_scores[real], atol=tol, rtol=tol)
    for b in range(codes.shape[0]):
        for j in range(codes.shape[1]):
            if not real[b, j] or torch.equal(codes[b, j], ref_codes[b, j]):
                continue
            tied = torch.nonzero((ref_scores[b] - scores[b, j]).abs() < tol)[:, 0]
            assert any(torch.equal(codes[b, j], ref_codes[b, i]) for i in tied), (b, j)


@pytest.mark.parametrize(
    ("sizes", "width", "k"),
    [
        ((8, 8, 8), 1, 1),
        ((8, 8, 8), 4, 3),
        ((8, 8, 8), 10, 10),
        ((6, 5, 7, 4), 16, 8),
        ((3, 9, 9), 7, 5),
        ((2, 2), 8, 6),
    ],
)
def test_hf_beam_search_matches_ours(sizes, width, k):
    ctx = make_ctx(sizes, seed=width)
    hist = random_histories(ctx, 4, seed=k)
    tokens, mask = ctx.prompts(hist)
    beam = get_decoder("beam")
    res = beam.decode(ctx, hist, make_params(beam, {"beam_width": width, "k": k}))
    codes, scores = generate_sid_beams(to_hf_llama(ctx.model), ctx.codec, tokens, mask, width, k)
    assert codes.shape == res.codes.shape and scores.shape == res.scores.shape
    assert_same_top_k(codes, scores, res.codes, res.scores)
    assert int((res.scores > REAL).sum()) == 4 * min(k, int(np.prod(sizes)))
