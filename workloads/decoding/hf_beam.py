"""`hf_beam`: Hugging Face `generate(num_beams)` on the same weights, as a registered decoder.

The peer of `xgr` in the serving comparison (issue 17): the checkpoint is copied once per model into an
equivalent `LlamaForCausalLM` (models/hf_bridge.py) (an imported checkpoint instead loads its original HF
folder with transformers: the model the user deploys, prompted with its own template) and searched with
HF's beam search, whose KV cache holds one copy of the prompt per beam (its cache is expanded to batch x
beams rows before the first step), as vLLM's beam search does; `xgr` keeps one prompt cache per user.
Scores are summed log-probabilities over the SID levels (length_penalty 0), the same scale as `beam`,
so the top-K of both agree up to ties (tests/test_hf_beam.py). Two documented differences:
- where a level has fewer codes than beams, HF keeps spare beams at scores near -1e9; they are
  reported as `beam` reports missing slots (code -1, score -inf, item -1, not valid);
- no `constraint`: HF's search knows nothing of STATIC's index, so this decoder has no constraint
  parameters (a served constraint set is simply not offered for it).

Generation flags (issue 32). `generate_sid_beams` works on any HF causal LM, an imported checkpoint
included, and sets every flag that can change a beam search explicitly: no sampling, temperature 1,
top-k / top-p / typical-p / min-p / epsilon / eta off, repetition and n-gram penalties off, one beam
group, no renormalisation, length_penalty 0 (equal-length SIDs: plain sums of log-probabilities), no
eos, exactly L new tokens. HF fills every flag a generation config leaves unset (None) from the
model's own `generation_config.json`, and "off" is None for several of them (bad words, suppressed
tokens, forced tokens, sequence bias), so the model's generation config is also swapped for ours while
`generate` runs: a checkpoint shipped with `do_sample: true` or a repetition penalty (LC-Rec and
MiniOneRec users lost results to such defaults) cannot turn the search into something else. Flags of
the checkpoint that are overridden are logged once per model.

SID tokens are allowed level by level through the codec (`codec.level_allowed_ids`), so an imported
vocabulary whose SID tokens are in string order (LC-Rec) works like our level-offset one. Two
equivalent ways (`allowed_tokens`): a vectorised mask (default, the fast peer) or HF's
`prefix_allowed_tokens_fn`, the mechanism LC-Rec evaluates with.

transformers is the optional `peers` extra, imported only when the decoder first runs. The HF copy is
made once per model object and kept while the model lives; it does not follow later in-place changes of
the weights (serving never changes them; re-create the context after training).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from genrec.workloads.decoding.base import DecoderContext, DecodeResult, PhaseTimer, RegisteredDecoder
from genrec.workloads.decoding.params import BeamWidthParams
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.hf_bridge import to_hf_llama
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import BOS, PAD, SIDCodec

if TYPE_CHECKING:  # pragma: no cover - typing only
    from transformers import GenerationConfig, LlamaForCausalLM, PreTrainedModel

HF_ATTENTION = ("sdpa", "eager")
ALLOWED_TOKENS = ("mask", "prefix_fn")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HFBeamParams(BeamWidthParams):
    attn_implementation: str = "sdpa"  # HF's attention: sdpa (its default, faster on CPU) or eager
    allowed_tokens: str = "mask"  # how a level's tokens are allowed: a vectorised mask or HF's prefix fn

    def validate(self) -> None:
        super().validate()
        if self.attn_implementation not in HF_ATTENTION:
            raise UserInputError(
                f"`attn_implementation` must be one of {list(HF_ATTENTION)}, got {self.attn_implementation!r}"
            )
        if self.allowed_tokens not in ALLOWED_TOKENS:
            raise UserInputError(
                f"`allowed_tokens` must be one of {list(ALLOWED_TOKENS)}, got {self.allowed_tokens!r}"
            )


# --- generation flags --------------------------------------------------------------------------------
# Every flag that can change which beams survive or how they are scored, at its neutral value. Flags whose
# "off" is None cannot be stated here (HF reads None as "unset" and takes the model's value): the
# generation config swap in `generate_sid_beams` covers them.
NEUTRAL_FLAGS: dict[str, Any] = dict(
    do_sample=False,
    temperature=1.0,
    top_k=50,  # HF's default; inert without sampling (0 is refused by some versions' validation)
    top_p=1.0,
    typical_p=1.0,
    epsilon_cutoff=0.0,
    eta_cutoff=0.0,
    repetition_penalty=1.0,
    encoder_repetition_penalty=1.0,
    no_repeat_ngram_size=0,
    encoder_no_repeat_ngram_size=0,
    num_beam_groups=1,
    diversity_penalty=0.0,
    renormalize_logits=False,  # True would renormalise over the allowed tokens (a level softmax)
    remove_invalid_values=False,
    min_length=0,
    use_cache=True,
)
# flags of a checkpoint's generation_config.json worth a log line when they are overridden
WATCHED_FLAGS = (*NEUTRAL_FLAGS, "num_beams", "length_penalty", "early_stopping", "eos_token_id", "min_p")
_SWAP_LOCK = threading.Lock()
_LOGGED: weakref.WeakSet = weakref.WeakSet()


def sid_generation_config(levels: int, beam_width: int, k: int, pad_token_id: int, bos_token_id: int | None):
    """The complete GenerationConfig of a SID beam search: L new tokens, plain summed log-probabilities."""
    tf = _transformers()
    # beam-only flags: HF warns about them when num_beams == 1 (greedy search)
    beam_flags = dict(length_penalty=0.0, early_stopping=True) if beam_width > 1 else {}
    return tf.GenerationConfig(
        **NEUTRAL_FLAGS,
        **beam_flags,  # length_penalty 0: sequences_scores are plain sums of log-probabilities
        num_beams=beam_width,
        num_return_sequences=k,
        max_new_tokens=levels,  # no eos token: every beam runs L steps (min_new_tokens only warns)
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=None,  # SIDs have a fixed length; nothing ends a beam early
        return_dict_in_generate=True,
        output_scores=beam_width > 1,
        output_logits=beam_width == 1,
    )


def overridden_flags(model_config: GenerationConfig, ours: GenerationConfig) -> dict[str, Any]:
    """The checkpoint's generation flags that differ from ours (and are ignored by `generate_sid_beams`)."""
    theirs, mine = model_config.to_dict(), ours.to_dict()
    return {f: theirs[f] for f in WATCHED_FLAGS if theirs.get(f) is not None and theirs.get(f) != mine.get(f)}


