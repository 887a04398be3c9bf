"""The fused decode forms (transformer_blocks.fused_ok: fp32 on a CPU, no autograd) give the unfused
result bit for bit: prefill, the cache and every step, on our plain model and on an imported-style one
(GQA, q/k RMSNorm, q/k/v biases, llama3 RoPE), inside and outside inference mode. Also RoPE's rolled
form against rotate-half."""

from unittest import mock

import pytest
import torch

from genrec.kernels import shared_prefix_attention as spa
from genrec.workloads.models import transformer, transformer_blocks
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.models.transformer_blocks import RopeTables

CONFIGS = {
    "plain": dict(),
    "imported": dict(
        n_kv_heads=2, head_dim=8, qkv_bias=True, o_bias=True, mlp_bias=True, qk_norm=True, rope_type="llama3"
    ),
}


def model_of(kind: str, seed: int = 0) -> GRTransformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4, max_seq_len=128, **CONFIGS[kind])
    model = GRTransformer(cfg).eval()
    with torch.no_grad():  # norms and biases away from their initial 1 / 0, so every weight matters
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    return model


def decode(model: GRTransformer, fused: bool) -> list[torch.Tensor]:
    """Prefill of left-padded prompts, then three steps of 3 beams with a reorder: every output."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(3, 50, (3, 9), generator=gen)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[0, :4] = mask[1, :1] = False
    with mock.patch.object(transformer_blocks, "fused_ok", lambda x: fused and x.dtype == torch.float32):
        with mock.patch.object(transformer, "fused_ok", transformer_blocks.fused_ok):
            out = model.prefill(tokens, mask)
            cache = out.cache.expand(3, 3)
            seen = [out.logits, out.hidden, *out.cache.prefix_k, *out.cache.prefix_v]
            for _ in range(3):
                step = model.step(torch.randint(3, 50, (9,), generator=gen), cache)
                cache.reorder(torch.randperm(9, generator=gen))
                seen += [step.logits, step.hidden]
    return seen + [k[:, :, :3] for k in cache.beam_k + cache.beam_v]


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_fused_decode_equals_unfused_bit_for_bit(kind):
    model = model_of(kind)
    fused, plain = decode(model, True), decode(model, False)
    assert len(fused) == len(plain)
    for i, (a, b) in enumerate(zip(fused, plain)):
        assert torch.equal(a, b), f"output {i} differs by {(a - b).abs().max().item()}"


def test_fused_forms_only_without_autograd_on_cpu_fp32():
    x = torch.zeros(2, 3)
    with torch.no_grad():
        assert transformer_blocks.fused_ok(x)
        assert not transformer_blocks.fused_ok(x.bfloat16())
    assert not transformer_blocks.fused_ok(x)  # training keeps the unfused forms (their gradients)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rolled_rope_equals_rotate_half(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 5, 16, generator=gen).to(dtype)
    pos = torch.randint(0, 100, (4, 5), generator=gen)
    inv_freq = transformer_blocks.rope_inv_freq(16, 10_000.0)
    cos, sin = transformer_blocks.rope_cos_sin(pos, 16, 10_000.0, inv_freq)
    cos, sin = cos[:, None].to(dtype), sin[:, None].to(dtype)
    x1, x2 = x.chunk(2, dim=-1)
    want = x * cos + torch.cat([-x2, x1], dim=-1) * sin
    assert torch.equal(RopeTables.at(pos, inv_freq, dtype).apply(x), want)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_a_decode_in_inference_mode_equals_one_outside_it(kind):
    """Serving, sweeps and the GPU drivers decode under torch.inference_mode, whose tensors have no
    version counter (a prompt-mask cache keyed by it raised there)."""
    model = model_of(kind)
    with torch.inference_mode():
        inside = decode(model, True)
    for i, (a, b) in enumerate(zip(inside, decode(model, True))):
        assert torch.equal(a, b), f"output {i} differs"
    assert torch.equal(
        spa.prefix_bias(torch.tensor([[True, False, True]]), torch.float64)[0, 0, 0],
        torch.tensor([0.0, float("-inf"), 0.0], dtype=torch.float64),
    )


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_prefill_of_the_last_position_only(kind):
    """prefill runs the last layer's attention output, projection and MLP for the last position only:
    the same cache bit for bit and the same last hidden state and logits as the all-positions run (to
    rounding: a product over fewer rows may take another kernel)."""
    model = model_of(kind)
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(3, 50, (3, 9), generator=gen)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[0, :4] = mask[2, :2] = False
    with torch.no_grad():
        last, every = model.prefill(tokens, mask), model.prefill(tokens, mask, return_all_hidden=True)
        reference = model(tokens, mask)
    assert every.all_hidden is not None and last.all_hidden is None
    for a, b in zip(last.cache.prefix_k + last.cache.prefix_v, every.cache.prefix_k + every.cache.prefix_v):
        assert torch.equal(a, b)
    torch.testing.assert_close(last.hidden, every.hidden, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(last.hidden, reference[1][:, -1], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(last.logits, reference[0][:, -1], atol=1e-5, rtol=1e-5)
