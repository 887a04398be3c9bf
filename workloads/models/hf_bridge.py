"""Our GRTransformer as a Hugging Face `LlamaForCausalLM`, for side-by-side peer comparisons.

The weights share the Llama layout, so the bridge only renames the top-level keys (our
`embed_tokens`, `layers.N`, `norm` live under HF's `model.` prefix; `lm_head` stays) and builds
the equivalent `LlamaConfig` (for our own models: no biases, untied head, MHA, default RoPE with the
same theta; imported Llama-layout models keep their GQA, biases, tie and llama3 rope).

Semantic-ID beam search with HF generate on the exported copy is `decoding/hf_beam.py`
(`generate_sid_beams`: every generation flag set explicitly, only level s's tokens at step s).

transformers is an optional dependency (the `peers` extra) and is imported only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from genrec.workloads.errors import UserInputError
from genrec.workloads.models.transformer import GRTransformer, ModelConfig
from genrec.workloads.sid_codec import BOS, PAD

if TYPE_CHECKING:  # pragma: no cover - typing only
    from transformers import LlamaForCausalLM

# "sdpa" and "eager" both reproduce our logits on left-padded batches (tests/test_hf_peer.py);
# sdpa is what HF picks by default and is its faster CPU path, so it is the fair peer.
DEFAULT_ATTN = "sdpa"


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise UserInputError("install the peers extra: pip install -e '.[peers]'") from e
    return transformers


def hf_state_dict(model: GRTransformer) -> dict[str, torch.Tensor]:
    """Our state dict under HF Llama key names."""
    out = {}
    for key, value in model.state_dict().items():
        out[key if key.startswith("lm_head.") else f"model.{key}"] = value
    return out


def llama_config_kwargs(cfg: ModelConfig) -> dict:
    """LlamaConfig arguments equivalent to our config; what Llama cannot express is refused.

    Grouped-query attention, an explicit head size, q/k/v/o biases (together: Llama's
    `attention_bias`), MLP biases, tied embeddings and the llama3 rope scaling all map; a per-head
    q/k norm (Qwen3) or q/k/v biases without an output bias (Qwen2) are other families."""
    if cfg.qk_norm or cfg.qkv_bias != cfg.o_bias:
        raise UserInputError(
            "this model has a q/k norm or q/k/v biases without an output bias (Qwen3/Qwen2 layout), "
            "which LlamaForCausalLM cannot express; compare it against its original Hugging Face folder"
        )
    rope = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta}
    if cfg.rope_type == "llama3":
        rope |= {
            "factor": cfg.rope_factor,
            "low_freq_factor": cfg.rope_low_freq_factor,
            "high_freq_factor": cfg.rope_high_freq_factor,
            "original_max_position_embeddings": cfg.rope_original_max_len,
        }
    return dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=cfg.hidden_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_parameters=rope,
        tie_word_embeddings=cfg.tie_embeddings,
        attention_bias=cfg.qkv_bias,
        mlp_bias=cfg.mlp_bias,
    )


def to_hf_llama(model: GRTransformer, attn_implementation: str = DEFAULT_ATTN) -> LlamaForCausalLM:
    """An equivalent `LlamaForCausalLM` on the same device and dtype, weights copied, eval mode."""
    tf = _transformers()
    hf_cfg = tf.LlamaConfig(
        **llama_config_kwargs(model.config),
        attention_dropout=0.0,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=None,  # SIDs have a fixed length; nothing ends a beam early
        use_cache=True,
    )
    hf_cfg._attn_implementation = attn_implementation
    param = next(model.parameters())
    hf = tf.LlamaForCausalLM(hf_cfg)
    hf.load_state_dict(hf_state_dict(model), strict=True)
    hf.to(device=param.device, dtype=param.dtype)
    hf.generation_config.pad_token_id = PAD
    hf.generation_config.bos_token_id = BOS
    hf.generation_config.eos_token_id = None
    return hf.eval()