@contextmanager
def only_this_generation_config(hf_model: PreTrainedModel, config: GenerationConfig) -> Iterator[None]:
    """Run with `config` as the model's own generation config, so HF merges nothing of the checkpoint's."""
    with _SWAP_LOCK:
        saved = hf_model.generation_config
        if hf_model not in _LOGGED:
            _LOGGED.add(hf_model)
            ignored = overridden_flags(saved, config)
            if ignored:
                log.warning(
                    "hf_beam: ignoring the checkpoint's generation flags %s (beam search set explicitly)",
                    ignored,
                )
        hf_model.generation_config = config
        try:
            yield
        finally:
            hf_model.generation_config = saved


# beams HF pads with copies scored near -1e9 (it starts all beams but the first there); ours are -inf
REAL_SCORE = -1e8


# --- allowed tokens per level ---------------------------------------------------------------------------
class SIDLevelMask:
    """A HF logits processor keeping only SID level s's tokens (any ids, from the codec) at step s.

    Step s is `input_ids.shape[1] - prompt_len` (prompt_len = the padded batch width). HF beam search
    applies processors to the log-softmax, so the kept scores are the full-vocabulary log-probabilities.
    """

    def __init__(self, codec: SIDCodec, prompt_len: int) -> None:
        self.codec, self.prompt_len = codec, prompt_len
        self._keep: dict[tuple[int, int, torch.device], torch.Tensor] = {}

    def keep(self, step: int, vocab: int, device: torch.device) -> torch.Tensor:
        key = (step, vocab, device)
        if key not in self._keep:
            keep = torch.zeros(vocab, dtype=torch.bool, device=device)
            keep[torch.as_tensor(self.codec.level_allowed_ids(step), device=device)] = True
            self._keep[key] = keep
        return self._keep[key]

    def step(self, length: int) -> int:
        step = length - self.prompt_len
        if not 0 <= step < self.codec.levels:
            raise ValueError(f"generation step {step} outside the {self.codec.levels} SID levels")
        return step

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        keep = self.keep(self.step(input_ids.shape[1]), scores.shape[-1], scores.device)
        return scores.masked_fill(~keep, float("-inf"))


def sid_prefix_allowed_fn(codec: SIDCodec, prompt_len: int) -> Callable[[int, torch.Tensor], list[int]]:
    """HF's `prefix_allowed_tokens_fn` over the codec's SID table: level s's token ids at step s."""
    per_level = [codec.level_allowed_ids(level).tolist() for level in range(codec.levels)]
    mask = SIDLevelMask(codec, prompt_len)
    return lambda batch_id, sentence: per_level[mask.step(sentence.shape[-1])]


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise UserInputError("install the peers extra: pip install -e '.[peers]'") from e
    return transformers


