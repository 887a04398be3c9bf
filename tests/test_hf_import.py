"""Importing Hugging Face Llama / Mistral / Qwen2 / Qwen3 folders into our cached model.

Each family's checkpoint is a tiny random model built here by transformers (config + save_pretrained;
no network), with every weight (biases and norms included) drawn at random so each feature moves the
logits. Between them they exercise grouped-query attention, Llama's q/k/v/o and MLP biases with the
llama3 rope scaling and a sharded save, Mistral's sliding window (a length cap), Qwen2's q/k/v biases
with tied embeddings, Qwen3's per-head q/k RMSNorm with a head size not equal to dim / heads.

Checked: full-sequence logits equal transformers' forward (fp32 atol 1e-4; bf16 weights within
BF16_TOL of transformers run in bf16), `extend` with random tree masks equals recomputation
(hypothesis), a cached step-by-step decode equals transformers' full forward, and bad folders
are refused with one line naming the problem.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_extend import random_tree, recompute
from test_model import random_prompts

from genrec.workloads.errors import UserInputError
from genrec.workloads.models.hf_config import hf_model_config
from genrec.workloads.models.hf_import import load_hf_model, read_hf_config

tf = pytest.importorskip("transformers", reason="the peers extra builds the reference checkpoints")

VOCAB = 48
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
FAMILIES = {
    "llama": (
        tf.LlamaConfig,
        tf.LlamaForCausalLM,
        dict(
            attention_bias=True,
            mlp_bias=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=50000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=32,
            ),
        ),
    ),
    "mistral": (tf.MistralConfig, tf.MistralForCausalLM, dict(sliding_window=64, num_key_value_heads=1)),
    "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(head_dim=16, tie_word_embeddings=True)),
}
SHARDED = {"llama"}  # saved in several shards with model.safetensors.index.json
# bf16: logits of magnitude up to ~3 (a bf16 ulp there is 0.016); ours and transformers' bf16 forward agree
# within atol + rtol * |logit| below, and ours is no further from the fp32 logits than 1.5x transformers'
# own bf16 error (measured: ours 0.035-0.058, transformers 0.034-0.064 max abs)
BF16_TOL = dict(atol=6e-2, rtol=2e-2)


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random (HF initialises biases to 0 and norms to 1, which would test nothing)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g)
        p.copy_(1.0 + 0.2 * noise if "norm" in name else 0.15 * noise)


def build_hf(family: str, out, seed: int = 0):
    config_cls, model_cls, extra = FAMILIES[family]
    cfg = config_cls(**(BASE | extra))
    cfg._attn_implementation = "eager"  # fp32 softmax in bf16 too, like ours
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    randomize(model, seed)
    shard = dict(max_shard_size="40KB") if family in SHARDED else {}
    model.save_pretrained(out, **shard)
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> (folder, transformers model, our imported model in fp32)."""
    out = {}
    for i, family in enumerate(FAMILIES):
        folder = tmp_path_factory.mktemp(family)
        hf = build_hf(family, folder, seed=i)
        ours, _ = load_hf_model(folder, dtype="float32")
        out[family] = (folder, hf, ours)
    return out


def hf_logits(hf, tokens, mask):
    """transformers' logits with our positions for left-padded rows (real tokens counted from 0)."""
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return hf(input_ids=tokens, attention_mask=mask.long(), position_ids=pos).logits


