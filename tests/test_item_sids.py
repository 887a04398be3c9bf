"""Items' SIDs for an imported checkpoint: LC-Rec index JSON, Parquet and CSV item -> SID-token files give
the same codes; bad files and SIDs the tokenizer cannot spell are one-line errors."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.studies.common.random_hf import lcrec_token_strings, word_tokenizer
from genrec.workloads.data.item_sids import read_item_sids
from genrec.workloads.errors import UserInputError
from genrec.workloads.tokenize.sid_tokens import sid_pattern, sid_table_from_tokenizer

LETTERS = "abcd"


def tokens_of(codes: np.ndarray, template: str = "<{level}_{code}>") -> list[list[str]]:
    return [[template.format(level=LETTERS[l], code=int(c)) for l, c in enumerate(row)] for row in codes]


def write_all(tmp_path, codes, template="<{level}_{code}>"):
    """The same items in every accepted form; returns the paths."""
    toks = tokens_of(codes, template)
    ids = [f"i{k}" for k in range(len(codes))]
    paths = {}
    paths["json"] = tmp_path / "index.json"
    paths["json"].write_text(json.dumps({str(k): t for k, t in enumerate(toks)}))
    paths["parquet_list"] = tmp_path / "list.parquet"
    pq.write_table(pa.table({"item_id": ids, "sid": toks}), paths["parquet_list"])
    paths["parquet_str"] = tmp_path / "str.parquet"
    pq.write_table(pa.table({"item_id": ids, "sid": ["".join(t) for t in toks]}), paths["parquet_str"])
    paths["parquet_codes"] = tmp_path / "codes.parquet"
    pq.write_table(pa.table({"item_id": ids, "sid": codes.tolist()}), paths["parquet_codes"])
    paths["csv"] = tmp_path / "items.csv"
    lines = ["item_id,sid"] + [
        f'{i},"{" ".join(t) if k % 2 else "".join(t)}"' for k, (i, t) in enumerate(zip(ids, toks))
    ]
    paths["csv"].write_text("\n".join(lines) + "\n")
    return paths


@settings(max_examples=15, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=4).map(tuple),
    seed=st.integers(0, 2**16),
    preset=st.sampled_from(["lcrec", "openonerec"]),
)
def test_every_form_gives_the_same_codes(sizes, seed, preset, tmp_path_factory):
    rng = np.random.default_rng(seed)
    codes = np.stack([rng.integers(0, t, size=9) for t in sizes], axis=1)
    template = "<{level}_{code}>" if preset == "lcrec" else "<s_{level}_{code}>"
    paths = write_all(tmp_path_factory.mktemp("items"), codes, template)
    for form, path in paths.items():
        items = read_item_sids(path, preset)
        assert np.array_equal(items.codes, codes), form
        assert items.item_ids == (tuple(range(9)) if form == "json" else tuple(f"i{k}" for k in range(9)))


def test_items_checked_against_the_tokenizer_table(tmp_path):
    table = sid_table_from_tokenizer(word_tokenizer(lcrec_token_strings((5, 4))), "lcrec")
    ok = write_all(tmp_path, np.array([[4, 3], [0, 0]]))["csv"]
    assert read_item_sids(ok, "lcrec", table).codes.tolist() == [[4, 3], [0, 0]]
    (tmp_path / "b").mkdir()
    beyond = write_all(tmp_path / "b", np.array([[4, 3], [5, 0]]))["parquet_list"]
    with pytest.raises(
        UserInputError, match="item row 1 has code 5 at level 0, but the tokenizer has SID"
    ) as e:
        read_item_sids(beyond, "lcrec", table)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        (
            "a.csv",
            'item_id,sid\n1,"<a_1><c_2>"\n',
            r"token 2 is '<c_2>', expected a level-1 token like '<b_0>'",
        ),
        ("a.csv", 'item_id,sid\n1,"<a_1>junk<b_2>"\n', r"'junk<b_2>' is no SID token"),
        ("a.csv", 'item_id,sid\n1,"<a_1><b_2>"\n1,"<a_2><b_2>"\n', "item_id 1 appears twice"),
        (
            "a.csv",
            'item_id,sid\n1,"<a_1><b_2>"\n2,"<a_2>"\n',
            "item 2 has 1 SID tokens, the first item has 2",
        ),
        ("a.csv", "item,sid\n1,<a_1>\n", "no column item_id"),
        ("a.txt", "x", "unknown suffix"),
        ("a.json", '{"0": ["<s_a_1>"], "2": ["<s_a_1>"]}', "keys must be the item ids 0..1"),
    ],
)
def test_bad_item_files_are_one_line_errors(tmp_path, name, text, match):
    path = tmp_path / name
    path.write_text(text)
    pattern = "openonerec" if name.endswith(".json") else "lcrec"
    with pytest.raises(UserInputError, match=match) as e:
        read_item_sids(path, pattern)
    assert "\n" not in str(e.value)


def test_json_with_the_lcrec_pattern_uses_the_importers_reader(tmp_path):
    path = tmp_path / "x.index.json"
    path.write_text(json.dumps({"0": ["<a_1>", "<b_2>"], "1": ["<a_1>", "<a_2>"]}))
    with pytest.raises(UserInputError, match=r'expected "<b_N>"'):  # data/atspeed.py's message
        read_item_sids(path, sid_pattern("lcrec"))