@torch.no_grad()
def generate_sid_beams(
    hf_model: PreTrainedModel,
    codec: SIDCodec,
    tokens: torch.Tensor,
    mask: torch.Tensor,
    beam_width: int,
    k: int,
    allowed_tokens: str = "mask",
    pad_token_id: int = PAD,
    bos_token_id: int | None = BOS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF `generate` beam search over SIDs: (codes [B, K, L], scores [B, K]) best first.

    `tokens` / `mask` are a left-padded prompt batch. Scores are summed full-vocabulary log-probabilities
    of the L levels. When level 1 has fewer than `beam_width` codes, HF fills the spare beams with copies
    scored near -1e9 (it starts every beam but the first at -1e9), where our decoder uses -inf.
    """
    tf = _transformers()
    if not 1 <= k <= beam_width:
        raise UserInputError(f"k must be between 1 and beam_width ({beam_width}), got {k}")
    if allowed_tokens not in ALLOWED_TOKENS:
        raise UserInputError(f"allowed_tokens must be one of {list(ALLOWED_TOKENS)}, got {allowed_tokens!r}")
    b, prompt_len = tokens.shape
    levels = codec.levels
    config = sid_generation_config(levels, beam_width, k, pad_token_id, bos_token_id)
    if allowed_tokens == "mask":
        how: dict[str, Any] = {"logits_processor": tf.LogitsProcessorList([SIDLevelMask(codec, prompt_len)])}
    else:
        how = {"prefix_allowed_tokens_fn": sid_prefix_allowed_fn(codec, prompt_len)}
    with only_this_generation_config(hf_model, config):
        out = hf_model.generate(input_ids=tokens, attention_mask=mask.long(), generation_config=config, **how)
    new = out.sequences[:, prompt_len:]
    if new.shape[1] != levels:
        raise RuntimeError(f"HF generated {new.shape[1]} tokens, expected {levels}")
    codes = codec.tokens_to_codes(new).view(b, k, levels)
    if beam_width == 1:  # HF runs greedy search: no sequences_scores, and `scores` are processed logits
        logp = torch.stack([torch.log_softmax(x.float(), dim=-1) for x in out.logits], dim=1)  # [B, L, V]
        scores = logp.gather(-1, new[..., None]).squeeze(-1).sum(-1)
        return codes, scores.view(b, k)
    return codes, out.sequences_scores.view(b, k).float()


# model -> {attention: its HF copy}; weak keys, so a dropped model takes its copy with it
_HF_COPIES: weakref.WeakKeyDictionary[GRTransformer, dict[str, LlamaForCausalLM]] = (
    weakref.WeakKeyDictionary()
)


def hf_copy(model: GRTransformer, attn_implementation: str, source: str | None = None) -> PreTrainedModel:
    """The model's HF copy for this attention, made on first use and kept: our model exported to Llama,
    or, for an imported checkpoint, the original HF folder `source` loaded by transformers (the model
    the user deploys, in our model's dtype)."""
    copies = _HF_COPIES.setdefault(model, {})
    if attn_implementation not in copies:
        if source is None:
            copies[attn_implementation] = to_hf_llama(model, attn_implementation=attn_implementation)
        else:
            copies[attn_implementation] = load_original(source, attn_implementation, model)
    return copies[attn_implementation]


def load_original(source: str, attn_implementation: str, model: GRTransformer) -> PreTrainedModel:
    """The HF folder an imported checkpoint came from, as transformers loads it (offline)."""
    tf = _transformers()
    if not (Path(source) / "config.json").is_file():
        raise UserInputError(
            f"hf_beam runs transformers on the original checkpoint {source}, which is gone; restore the "
            "folder or import it again from where it is now"
        )
    dtype = model.embed_tokens.weight.dtype
    hf = tf.AutoModelForCausalLM.from_pretrained(source, attn_implementation=attn_implementation, dtype=dtype)
    return hf.to(model.device).eval()


@torch.no_grad()
def hf_generate_search(ctx: DecoderContext, histories: list[list[int]], params: HFBeamParams) -> DecodeResult:
    timer = PhaseTimer(ctx.device)
    with timer.phase("system"):
        tokens, mask = ctx.prompts(histories)
        imp = ctx.imported
        hf = hf_copy(ctx.model, params.attn_implementation, imp.hf_path if imp is not None else None)
        special = dict(pad_token_id=imp.pad_id, bos_token_id=imp.bos_id) if imp is not None else {}
    with timer.phase("decode"):  # HF runs its prefill inside generate: one phase for both
        codes, scores = generate_sid_beams(
            hf, ctx.codec, tokens, mask, params.beam_width, params.k, params.allowed_tokens, **special
        )
    with timer.phase("system"):
        # HF's spare beams (fewer codes than beams) are no answer: missing, as `beam` reports them
        real = scores > REAL_SCORE
        codes = torch.where(real[..., None], codes, torch.full_like(codes, -1))
        scores = torch.where(real, scores, torch.full_like(scores, float("-inf")))
        item_ids, valid = ctx.index.lookup(codes.clamp(min=0))
        valid = valid & real
        item_ids = torch.where(real, item_ids, torch.full_like(item_ids, -1))
    counters = {"beams": params.beam_width, "missing": int((~real).sum())}
    return DecodeResult(codes, scores, item_ids, valid, dict(timer.ms), counters)


class HFBeamDecoder(RegisteredDecoder):
    name: ClassVar[str] = "hf_beam"
    description: ClassVar[str] = "Hugging Face generate() beam search on the same model (a cross-check)"
    Params: ClassVar[type] = HFBeamParams

    def run(self, ctx: DecoderContext, histories: list[list[int]], params: HFBeamParams) -> DecodeResult:
        return hf_generate_search(ctx, histories, params)