def test_hf_import_needs_no_transformers():
    """The import runs where transformers is absent: json + safetensors only."""
    code = (
        "import sys; import genrec.workloads.models.hf_import; "
        "assert 'transformers' not in sys.modules, 'transformers imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_maps_each_feature(checkpoints):
    cfgs = {family: checkpoints[family][2].config for family in FAMILIES}
    assert all(c.n_kv_heads < c.n_heads for c in cfgs.values())
    assert cfgs["llama"].qkv_bias and cfgs["llama"].o_bias and cfgs["llama"].mlp_bias
    assert cfgs["llama"].rope_type == "llama3" and cfgs["llama"].rope_theta == 50000.0
    assert cfgs["qwen2"].qkv_bias and not cfgs["qwen2"].o_bias and cfgs["qwen2"].tie_embeddings
    assert cfgs["qwen3"].qk_norm and cfgs["qwen3"].head_dim == 16 and cfgs["qwen3"].tie_embeddings
    assert cfgs["mistral"].max_seq_len == 64  # the sliding window caps the length
    ours = checkpoints["qwen3"][2]
    assert ours.lm_head.weight is ours.embed_tokens.weight
    folder = checkpoints["llama"][0]
    _, info = load_hf_model(folder)
    assert len(info.files) > 1 and info.family == "llama" and info.dtype == "float32"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_full_sequence_logits_equal_transformers(checkpoints, family):
    _, hf, ours = checkpoints[family]
    rng = np.random.default_rng(1)
    tokens, mask = random_prompts(rng, 3, VOCAB, 12)
    got = ours(tokens, mask)[0]
    ref = hf_logits(hf, tokens, mask)
    assert ref.abs().max() > 1.0  # random weights give logits far from zero
    torch.testing.assert_close(got[mask], ref[mask], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_bf16_weights_stay_bf16_and_match_transformers_in_bf16(checkpoints, family):
    folder, hf, _ = checkpoints[family]
    ours, info = load_hf_model(folder, dtype="bfloat16")
    assert info.dtype == "bfloat16" and ours.embed_tokens.weight.dtype == torch.bfloat16
    hf16 = type(hf)(hf.config).eval()
    hf16.load_state_dict(hf.state_dict())
    hf16.to(torch.bfloat16)
    rng = np.random.default_rng(2)
    tokens, mask = random_prompts(rng, 2, VOCAB, 10)
    got, ref = ours(tokens, mask)[0], hf_logits(hf16, tokens, mask)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got[mask].float(), ref[mask].float(), **BF16_TOL)
    exact = hf_logits(hf, tokens, mask)[mask]
    ours_err, hf_err = (got[mask].float() - exact).abs().max(), (ref[mask].float() - exact).abs().max()
    assert ours_err <= 1.5 * hf_err + 1e-3, (ours_err, hf_err)
    pre = ours.prefill(tokens, mask)  # the cached path runs in bf16 too (fp32 scores inside)
    torch.testing.assert_close(pre.logits.float(), ref[:, -1].float(), **BF16_TOL)
    nxt = torch.tensor([5, 7])
    step = ours.step(nxt, pre.cache.expand(1, 1))
    longer = hf_logits(hf16, torch.cat([tokens, nxt[:, None]], 1), torch.cat([mask, mask[:, -1:]], 1))
    torch.testing.assert_close(step.logits.float(), longer[:, -1].float(), **BF16_TOL)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_cached_step_by_step_decode_equals_the_full_forward(checkpoints, family):
    _, hf, ours = checkpoints[family]
    rng = np.random.default_rng(3)
    beams, steps = 2, 4
    tokens, mask = random_prompts(rng, 2, VOCAB, 7)
    pre = ours.prefill(tokens, mask)
    cache = pre.cache.expand(beams, steps)
    decoded = torch.from_numpy(rng.integers(3, VOCAB, size=(2 * beams, steps)))
    got = [pre.logits.repeat_interleave(beams, 0)]
    for t in range(steps - 1):
        got.append(ours.step(decoded[:, t], cache).logits)
    full = torch.cat([tokens.repeat_interleave(beams, 0), decoded[:, : steps - 1]], 1)
    full_mask = torch.cat([mask.repeat_interleave(beams, 0), torch.ones(2 * beams, steps - 1, dtype=bool)], 1)
    ref = hf_logits(hf, full, full_mask)[:, -steps:]
    torch.testing.assert_close(torch.stack(got, 1), ref, atol=1e-4, rtol=1e-4)


@settings(max_examples=12, deadline=None)
@given(
    family=st.sampled_from(list(FAMILIES)),
    beams=st.integers(1, 3),
    prior=st.integers(0, 2),
    n=st.integers(1, 5),
    seed=st.integers(0, 10_000),
)
def test_extend_with_a_tree_mask_equals_recomputation(checkpoints, family, beams, prior, n, seed):
    ours = checkpoints[family][2]
    rng = np.random.default_rng(seed)
    batch = 2
    rows = batch * beams
    prompt, pmask = random_prompts(rng, batch, VOCAB, 6)
    cache = ours.prefill(prompt, pmask).cache.expand(beams, prior + n)
    steps = torch.from_numpy(rng.integers(3, VOCAB, size=(rows, prior)))
    if prior:
        ours.extend(steps, cache)
    block = torch.from_numpy(rng.integers(3, VOCAB, size=(rows, n)))
    tree = random_tree(rng, rows, n)
    out = ours.extend(block, cache, tree)
    ref = recompute(
        ours, prompt.repeat_interleave(beams, 0), pmask.repeat_interleave(beams, 0), steps, block, tree
    )
    torch.testing.assert_close(out.hidden, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_imported_model_saves_and_loads_as_our_checkpoint(checkpoints, family, tmp_path):
    """An imported model stored as our checkpoint keeps its dtype, tie and every extension field."""
    from genrec.workloads.models.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
    from genrec.workloads.sid_codec import SIDCodec

    ours, _ = load_hf_model(checkpoints[family][0], dtype="bfloat16")
    out = save_checkpoint(tmp_path / "ckpt", Checkpoint(ours, SIDCodec((4, 4)), 5, {"source": "hf"}))
    back = load_checkpoint(out).model
    assert back.config == ours.config and back.embed_tokens.weight.dtype == torch.bfloat16
    assert (back.lm_head.weight is back.embed_tokens.weight) == ours.config.tie_embeddings
    tokens, mask = random_prompts(np.random.default_rng(4), 2, VOCAB, 6)
    assert torch.equal(back(tokens, mask)[0], ours(tokens, mask)[0])


def test_llama_layout_exports_back_to_transformers(checkpoints):
    """hf_bridge.to_hf_llama on an imported Llama (GQA, q/k/v/o and MLP biases, llama3 rope) scores like
    the original; Qwen2/Qwen3 layouts are not Llama and are refused."""
    from genrec.workloads.models.hf_bridge import to_hf_llama

    _, hf, ours = checkpoints["llama"]
    tokens, mask = random_prompts(np.random.default_rng(5), 2, VOCAB, 8)
    back = to_hf_llama(ours, attn_implementation="eager")
    torch.testing.assert_close(hf_logits(back, tokens, mask)[mask], hf_logits(hf, tokens, mask)[mask])
    for family in ("qwen2", "qwen3"):
        with pytest.raises(UserInputError, match="cannot express"):
            to_hf_llama(checkpoints[family][2])


COMMON = dict(hidden_act="silu", initializer_range=0.02, use_cache=True, torch_dtype="bfloat16")
PUBLISHED = {  # the architecture fields of published configs (LC-Rec's base, NEZHA's, MiniOneRec's, ...)
    "llama-7b (LC-Rec, AtSpeed)": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, intermediate_size=11008,
        num_attention_heads=32, num_hidden_layers=32, max_position_embeddings=2048,
        max_sequence_length=2048, rms_norm_eps=1e-6, tie_word_embeddings=False, vocab_size=32000,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, transformers_version="4.28.0.dev0",
    ),
    "llama-3.2-1b (NEZHA)": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", attention_bias=False, head_dim=64,
        hidden_size=2048, intermediate_size=8192, max_position_embeddings=131072, mlp_bias=False,
        num_attention_heads=32, num_hidden_layers=16, num_key_value_heads=8, pretraining_tp=1,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, vocab_size=128256,
        rope_scaling=dict(factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0,
                          original_max_position_embeddings=8192, rope_type="llama3"),
    ),
    "mistral-7b-v0.1": dict(
        architectures=["MistralForCausalLM"], model_type="mistral", hidden_size=4096,
        intermediate_size=14336, max_position_embeddings=32768, num_attention_heads=32,
        num_hidden_layers=32, num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=10000.0,
        sliding_window=4096, tie_word_embeddings=False, vocab_size=32000,
    ),
    "qwen2.5-0.5b (MiniOneRec)": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", attention_dropout=0.0, hidden_size=896,
        intermediate_size=4864, max_position_embeddings=32768, max_window_layers=21,
        num_attention_heads=14, num_hidden_layers=24, num_key_value_heads=2, rms_norm_eps=1e-6,
        rope_theta=1000000.0, sliding_window=32768, tie_word_embeddings=True, use_sliding_window=False,
        vocab_size=151936,
    ),
    "qwen3-0.6b (OpenOneRec family)": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", attention_bias=False, head_dim=128,
        hidden_size=1024, intermediate_size=3072, max_position_embeddings=40960, max_window_layers=28,
        num_attention_heads=16, num_hidden_layers=28, num_key_value_heads=8, rms_norm_eps=1e-6,
        rope_scaling=None, rope_theta=1000000, sliding_window=None, tie_word_embeddings=True,
        use_sliding_window=False, vocab_size=151936,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_configs_map_without_refusals(name):
    cfg, summary = hf_model_config(PUBLISHED[name] | COMMON)
    raw = PUBLISHED[name]
    assert cfg.n_kv_heads == raw.get("num_key_value_heads", raw["num_attention_heads"])
    assert cfg.tie_embeddings == raw["tie_word_embeddings"]
    if name.startswith("mistral"):
        assert cfg.max_seq_len == 4096 and summary.notes
    if name.startswith("llama-3.2"):
        assert cfg.rope_type == "llama3" and cfg.rope_factor == 32.0 and cfg.rope_original_max_len == 8192
    if name.startswith("qwen3"):
        assert cfg.qk_norm and cfg.head_dim == 128 and cfg.dim == 1024


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_beam_and_xgr_agree_on_an_imported_gqa_model(checkpoints, family):
    """The cache-driving decoders run on imported GQA models (xGR's lent per-beam storage has the
    key/value heads); xgr's in-place reorder gives beam's top-K."""
    from genrec.workloads.decoding.base import DecoderContext, get_decoder, make_params
    from genrec.workloads.sid_codec import SIDCodec

    codec = SIDCodec((4, 5, 3))
    assert codec.vocab_size <= VOCAB
    rng = np.random.default_rng(6)
    codes = codec.keys_to_codes(rng.choice(codec.num_sids, 30, replace=False))
    ctx = DecoderContext(checkpoints[family][2], codec, codes, 4)
    hist = [[1, 2], [3], [4, 5, 6]]
    out = {}
    for name in ("beam", "xgr"):
        dec = get_decoder(name)
        out[name] = dec.decode(ctx, hist, make_params(dec, {"beam_width": 8, "k": 4}))
    assert np.array_equal(np.asarray(out["beam"].codes), np.asarray(out["xgr"].codes))


