"""Our GRTransformer as a Hugging Face `LlamaForCausalLM`, for side-by-side peer comparisons.

The weights share the Llama layout, so the bridge only renames the top-level keys (our
`embed_tokens`, `layers.N`, `norm` live under HF's `model.` prefix; `lm_head` stays) and builds
the equivalent `LlamaConfig` (for our own models: no biases, untied head, MHA, default RoPE with the
same theta; imported Llama-layout models keep their GQA, biases, tie and llama3 rope).

Semantic-ID beam search in HF is `generate(num_beams=W)` with `SIDLevelLogitsProcessor`, which
keeps only the tokens of SID level s at generation step s. HF beam search applies logits
processors to the *log-softmax* of the logits (`_beam_search`, read in transformers 5.23), so the
scores are the full-vocabulary log-probabilities restricted to a level: the same scores as our
`beam` decoder. With `length_penalty=0.0` HF's `sequences_scores` are the plain sums.

transformers is an optional dependency (the `peers` extra) and is imported only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from genrec.workloads.errors import UserInputError
from genrec.workloads.models.transformer import GRTransformer, ModelConfig
from genrec.workloads.sid_codec import BOS, PAD, SIDCodec

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


class SIDLevelLogitsProcessor:
    """A HF logits processor keeping only SID level s's tokens at generation step s (others -inf).

    Step s is `input_ids.shape[1] - prompt_len` (prompt_len = the padded batch width). HF calls
    processors through `LogitsProcessorList`, which only needs `__call__(input_ids, scores)`, so
    this is a plain class and needs no transformers import. It works on logits (greedy) and on
    log-probabilities (beam search) alike.
    """

    def __init__(self, codec: SIDCodec, prompt_len: int) -> None:
        self.codec, self.prompt_len = codec, prompt_len
        self._keep: dict[tuple[int, int, torch.device], torch.Tensor] = {}

    def _mask(self, step: int, vocab: int, device: torch.device) -> torch.Tensor:
        key = (step, vocab, device)
        if key not in self._keep:
            keep = torch.zeros(vocab, dtype=torch.bool, device=device)
            # the level's token ids: one range for our layout, any set for an imported table (no gaps)
            keep[torch.as_tensor(self.codec.level_allowed_ids(step), device=device)] = True
            self._keep[key] = keep
        return self._keep[key]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_len
        if not 0 <= step < self.codec.levels:
            raise ValueError(f"generation step {step} outside the {self.codec.levels} SID levels")
        return scores.masked_fill(~self._mask(step, scores.shape[-1], scores.device), float("-inf"))


# beams HF pads with copies scored near -1e9 (it starts all beams but the first there); ours are -inf
REAL_SCORE = -1e8


@torch.no_grad()
def hf_beam_search(
    hf_model: LlamaForCausalLM,
    codec: SIDCodec,
    tokens: torch.Tensor,
    mask: torch.Tensor,
    beam_width: int,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF `generate` beam search over SIDs: (codes [B, K, L], scores [B, K]) best first.

    Scores are summed log-probabilities (length_penalty=0). When level 1 has fewer than
    `beam_width` codes, HF fills the spare beams with copies scored near -1e9 (it starts every
    beam but the first at -1e9), where our decoder uses -inf.
    """
    tf = _transformers()
    if not 1 <= k <= beam_width:
        raise UserInputError(f"k must be between 1 and beam_width ({beam_width}), got {k}")
    b, prompt_len = tokens.shape
    levels = codec.levels
    # beam-only flags: HF warns about them when num_beams == 1 (greedy search)
    beam_flags = dict(length_penalty=0.0, early_stopping=True) if beam_width > 1 else {}
    gen_cfg = tf.GenerationConfig(
        num_beams=beam_width,
        num_return_sequences=k,
        max_new_tokens=levels,
        min_new_tokens=levels,  # inert without an eos token; states the fixed length
        do_sample=False,
        **beam_flags,  # length_penalty 0: sequences_scores are plain sums of log-probabilities
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=None,
        use_cache=True,
        return_dict_in_generate=True,
        output_scores=beam_width > 1,
        output_logits=beam_width == 1,
    )
    out = hf_model.generate(
        input_ids=tokens,
        attention_mask=mask.long(),
        generation_config=gen_cfg,
        logits_processor=tf.LogitsProcessorList([SIDLevelLogitsProcessor(codec, prompt_len)]),
    )
    new = out.sequences[:, prompt_len:]
    if new.shape[1] != levels:
        raise RuntimeError(f"HF generated {new.shape[1]} tokens, expected {levels}")
    codes = codec.tokens_to_codes(new).view(b, k, levels)
    if beam_width == 1:  # HF runs greedy search: no sequences_scores, and `scores` are processed logits
        logp = torch.stack([torch.log_softmax(x.float(), dim=-1) for x in out.logits], dim=1)  # [B, L, V]
        scores = logp.gather(-1, new[..., None]).squeeze(-1).sum(-1)
        return codes, scores.view(b, k)
    return codes, out.sequences_scores.view(b, k).float()
