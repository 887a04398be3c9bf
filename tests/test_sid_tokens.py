"""SID token table: found in a tokenizer by pattern (presets and custom), (level, code) <-> token id round
trips under any id order (LC-Rec's string order included), our level-offset codec as one instance of it
(bit-identical), and the one-line errors (no SID tokens, gaps, items or vocab size that disagree)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.studies.common.random_hf import WORDS, lcrec_token_strings, save_tokenizer, word_tokenizer
from genrec.workloads.errors import UserInputError
from genrec.workloads.sid_codec import SIDCodec
from genrec.workloads.sid_table import NO_TOKEN, SIDTokenTable
from genrec.workloads.tokenize.sid_tokens import (
    SIDPattern,
    load_sid_table,
    sid_pattern,
    sid_table_from_tokenizer,
)

sizes_st = st.lists(st.integers(1, 13), min_size=1, max_size=4).map(tuple)


@st.composite
def scrambled_tables(draw) -> SIDTokenTable:
    """Any injective (level, code) -> id map inside a vocabulary with room for other tokens, with gaps
    (codes without a token, as LC-Rec leaves for codes no item uses) at any code but the last."""
    sizes = draw(sizes_st)
    n = sum(sizes)
    vocab = n + draw(st.integers(0, 20))
    ids = draw(st.permutations(range(vocab)))[:n]
    out, start = [], 0
    for t in sizes:
        row = list(ids[start : start + t])
        for c in draw(st.sets(st.integers(0, t - 2), max_size=t - 1)) if t > 1 else ():
            row[c] = NO_TOKEN
        out.append(tuple(row))
        start += t
    return SIDTokenTable(tuple(out), vocab)


def random_codes(sizes, rng, n=17) -> np.ndarray:
    return np.stack([rng.integers(0, t, size=n) for t in sizes], axis=1)


def present_codes(table: SIDTokenTable, rng, n=17) -> np.ndarray:
    return np.stack(
        [rng.choice(np.flatnonzero(table.level_token_ids(l) >= 0), size=n) for l in range(table.levels)], 1
    )


@settings(max_examples=60, deadline=None)
@given(table=scrambled_tables(), seed=st.integers(0, 2**16))
def test_table_round_trips_codes_tokens_levels(table, seed):
    codes = present_codes(table, np.random.default_rng(seed))
    table.check_item_codes(codes)
    tokens = table.codes_to_tokens(codes)
    assert np.array_equal(table.tokens_to_codes(tokens), codes)
    assert np.array_equal(table.level_of_token(tokens), np.broadcast_to(np.arange(table.levels), codes.shape))
    t = torch.as_tensor(codes)
    assert torch.equal(table.codes_to_tokens(t), torch.as_tensor(tokens))
    assert torch.equal(table.tokens_to_codes(torch.as_tensor(tokens)), t)
    # every id that is no SID token is reported as such
    sid_ids = {i for level in table.ids for i in level}
    others = np.array([i for i in range(table.vocab_size) if i not in sid_ids], dtype=np.int64)
    assert (table.level_of_token(others) == -1).all() and (table.code_of_token(others) == -1).all()
    for level in range(table.levels):
        ids = table.level_token_ids(level)
        present = np.flatnonzero(ids >= 0)
        assert np.array_equal(table.code_of_token(ids[present]), present)
        assert np.array_equal(table.level_present_ids(level), ids[present])
        if len(present) < len(ids):  # an item at a gap code has no token: refused
            gap = int(np.flatnonzero(ids < 0)[0])
            bad = codes[:1].copy()
            bad[0, level] = gap
            with pytest.raises(UserInputError, match=f"code {gap} at level {level}.*other codes only"):
                table.check_item_codes(bad)
    assert SIDTokenTable.from_dict(table.to_dict()) == table


@settings(max_examples=60, deadline=None)
@given(sizes=sizes_st, seed=st.integers(0, 2**16))
def test_level_offset_codec_is_one_instance_and_bit_identical(sizes, seed):
    codec = SIDCodec(sizes)
    table = codec.table
    as_table = SIDCodec.from_table(table)
    codes = random_codes(sizes, np.random.default_rng(seed))
    for c in (codes, torch.as_tensor(codes)):
        tokens = codec.codes_to_tokens(c)
        assert np.array_equal(np.asarray(tokens), np.asarray(as_table.codes_to_tokens(c)))
        assert np.array_equal(np.asarray(codec.tokens_to_codes(tokens)), np.asarray(codes))
        assert np.array_equal(np.asarray(as_table.tokens_to_codes(tokens)), np.asarray(codes))
    for level in range(codec.levels):
        assert as_table.level_range(level) == codec.level_range(level)
        assert np.array_equal(codec.level_token_ids(level), np.arange(*codec.level_range(level)))
    assert as_table.vocab_size == codec.vocab_size
    assert codec.to_dict() == {"codebook_sizes": list(sizes)}  # our stored form is unchanged
    assert SIDCodec.from_dict(as_table.to_dict()) == as_table


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 14), min_size=1, max_size=4).map(tuple), data=st.data())
def test_table_from_a_tokenizer_in_lcrec_string_order(sizes, data, tmp_path_factory):
    """LC-Rec adds its tokens sorted as strings; extra words may come before; the table follows the ids."""
    sid = lcrec_token_strings(sizes)
    if data.draw(st.booleans()):  # any other adding order must work just as well
        sid = data.draw(st.permutations(sid))
    tok = word_tokenizer(sid)
    folder = save_tokenizer(tok, tmp_path_factory.mktemp("tok"))
    table = load_sid_table(folder, "lcrec")
    assert table.codebook_sizes == sizes
    letters = "abcd"
    for l, t in enumerate(sizes):
        assert [tok.token_to_id(f"<{letters[l]}_{c}>") for c in range(t)] == list(table.ids[l])
    assert table.vocab_size == len(WORDS) + sum(sizes)


def test_lcrec_order_puts_a_10_before_a_2():
    tok = word_tokenizer(lcrec_token_strings((12, 2)))
    codec = SIDCodec.from_table(sid_table_from_tokenizer(tok, "lcrec"))
    ids = codec.level_token_ids(0)
    assert ids[10] < ids[2]  # the ids are not in code order ...
    with pytest.raises(ValueError, match="not one contiguous id range"):
        codec.level_range(0)  # ... so a decoder must not slice a range
    assert codec.level_range(1) == (ids.max() + 1, ids.max() + 3)  # <b_0>, <b_1> are in order
    with pytest.raises(ValueError, match="imported vocabulary"):
        codec.placeholder_token(0)


def test_openonerec_and_custom_patterns():
    sizes = (3, 4, 2)
    tok = word_tokenizer(lcrec_token_strings(sizes, "<s_{level}_{code}>"))
    table = sid_table_from_tokenizer(tok, "openonerec")
    assert table.codebook_sizes == sizes
    assert table.ids[1][3] == tok.token_to_id("<s_b_3>")
    # the lcrec pattern must not pick up <s_a_N> (fullmatch), so it finds nothing here
    with pytest.raises(UserInputError, match="no SID tokens"):
        sid_table_from_tokenizer(tok, "lcrec")
    per_level = ["<x" + str(c) + ">" for c in range(5)] + ["<y" + str(c) + ">" for c in range(2)]
    tok = word_tokenizer(sorted(per_level))
    table = sid_table_from_tokenizer(tok, sid_pattern("<x{code}> <y{code}>"))
    assert table.codebook_sizes == (5, 2) and table.ids[1][1] == tok.token_to_id("<y1>")
    assert sid_pattern("<x{code}> <y{code}>").token(1, 7) == "<y7>"
    assert SIDPattern.from_dict(sid_pattern("openonerec").to_dict()) == sid_pattern("openonerec")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("nonesuch", "unknown SID pattern"),
        ("<a_{level}>", r"must contain \{code\} once"),
        ("<{item}_{code}>", r"no field but"),
        ("<x{code}> <y{level}{code}>", r"no field but \{code\}"),
        ("<a_{code}", None),  # valid: no closing '>' is just a different spelling
    ],
)
def test_bad_patterns_are_one_line_errors(spec, match):
    if match is None:
        assert sid_pattern(spec).token(0, 3) == "<a_3"
        return
    with pytest.raises(UserInputError, match=match) as e:
        sid_pattern(spec)
    assert "\n" not in str(e.value)


def test_errors_gaps_tokenizer_without_sid_items_and_vocab_size(tmp_path):
    with pytest.raises(UserInputError, match="no SID tokens found") as e:
        sid_table_from_tokenizer(word_tokenizer([]), "lcrec")
    assert "\n" not in str(e.value)
    gappy = [t for t in lcrec_token_strings((8, 3)) if t not in ("<a_5>", "<b_0>")]
    with pytest.raises(UserInputError, match="level 0 has SID tokens for codes up to 7 but none for code 5"):
        sid_table_from_tokenizer(word_tokenizer(gappy), "lcrec", allow_gaps=False)
    with pytest.raises(UserInputError, match="none for code 5"):  # other patterns refuse gaps by default
        sid_table_from_tokenizer(word_tokenizer(gappy), "<{level}_{code}>")
    # LC-Rec adds only the codes items use: its preset keeps the gaps, which are never generated
    codec = SIDCodec.from_table(sid_table_from_tokenizer(word_tokenizer(gappy), "lcrec"))
    assert codec.codebook_sizes == (8, 3) and codec.level_token_ids(0)[5] == -1
    assert len(codec.level_allowed_ids(0)) == 7 and len(codec.level_allowed_ids(1)) == 2
    with pytest.raises(UserInputError, match="item row 0 has code 0 at level 1"):
        codec.table.check_item_codes(np.array([[1, 0]]))
    no_b = [t for t in lcrec_token_strings((2, 2, 2)) if not t.startswith("<b_")]
    with pytest.raises(UserInputError, match="not level 1"):
        sid_table_from_tokenizer(word_tokenizer(no_b), "lcrec")
    tok = word_tokenizer(lcrec_token_strings((4, 3)))
    size = len(WORDS) + 7
    msg = f"ids up to {size - 1} but the model's vocab_size is {size - 7}"
    with pytest.raises(UserInputError, match=msg):
        sid_table_from_tokenizer(tok, "lcrec", model_vocab_size=size - 7)  # embeddings never resized
    table = sid_table_from_tokenizer(tok, "lcrec", model_vocab_size=size + 9)  # padded vocab: fine
    assert table.vocab_size == size + 9
    table.check_item_codes(np.array([[3, 2], [0, 0]]))
    with pytest.raises(UserInputError, match="item row 1 has code 3 at level 1"):
        table.check_item_codes(np.array([[3, 2], [0, 3]]))
    with pytest.raises(UserInputError, match="items have 3 SID levels"):
        table.check_item_codes(np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(UserInputError, match="no tokenizer.json"):
        load_sid_table(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(UserInputError, match="not a readable tokenizer.json"):
        load_sid_table(tmp_path)


def test_codec_rejects_a_table_of_other_sizes():
    table = SIDTokenTable(((5, 3), (4,)), 6)
    with pytest.raises(ValueError, match="disagree"):
        SIDCodec((2, 2), table)
    codec = SIDCodec.from_table(table)
    assert codec.vocab_size == 6 and not codec.is_level_offset
    assert np.array_equal(codec.codes_to_tokens(np.array([[1, 0]])), [[3, 4]])
