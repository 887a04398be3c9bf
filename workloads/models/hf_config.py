"""A Hugging Face config.json (Llama / Mistral / Qwen2 / Qwen3 causal LM) -> our `ModelConfig`.

Pure JSON: no transformers import. Every field either maps onto the model (see the table below),
is known not to change the forward pass (ids, training-only settings, bookkeeping), or is refused by
name, so nothing the checkpoint relies on is silently ignored. What each family means by a field was
read from transformers' own configuration and modeling files (5.x):

    field                      Llama   Mistral  Qwen2        Qwen3
    num_key_value_heads        GQA     GQA      GQA          GQA
    head_dim                   opt.    opt.     opt.         default 128
    attention_bias             q,k,v,o refused  (q,k,v fixed) q,k,v,o
    mlp_bias                   yes     refused  refused      refused
    q/k RMSNorm per head       -       -        -            always
    sliding window             -       caps     caps when    caps when
                                       length   use_sliding  use_sliding
    rope                       default or llama3 (theta from rope_parameters or rope_theta)

A sliding window W only hides keys at distance >= W, so a model whose sequences never exceed W
positions computes exactly full attention: an active window caps `max_seq_len` at W instead of
being refused (the cap is enforced by the model's length check and reported in `notes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from genrec.workloads.errors import UserInputError
from genrec.workloads.models.model_config import ModelConfig

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}

# family defaults for fields a hand-written config.json may leave out (the transformers config classes')
FAMILY_DEFAULTS: dict[str, dict] = {
    "llama": dict(num_key_value_heads=None, max_position_embeddings=2048, head_dim=None),
    "mistral": dict(num_key_value_heads=8, max_position_embeddings=4096 * 32, head_dim=None),
    "qwen2": dict(num_key_value_heads=32, max_position_embeddings=32768, head_dim=None),
    "qwen3": dict(num_key_value_heads=32, max_position_embeddings=32768, head_dim=128),
}
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")

# fields read by hf_model_config (anything in here is either mapped or checked)
HANDLED = frozenset(
    REQUIRED
    + (
        "architectures",
        "model_type",
        "num_key_value_heads",
        "head_dim",
        "hidden_act",
        "max_position_embeddings",
        "rms_norm_eps",
        "tie_word_embeddings",
        "attention_bias",
        "mlp_bias",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "partial_rotary_factor",
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
        "quantization_config",
        "use_mrope",
    )
)
# fields that do not change the eval-mode forward pass: token ids, dropout, training-time and
# bookkeeping settings, generation defaults (those matter to hf_beam, which sets every flag itself)
INERT = frozenset(
    (
        "_name_or_path",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "initializer_range",
        "attention_dropout",
        "use_cache",
        "pretraining_tp",  # a training-time tensor-parallel setting; the forward pass ignores it
        "max_sequence_length",  # LLaMA-1 conversions (LC-Rec's base): unused; max_position_embeddings rules
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "torchscript",
        "use_return_dict",
        "id2label",
        "label2id",
        "problem_type",
        "finetuning_task",
        "tokenizer_class",
        "task_specific_params",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "is_decoder",
        "add_cross_attention",
        "tie_encoder_decoder",
        "pruned_heads",
        "prefix",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "tf_legacy_loss",
        "use_bfloat16",
        "cross_attention_hidden_size",
    )
)
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor")


@dataclass(frozen=True)
class HFConfigSummary:
    """What a config.json maps to, for the import report and result rows."""

    architecture: str
    family: str
    dtype: str | None  # the config's `dtype` / `torch_dtype` (the weights decide)
    notes: tuple[str, ...]  # e.g. a sliding window that caps the sequence length


def _refuse(where: str, problem: str, fix: str) -> UserInputError:
    return UserInputError(f"{where}: {problem}; {fix}")


def config_family(raw: dict, where: str) -> tuple[str, str]:
    """(architecture, family) of a config.json; anything but one supported architecture is refused."""
    archs = raw.get("architectures")
    if not isinstance(archs, list) or len(archs) != 1:
        raise _refuse(
            where,
            f"`architectures` must name one model class, got {archs!r:.100}",
            f"set it to one of {sorted(ARCHITECTURES)}",
        )
    arch = archs[0]
    if arch not in ARCHITECTURES:
        raise _refuse(where, f"unknown architecture {arch!r}", f"genrec imports only {sorted(ARCHITECTURES)}")
    family = ARCHITECTURES[arch]
    if raw.get("model_type", family) != family:
        raise _refuse(
            where,
            f"model_type {raw['model_type']!r} does not match architecture {arch}",
            "fix config.json (model_type and architectures come from the same model class)",
        )
    return arch, family


def _check_fields(raw: dict, family: str, where: str) -> None:
    unknown = sorted(set(raw) - HANDLED - INERT)
    if unknown:
        raise _refuse(
            where,
            f"field(s) {unknown} are not implemented by genrec's {family} import",
            "remove them if they do not change the forward pass; otherwise genrec cannot import it",
        )
    if raw.get("use_mrope"):
        raise _refuse(where, "use_mrope (multimodal rope) is set", "import a text-only model")
    if raw.get("quantization_config") is not None:
        raise _refuse(where, "quantized weights (`quantization_config`)", "import an unquantized checkpoint")
    if raw.get("hidden_act", "silu") != "silu":
        raise _refuse(where, f"hidden_act {raw['hidden_act']!r} (only silu)", "import a SwiGLU/silu model")
    if raw.get("attention_bias") and family in ("mistral", "qwen2"):
        raise _refuse(
            where,
            f"attention_bias is set but {family} models have fixed attention biases",
            "remove attention_bias or use the architecture the checkpoint was trained as",
        )
    if raw.get("mlp_bias") and family != "llama":
        raise _refuse(where, f"mlp_bias is set but {family} models have none", "remove mlp_bias")


def rope_fields(raw: dict, where: str) -> dict:
    """ModelConfig rope fields from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict) or set(params) & {"full_attention", "sliding_attention"}:
        raise _refuse(where, f"rope parameters {params!r:.120} (per-layer rope)", "use one global rope")
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise _refuse(where, f"partial_rotary_factor {partial} (only 1.0)", "import a full-rotary model")
    out = dict(rope_theta=float(theta))
    if rope_type == "default":
        return out
    if rope_type != "llama3":
        raise _refuse(
            where, f"rope type {rope_type!r} is not implemented", "genrec supports default and llama3"
        )
    missing = [k for k in LLAMA3_KEYS if k not in params]
    if missing:
        raise _refuse(where, f"llama3 rope scaling lacks {missing}", "complete rope_parameters")
    original = params.get("original_max_position_embeddings", raw.get("max_position_embeddings"))
    return out | dict(
        rope_type="llama3",
        rope_factor=float(params["factor"]),
        rope_low_freq_factor=float(params["low_freq_factor"]),
        rope_high_freq_factor=float(params["high_freq_factor"]),
        rope_original_max_len=int(original),
    )


