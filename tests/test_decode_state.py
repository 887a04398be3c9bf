"""decode_state_bytes (a pure function of the config) against the tensors really held: our KVCache after
prefill + expand on a GQA model (fp32 and bf16), and transformers' cache for the same rows."""

from __future__ import annotations

import pytest
import torch

from genrec.workloads.models.decode_state import decode_state_bytes
from genrec.workloads.models.transformer import GRTransformer, ModelConfig

CFG = ModelConfig(vocab_size=40, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=12, max_seq_len=64)


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("indexed", [True, False])
def test_our_cache_holds_exactly_the_computed_bytes(dtype, indexed):
    torch.manual_seed(0)
    model = GRTransformer(CFG).to(dtype).eval()
    users, beams, s, steps = 3, 5, 7, 3
    tokens = torch.randint(3, 40, (users, s))
    mask = torch.ones(users, s, dtype=torch.bool)
    mask[0, :2] = False
    cache = model.prefill(tokens, mask).cache.expand(beams, steps, indexed=indexed)
    got = decode_state_bytes(
        CFG, users=users, beams=beams, prompt_len=s, steps=steps, elem_bytes=dtype.itemsize, indexed=indexed
    )
    prompt = [*cache.prefix_k, *cache.prefix_v, cache.prefix_mask, cache.prefix_len]
    assert got.shared_prompt == nbytes(prompt)
    assert got.per_beam == nbytes([*cache.beam_k, *cache.beam_v])
    assert got.row_table == (nbytes([cache.beam_rows]) if indexed else 0)


def test_transformers_cache_holds_the_computed_per_beam_bytes():
    tf = pytest.importorskip("transformers")
    hf_cfg = tf.Qwen3Config(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=CFG.n_layers,
        num_attention_heads=CFG.n_heads,
        num_key_value_heads=CFG.n_kv_heads,
        head_dim=CFG.head_dim,
    )
    hf = tf.Qwen3ForCausalLM(hf_cfg).eval()
    users, beams, s, steps = 2, 4, 6, 3
    rows = torch.randint(3, 40, (users * beams, s + steps))  # a beam search's rows after `steps` steps
    with torch.no_grad():
        cache = hf(input_ids=rows, use_cache=True).past_key_values
    held = nbytes([t for layer in cache.layers for t in (layer.keys, layer.values)])
    got = decode_state_bytes(CFG, users=users, beams=beams, prompt_len=s, steps=steps, elem_bytes=4)
    assert got.hf_per_beam == held
    assert got.hf_reorder_transient == held // CFG.n_layers


def test_qwen3_shaped_model_at_beam_width_512():
    """Qwen3-0.6B's attention shape (28 layers, 8 key/value heads of 128) in bf16, a 256-token prompt,
    a 4-level SID (3 cached steps): the shared prompt makes the decode state ~70x smaller than HF's."""
    cfg = ModelConfig(vocab_size=151_936, dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128)
    got = decode_state_bytes(cfg, users=1, beams=512, prompt_len=256, steps=3)
    per_token = 2 * 28 * 8 * 128 * 2
    assert got.hf_per_beam == 512 * 259 * per_token
    assert got.per_beam == 512 * 3 * per_token and 60 < got.ratio < 80
    assert got.to_dict()["ours"] == got.ours
    with pytest.raises(ValueError):
        decode_state_bytes(cfg, users=0, beams=512, prompt_len=256, steps=3)