# --- bad input --------------------------------------------------------------------------------------
def copy_folder(checkpoints, family, tmp_path):
    dst = tmp_path / family
    shutil.copytree(checkpoints[family][0], dst)
    return dst


def edit_config(folder, **changes):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    path.write_text(json.dumps(cfg))


def refused(folder, *needles):
    with pytest.raises(UserInputError) as e:
        load_hf_model(folder)
    msg = str(e.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg


def test_missing_shard_is_refused(checkpoints, tmp_path):
    folder = copy_folder(checkpoints, "llama", tmp_path)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    (folder / shard).unlink()
    refused(folder, "missing shard", shard)


def test_unknown_architecture_and_fields_are_refused_by_name(checkpoints, tmp_path):
    folder = copy_folder(checkpoints, "qwen3", tmp_path)
    edit_config(folder, architectures=["GemmaForCausalLM"])
    refused(folder, "unknown architecture", "GemmaForCausalLM")
    cases = [
        (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}), "yarn"),
        (dict(use_sliding_window=True, sliding_window=16, max_window_layers=0, layer_types=None), None),
        (dict(attn_logit_softcapping=30.0), "attn_logit_softcapping"),
        (dict(hidden_act="gelu"), "gelu"),
        (dict(mlp_bias=True), "mlp_bias"),
        (dict(quantization_config={"quant_method": "gptq"}), "quantization_config"),
        (dict(layer_types=["full_attention", "chunked_attention"]), "chunked_attention"),
    ]
    for changes, needle in cases:
        folder = copy_folder(checkpoints, "qwen3", tmp_path / needle if needle else tmp_path / "sw")
        edit_config(folder, **changes)
        if needle is None:  # an active window is exact within it: the length is capped, and said so
            model, info = load_hf_model(folder)
            assert model.config.max_seq_len == 16 and "sliding_window 16" in info.notes[0]
        else:
            refused(folder, needle)
    folder = copy_folder(checkpoints, "mistral", tmp_path / "mistral_bias")
    edit_config(folder, attention_bias=True)
    refused(folder, "attention_bias", "mistral")


def test_vocabulary_size_that_the_weights_lack_is_refused(checkpoints, tmp_path):
    folder = copy_folder(checkpoints, "qwen2", tmp_path)
    edit_config(folder, vocab_size=VOCAB + 8)
    refused(folder, f"vocab_size {VOCAB + 8}", f"{VOCAB} rows")


def test_unreadable_or_absent_weights_are_refused(checkpoints, tmp_path):
    folder = copy_folder(checkpoints, "qwen3", tmp_path)
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    refused(folder, "model.safetensors", "not a readable safetensors file")
    (folder / "model.safetensors").unlink()
    refused(folder, "no model.safetensors")
    (folder / "config.json").unlink()
    with pytest.raises(UserInputError, match="no config.json"):
        read_hf_config(folder)