def sliding_window(raw: dict, family: str, layers: int) -> int | None:
    """The window an HF model of this family would apply to some layer (None: full attention)."""
    if family == "mistral":
        window = raw.get("sliding_window", 4096)
        types = raw.get("layer_types") or ["sliding_attention"]
    elif family in ("qwen2", "qwen3"):
        window = raw.get("sliding_window", 4096) if raw.get("use_sliding_window", False) else None
        start = raw.get("max_window_layers", 28)
        types = raw.get("layer_types") or [
            "sliding_attention" if i >= start else "full_attention" for i in range(layers)
        ]
    else:
        return None
    return window if window is not None and "sliding_attention" in types else None


def hf_model_config(raw: dict, where: str = "config.json") -> tuple[ModelConfig, HFConfigSummary]:
    """Map a parsed config.json onto ModelConfig, refusing by name what the model does not implement."""
    if not isinstance(raw, dict):
        raise _refuse(
            where, f"expected a JSON object, got {type(raw).__name__}", "use the model's config.json"
        )
    arch, family = config_family(raw, where)
    _check_fields(raw, family, where)
    missing = [k for k in REQUIRED if not isinstance(raw.get(k), int) or raw[k] < 1]
    if missing:
        raise _refuse(where, f"missing or non-positive {missing}", "use the model's complete config.json")
    fam = FAMILY_DEFAULTS[family] | {k: raw[k] for k in FAMILY_DEFAULTS[family] if raw.get(k) is not None}
    heads, layers = raw["num_attention_heads"], raw["num_hidden_layers"]
    bias = bool(raw.get("attention_bias", False))
    max_len = fam["max_position_embeddings"]
    notes = []
    window = sliding_window(raw, family, layers)
    if window is not None and window < max_len:
        notes.append(f"sliding_window {window} caps max_seq_len (full attention within the window)")
        max_len = window
    for layer_type in raw.get("layer_types") or ():
        if layer_type not in ("full_attention", "sliding_attention"):
            raise _refuse(
                where, f"layer type {layer_type!r} is not implemented", "import a full-attention model"
            )
    kwargs = dict(
        vocab_size=raw["vocab_size"],
        dim=raw["hidden_size"],
        n_layers=layers,
        n_heads=heads,
        hidden_dim=raw["intermediate_size"],
        max_seq_len=int(max_len),
        norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        n_kv_heads=fam["num_key_value_heads"] or heads,
        head_dim=fam["head_dim"] or 0,
        qkv_bias=bias or family == "qwen2",
        o_bias=bias,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=family == "qwen3",
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        **rope_fields(raw, where),
    )
    try:
        cfg = ModelConfig(**kwargs)
    except (TypeError, ValueError) as e:
        raise _refuse(where, f"describes no valid model ({e})", "use the model's own config.json") from None
    dtype = raw.get("dtype", raw.get("torch_dtype"))
    return cfg, HFConfigSummary(arch, family, dtype if isinstance(dtype, str) else None, tuple(notes))
