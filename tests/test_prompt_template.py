"""Prompt template of an imported checkpoint: renders the history as SID token strings, is tokenised by the
checkpoint's own tokenizer (each SID string one added token, in LC-Rec's string-order ids), round-trips
through its JSON file, and a template that does not render is a one-line error."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.studies.common.random_hf import lcrec_token_strings, save_tokenizer, word_tokenizer
from genrec.workloads.errors import UserInputError
from genrec.workloads.tokenize.prompt_template import PromptEncoder, PromptTemplate
from genrec.workloads.tokenize.sid_tokens import load_sid_table, load_tokenizer, sid_pattern

SIZES = (12, 5, 3)
TEMPLATE = PromptTemplate(
    text="the user bought items {history} .",
    item="{sid}",
    separator=" , ",
    system="<s> ",  # a special token typed into the text is still one token
    response_prefix=" next item :",
    add_special_tokens=False,
)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> PromptEncoder:
    folder = save_tokenizer(word_tokenizer(lcrec_token_strings(SIZES)), tmp_path_factory.mktemp("ckpt"))
    return PromptEncoder(TEMPLATE, load_tokenizer(folder), sid_pattern("lcrec"), load_sid_table(folder))


def test_render_writes_the_history_as_sid_strings():
    text = TEMPLATE.render(np.array([[10, 0, 2], [2, 4, 0]]), sid_pattern("lcrec"))
    assert text == "<s> the user bought items <a_10><b_0><c_2> , <a_2><b_4><c_0> . next item :"
    numbered = PromptTemplate(text="{history}", item="{index}. {sid}", separator="; ", max_history=2)
    assert numbered.render_strings([["<a_1>"], ["<a_2>"], ["<a_3>"]]) == "1. <a_2>; 2. <a_3>"


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_encode_equals_word_by_word_ids(encoder, data):
    n = data.draw(st.integers(1, 6))
    codes = np.array([[data.draw(st.integers(0, t - 1)) for t in SIZES] for _ in range(n)])
    ids = encoder.encode(codes)
    tok = encoder.tokenizer
    words = ["<s>", "the", "user", "bought", "items"]
    for k, row in enumerate(codes):
        words += ([","] if k else []) + [f"<{'abc'[l]}_{c}>" for l, c in enumerate(row)]
    words += [".", "next", "item", ":"]
    assert ids == [tok.token_to_id(w) for w in words]
    sid_ids = np.asarray(ids)[encoder.table.level_of_token(np.asarray(ids)) >= 0]
    assert np.array_equal(encoder.table.tokens_to_codes(sid_ids.reshape(n, 3)), codes)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_a_batch_encodes_as_each_prompt_rendered_and_tokenised_alone(encoder, data):
    """encode_batch spells SID strings once and checks the batch in one pass: each prompt must still be
    the one its history renders to (the pattern's own spelling, the template, the tokenizer)."""
    keep = data.draw(st.sampled_from([None, 1, 3]))
    enc = PromptEncoder(
        PromptTemplate(text="the user bought {history}", max_history=keep), *astuple_rest(encoder)
    )
    histories = [
        np.array(
            [[data.draw(st.integers(0, t - 1)) for t in SIZES] for _ in range(data.draw(st.integers(1, 5)))]
        )
        for _ in range(data.draw(st.integers(1, 4)))
    ]
    alone = [
        enc.tokenizer.encode(enc.template.render(h[-keep:] if keep else h, enc.pattern)).ids
        for h in histories
    ]
    assert enc.encode_batch(histories) == alone


def astuple_rest(encoder: PromptEncoder) -> tuple:
    return encoder.tokenizer, encoder.pattern, encoder.table


def test_the_tokenizers_own_bos_is_added(encoder):
    with_bos = PromptTemplate(text="the user bought {history}", response_prefix=" :")
    enc = PromptEncoder(with_bos, encoder.tokenizer, encoder.pattern, encoder.table)
    assert enc.encode(np.array([[1, 1, 1]]))[0] == encoder.tokenizer.token_to_id("<s>")


def test_a_tokenizer_that_splits_sid_strings_is_refused(encoder):
    plain = word_tokenizer([])  # no SID tokens added: "<a_1>" is split into pieces
    enc = PromptEncoder(TEMPLATE, plain, encoder.pattern, encoder.table)
    with pytest.raises(UserInputError, match="SID tokens into 0 SID token ids") as e:
        enc.encode(np.array([[1, 1, 1]]))
    assert "\n" not in str(e.value)
    sneaky = PromptTemplate(text="<a_1> {history}")  # SID text in the template itself
    with pytest.raises(UserInputError, match="into 4 SID token ids"):
        PromptEncoder(sneaky, encoder.tokenizer, encoder.pattern, encoder.table).encode(np.array([[2, 1, 1]]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"text": "no placeholder"}, r"needs exactly one \{history\}"),
        ({"text": "{history} and {history}"}, r"needs exactly one \{history\}"),
        ({"text": "{history} for {user}"}, r"unknown field \{user\}"),
        ({"text": "{} {history}"}, r"unknown field \{\}"),
        ({"text": "{history} {"}, "write a literal brace"),
        ({"text": "{history:d}"}, "does not render"),
        ({"text": "{history}", "item": "{index}"}, r"must contain \{sid\} once"),
        ({"text": "{history}", "item": "{sid} {title}"}, r"must contain \{sid\} once"),
        ({"text": "{history}", "max_history": 0}, "max_history must be >= 1"),
    ],
)
def test_templates_that_do_not_render_are_one_line_errors(kwargs, match):
    with pytest.raises(UserInputError, match=match) as e:
        PromptTemplate(**kwargs)
    assert "\n" not in str(e.value)


def test_stored_with_the_model_and_loaded_back(tmp_path):
    assert PromptTemplate.load(TEMPLATE.save(tmp_path)) == TEMPLATE
    assert PromptTemplate.load(tmp_path) == TEMPLATE
    assert not list(tmp_path.glob("*.tmp"))
    (tmp_path / "bad.json").write_text(json.dumps({"text": "{history}", "prefix": "x"}))
    with pytest.raises(UserInputError, match=r"unknown keys \['prefix'\]"):
        PromptTemplate.load(tmp_path / "bad.json")
    with pytest.raises(UserInputError, match="no prompt template"):
        PromptTemplate.load(tmp_path / "missing.json")
    # braces in the literal parts are kept as written, not formatted
    literal = PromptTemplate(text="{history}", system="{sys} ", response_prefix=" {}")
    assert literal.render_strings([["<a_1>"]]) == "{sys} <a_1> {}"
