"""Prompts assembled from pieces tokenised once (prompt_pieces.py) equal the tokenizer's own encoding of the
rendered prompt, for the tokenizer kinds checkpoints ship (word level, byte-level BPE as Qwen's, a
sentencepiece-style Metaspace BPE as LLaMA's, whose "first word" rule depends on where a piece stands),
for numbered, truncated and system-wrapped templates; and where composing would not be exact the
encoder falls back to tokenising whole prompts (and still reports SID tokens in template text)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from genrec.studies.common.random_hf import lcrec_token_strings, save_tokenizer, word_tokenizer
from genrec.workloads.errors import UserInputError
from genrec.workloads.tokenize.prompt_pieces import PromptPieces
from genrec.workloads.tokenize.prompt_template import PromptEncoder, PromptTemplate
from genrec.workloads.tokenize.sid_tokens import load_sid_table, load_tokenizer, sid_pattern

SIZES = (12, 5, 3)
CORPUS = ["the user bought these items recently", "next item : please recommend", "1. 2. 3. 10. 11."] * 20
TEMPLATES = {
    "plain": PromptTemplate(text="the user bought {history}", separator=", ", response_prefix=" next item :"),
    "numbered": PromptTemplate(
        text="Items:\n{history}\nNext:", item="{index}. {sid}", separator="\n", system="System: recommend. "
    ),
    "recent": PromptTemplate(text="{history}", separator=" ", max_history=2, add_special_tokens=False),
}


def bpe_tokenizer(kind: str, sid_tokens: list[str]) -> Tokenizer:
    """A small BPE trained here (no download): byte-level as Qwen's, or Metaspace ("first") as LLaMA's."""
    tok = Tokenizer(models.BPE(unk_token="<unk>" if kind == "metaspace" else None))
    if kind == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tok.decoder = decoders.Metaspace(prepend_scheme="first")
        alphabet = []
    trainer = trainers.BpeTrainer(
        vocab_size=200,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS + ["\n"], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.add_tokens([AddedToken(t, normalized=False) for t in sid_tokens])
    return tok


@pytest.fixture(scope="module", params=["word", "bytelevel", "metaspace"])
def parts(request, tmp_path_factory):
    sids = lcrec_token_strings(SIZES)
    tok = word_tokenizer(sids) if request.param == "word" else bpe_tokenizer(request.param, sids)
    folder = save_tokenizer(tok, tmp_path_factory.mktemp(request.param))
    return load_tokenizer(folder), sid_pattern("lcrec"), load_sid_table(folder)


def whole(enc: PromptEncoder, codes: np.ndarray) -> list[int]:
    """The reference: render the prompt and let the tokenizer encode it."""
    recent = codes[-enc.template.max_history :] if enc.template.max_history else codes
    text = enc.template.render(recent, enc.pattern)
    return enc.tokenizer.encode(text, add_special_tokens=enc.template.add_special_tokens).ids


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_assembled_prompts_equal_the_tokenizers_encoding(parts, name, data):
    enc = PromptEncoder(TEMPLATES[name], *parts)
    assert enc._pieces is not None, "this tokenizer and template compose: the fast path must be taken"
    histories = [
        np.array(
            [[data.draw(st.integers(0, t - 1)) for t in SIZES] for _ in range(data.draw(st.integers(1, 12)))]
        )
        for _ in range(data.draw(st.integers(1, 3)))
    ]
    assert enc.encode_batch(histories) == [whole(enc, h) for h in histories]


def test_a_template_whose_text_holds_a_sid_token_falls_back_and_is_reported(parts):
    enc = PromptEncoder(PromptTemplate(text="like <a_1> : {history}"), *parts)
    assert enc._pieces is None
    with pytest.raises(UserInputError, match="SID token"):
        enc.encode_batch([np.array([[1, 2, 0]])])


def test_pieces_whose_assembly_differs_from_the_tokenizer_are_not_used(parts, monkeypatch):
    """The check on sample histories is what admits the fast path: assembled ids that differ from the
    tokenizer's (here: a planted off-by-one) leave the encoder on whole prompts, still exact."""
    enc = PromptEncoder(TEMPLATES["plain"], *parts)
    real = PromptPieces.ids
    monkeypatch.setattr(PromptPieces, "ids", lambda self, codes: real(self, codes)[1:])
    assert enc._pieces is None
    history = np.array([[3, 1, 2], [11, 4, 0]])
    assert enc.encode_batch([history]) == [whole(enc, history)]


def test_pieces_sit_in_context_last_level_before_first_level_after(parts):
    """A joint stands between an item's last SID token and the next item's first: it is tokenised there."""
    if parts[0].token_to_id("<unk>") == parts[0].encode("10", add_special_tokens=False).ids[0]:
        pytest.skip("the word tokenizer spells every number <unk>")
    pieces = PromptEncoder(TEMPLATES["numbered"], *parts)._pieces
    assert pieces is not None
    assert pieces.joint(1) != pieces.joint(9)  # "\n2. " and "\n10. " differ: one joint per position
