"""`hf_beam` on an imported-style checkpoint: a tiny random HF Llama saved with a generation_config.json
full of sampling and penalty defaults, and a tokenizer whose SID tokens interleave levels (no level is a
contiguous id range) and skip codes no item uses (LC-Rec's gaps), still gives deterministic beams equal
to exhaustive search over every SID the tokenizer can spell."""

import itertools
import random

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from genrec.studies.common.random_hf import lcrec_token_strings, save_tokenizer, word_tokenizer  # noqa: E402
from genrec.workloads.decoding.hf_beam import (  # noqa: E402
    generate_sid_beams,
    overridden_flags,
    sid_generation_config,
)
from genrec.workloads.sid_codec import SIDCodec  # noqa: E402
from genrec.workloads.tokenize.prompt_template import PromptEncoder, PromptTemplate  # noqa: E402
from genrec.workloads.tokenize.sid_tokens import load_sid_table, load_tokenizer, sid_pattern  # noqa: E402

SIZES = (12, 3, 2)  # <a_10>, <a_11> sort before <a_2>
GAPS = ("<a_4>", "<b_1>")  # codes without a token: never generated
PAD_ID = 3  # "<pad>" in random_hf.WORDS
HOSTILE = dict(  # what a checkpoint may ship; each of these would change a beam search if merged in
    do_sample=True,
    temperature=0.3,
    top_k=2,
    top_p=0.5,
    repetition_penalty=1.8,
    no_repeat_ngram_size=1,
    length_penalty=3.0,
    num_beams=2,
    num_return_sequences=1,
    renormalize_logits=True,
    max_new_tokens=1,
    eos_token_id=2,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_ckpt")
    sid = [t for t in lcrec_token_strings(SIZES) if t not in GAPS]
    random.Random(5).shuffle(sid)  # levels interleave in id order
    tok = word_tokenizer(sid)
    save_tokenizer(tok, folder)
    table = load_sid_table(folder, "lcrec")
    vocab = table.vocab_size + 3  # a padded embedding, as checkpoints often have
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        pad_token_id=PAD_ID,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    for p in model.parameters():  # far from uniform, so the searches have real choices to make
        torch.nn.init.normal_(p, std=0.6)
    model.generation_config = transformers.GenerationConfig(
        **HOSTILE, suppress_tokens=[int(table.ids[0][2])], pad_token_id=PAD_ID, bos_token_id=1
    )
    model.save_pretrained(folder)
    loaded = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    assert loaded.generation_config.do_sample is True  # the file really carries the defaults
    codec = SIDCodec.from_table(load_sid_table(folder, "lcrec", model_vocab_size=vocab))
    with pytest.raises(ValueError, match="contiguous"):
        codec.level_range(0)
    encoder = PromptEncoder(
        PromptTemplate(text="the user bought {history} .", response_prefix=" next item :"),
        load_tokenizer(folder),
        sid_pattern("lcrec"),
        codec.table,
    )
    return loaded, codec, encoder


def prompts(encoder, seed, users=3):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(users):
        n = int(rng.integers(1, 4))
        codes = np.stack([rng.integers(0, t, size=n) for t in SIZES], axis=1)
        codes[codes[:, 0] == 4, 0] = 5  # history items are items: no gap codes
        codes[codes[:, 1] == 1, 1] = 2
        out.append(encoder.encode(codes))
    return out


def left_pad(rows):
    width = max(map(len, rows))
    tokens = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        tokens[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = True
    return tokens, mask


@torch.no_grad()
def exhaustive(model, codec, prompt, k):
    """Every SID scored by teacher forcing: sum of full-vocabulary log-softmax at its tokens; best k."""
    sids = [s for s in itertools.product(*(range(t) for t in SIZES)) if s[0] != 4 and s[1] != 1]
    tokens = torch.as_tensor(codec.codes_to_tokens(np.array(sids)))
    assert (tokens >= 0).all()
    seqs = torch.cat([torch.tensor(prompt).expand(len(sids), -1), tokens], dim=1)
    logp = torch.log_softmax(model(seqs).logits.float(), dim=-1)
    p = len(prompt)
    scores = sum(logp[:, p - 1 + l].gather(-1, tokens[:, l : l + 1]).squeeze(-1) for l in range(len(SIZES)))
    order = torch.argsort(scores, descending=True, stable=True)[:k]
    return torch.tensor(sids)[order], scores[order]


@pytest.mark.parametrize("allowed", ["mask", "prefix_fn"])
def test_beam_search_ignores_the_checkpoints_sampling_defaults(checkpoint, allowed):
    model, codec, encoder = checkpoint
    rows = prompts(encoder, seed=1)
    tokens, mask = left_pad(rows)
    width, k = SIZES[0] * SIZES[1], 10  # every level-2 prefix kept: beam search is exhaustive
    runs = [generate_sid_beams(model, codec, tokens, mask, width, k, allowed, PAD_ID, 1) for _ in range(2)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])  # deterministic
    codes, scores = runs[0]
    for u, prompt in enumerate(rows):
        ref_codes, ref_scores = exhaustive(model, codec, prompt, k)
        assert torch.equal(codes[u], ref_codes), u
        torch.testing.assert_close(scores[u], ref_scores, atol=1e-4, rtol=1e-4)
    assert model.generation_config.do_sample is True  # the checkpoint's own config is restored


@torch.no_grad()
def greedy(model, codec, prompt):
    """Level by level, the best code by full-vocabulary log-probability; its summed score."""
    seq, codes, score = list(prompt), [], 0.0
    for level in range(len(SIZES)):
        logp = torch.log_softmax(model(torch.tensor([seq])).logits[0, -1].float(), dim=-1)
        ids = torch.as_tensor(codec.level_token_ids(level))
        code = int(logp[ids].masked_fill(ids < 0, float("-inf")).argmax())
        codes.append(code)
        score += float(logp[ids[code]])
        seq.append(int(ids[code]))
    return codes, score


def test_width_one_is_greedy_on_the_level_tokens(checkpoint):
    model, codec, encoder = checkpoint
    rows = prompts(encoder, seed=2, users=2)
    codes, scores = generate_sid_beams(model, codec, *left_pad(rows), 1, 1, "mask", PAD_ID, 1)
    for u, prompt in enumerate(rows):
        ref_codes, ref_score = greedy(model, codec, prompt)
        assert codes[u, 0].tolist() == ref_codes
        assert abs(float(scores[u, 0]) - ref_score) < 1e-4


def test_every_flag_is_set_and_the_overrides_are_reported(checkpoint):
    model, _, _ = checkpoint
    cfg = sid_generation_config(3, 8, 4, PAD_ID, 1)
    assert cfg.do_sample is False and cfg.length_penalty == 0.0 and cfg.num_return_sequences == 4
    assert cfg.temperature == 1.0 and cfg.top_p == 1.0 and cfg.repetition_penalty == 1.0
    assert cfg.renormalize_logits is False and cfg.eos_token_id is None and cfg.max_new_tokens == 3
    ignored = overridden_flags(model.generation_config, cfg)
    assert {"do_sample", "temperature", "top_p", "repetition_penalty", "renormalize_logits"} <= set(ignored)


def test_the_decoder_takes_allowed_tokens():
    from genrec.workloads.decoding.base import get_decoder, make_params
    from genrec.workloads.errors import UserInputError

    assert make_params(get_decoder("hf_beam"), {"allowed_tokens": "prefix_fn"}).allowed_tokens == "prefix_fn"
    with pytest.raises(UserInputError, match="allowed_tokens"):
        make_params(get_decoder("hf_beam"), {"allowed_tokens": "all"})
