"""AtSpeed / LC-Rec importer: the real Beauty folder (skipped when absent) and small fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from genrec.workloads.data.atspeed import import_atspeed
from genrec.workloads.data.dataset import DatasetError, load_dataset

BEAUTY = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "beauty"


# --- the shipped Beauty data ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def beauty(tmp_path_factory):
    if not (BEAUTY / "sequential_train.txt").is_file():
        pytest.skip(f"Beauty data not present: {BEAUTY} (needs ../shared/datasets/beauty next to the repo)")
    out, _ = import_atspeed(BEAUTY, tmp_path_factory.mktemp("beauty") / "ds", codebook_size=256)
    return load_dataset(out)


@pytest.mark.shared_data
def test_beauty_counts_match_the_readme(beauty):
    m = beauty.manifest
    assert m.num_users == 19_383 and m.num_items == 12_035
    assert m.counts == {"train": 122_241, "valid": 9_316, "test": 7_313}
    assert m.split_rule == "temporal"
    assert m.sid_stats["distinct_before"] == 12_023 and m.sid_stats["disambiguation_level"] is True
    assert m.levels == 5 and m.codebook_sizes[:4] == [256] * 4
    assert m.sid_stats["source_levels"] == 4
    assert m.sid_stats["utilisation"][0] == pytest.approx(91 / 256)
    codes = beauty.item_codes()
    assert len(np.unique(codes, axis=0)) == 12_035


@pytest.mark.shared_data
def test_beauty_item_ids_align_with_the_index(beauty):
    index = json.loads(next(BEAUTY.glob("*.json")).read_text())
    first_line = (BEAUTY / "sequential_train.txt").read_text().splitlines()[0].split()
    user, txt_items = int(first_line[0]), [int(x) for x in first_line[1:]]
    seqs = beauty.user_sequences(("train",))
    assert seqs[user - 1] == [i - 1 for i in txt_items]  # users 1..N are dense 0..N-1 here
    codes = beauty.item_codes()
    for i in txt_items[:5] + [1, 12_035]:
        want = [int(tok.split("_")[1].rstrip(">")) for tok in index[str(i - 1)]]
        assert codes[i - 1, :4].tolist() == want
        assert beauty.items["source_id"].iloc[i - 1] == str(i)


@pytest.mark.shared_data
def test_beauty_test_history_is_train_plus_valid(beauty):
    train, valid = beauty.user_sequences(("train",)), beauty.user_sequences(("valid",))
    examples = beauty.eval_examples("test")
    assert len(examples) > 1000
    for ex in examples[:300]:
        assert ex.history == train.get(ex.user_id, []) + valid.get(ex.user_id, [])


# --- small fixtures in the same format -----------------------------------------------------------
def token(level: int, code: int) -> str:
    return f"<{'abcd'[level]}_{code}>"


INDEX = {  # items 1..6 in txt are keys "0".."5"; items 3 and 4 (keys "2", "3") collide
    "0": [token(0, 0), token(1, 1), token(2, 2)],
    "1": [token(0, 1), token(1, 0), token(2, 0)],
    "2": [token(0, 2), token(1, 3), token(2, 1)],
    "3": [token(0, 2), token(1, 3), token(2, 1)],
    "4": [token(0, 0), token(1, 0), token(2, 5)],
    "5": [token(0, 1), token(1, 2), token(2, 0)],
}
TRAIN = "1 1 2 3\n2 4 5\n3 6 1 2\n5\n"
VALID = "1 4\n2\n3 5\n5\n"
TEST = "1 5\n2 6\n3\n5\n"


def write_folder(
    root: Path, train=TRAIN, valid=VALID, test=TEST, index=INDEX, index_name="toy.index.json"
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in (("train", train), ("valid", valid), ("test", test)):
        if text is not None:
            (root / f"sequential_{name}.txt").write_text(text)
    if index is not None:
        (root / index_name).write_text(json.dumps(index))
    return root


def test_fixture_import(tmp_path):
    src = write_folder(tmp_path / "src")
    out, manifest = import_atspeed(src, tmp_path / "out" / "toy")
    ds = load_dataset(out)
    assert manifest.num_users == 3  # user 5 has only id lines: no interactions, dropped
    assert manifest.num_items == 6
    assert manifest.counts == {"train": 8, "valid": 2, "test": 2}
    assert manifest.name == "src"
    # per level max code + 1, then one disambiguation level for the single collision pair
    assert manifest.codebook_sizes == [3, 4, 6, 2]
    assert manifest.sid_stats["colliding_items"] == 2 and manifest.sid_stats["collision_groups"] == 1
    codes = ds.item_codes()
    assert codes[2].tolist() == [2, 3, 1, 0] and codes[3].tolist() == [2, 3, 1, 1]
    # positions continue train -> valid -> test, item i -> i - 1
    u0 = ds.interactions[ds.interactions["user_id"] == 0].sort_values("position")
    assert u0["item_id"].tolist() == [0, 1, 2, 3, 4]
    assert u0["split"].tolist() == ["train"] * 3 + ["valid", "test"]
    assert u0["position"].tolist() == [0, 1, 2, 3, 4]
    u1 = ds.interactions[ds.interactions["user_id"] == 1].sort_values("position")
    assert u1["split"].tolist() == ["train", "train", "test"] and u1["position"].tolist() == [0, 1, 2]
    ex = {e.user_id: e for e in ds.eval_examples("test")}
    assert ex[0].history == [0, 1, 2, 3] and ex[0].targets == [4]
    assert ds.items["source_id"].tolist() == ["1", "2", "3", "4", "5", "6"]


def test_codebook_size_override_and_too_small(tmp_path):
    src = write_folder(tmp_path / "src")
    _, manifest = import_atspeed(src, tmp_path / "a", codebook_size=8)
    assert manifest.codebook_sizes == [8, 8, 8, 2]
    with pytest.raises(DatasetError, match="codebook size 4 is too small"):
        import_atspeed(src, tmp_path / "b", codebook_size=4)


def test_index_without_collisions_adds_no_level(tmp_path):
    index = dict(INDEX, **{"3": [token(0, 2), token(1, 3), token(2, 2)]})
    _, manifest = import_atspeed(write_folder(tmp_path / "src", index=index), tmp_path / "out")
    assert manifest.levels == 3 and manifest.sid_stats["disambiguation_level"] is False


def test_explicit_index_and_index_discovery(tmp_path):
    src = write_folder(tmp_path / "src")
    (src / "notes.json").write_text(json.dumps({"lr": 0.001}))  # not an index: ignored by the glob
    import_atspeed(src, tmp_path / "a")
    (src / "other.index.json").write_text(json.dumps(INDEX))
    with pytest.raises(DatasetError, match="several item index files.*--index"):
        import_atspeed(src, tmp_path / "b")
    _, manifest = import_atspeed(src, tmp_path / "c", index=src / "other.index.json")
    assert manifest.provenance["index_file"] == "other.index.json"


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ({"train": "1 1 2\n2 4 x5\n"}, r"sequential_train\.txt:2: 'x5' is not an integer"),
        ({"valid": "1 4\n2 0\n"}, r"sequential_valid\.txt:2: id 0 is < 1"),
        ({"test": "1 5\n\n3 7\n"}, r"sequential_test\.txt:3: item 7 is not in the index \(index key '6'"),
        ({"test": ""}, r"sequential_test\.txt: empty file"),
        ({"test": "\n  \n"}, r"sequential_test\.txt: empty file"),
        ({"train": None}, r"sequential_train\.txt: missing"),
        ({"train": "1 1\n1 2\n"}, r"sequential_train\.txt:2: user 1 already appeared on line 1"),
        ({"index": dict(INDEX, **{"4": INDEX["4"][:2]})}, r"key '4' has 2 tokens, other items have 3"),
        ({"index": dict(INDEX, **{"5": ["<a_1>", "<b_two>", "<c_0>"]})}, r"key '5': token 2 is '<b_two>'"),
        ({"index": dict(INDEX, **{"5": ["<a_1>", "<c_2>", "<c_0>"]})}, r"key '5': token 2 is '<c_2>'"),
        ({"index": dict(INDEX, **{"5": ["<a_1>", 3, "<c_0>"]})}, r"key '5': token 2 is 3"),
        ({"index": {k if k != "5" else "6": v for k, v in INDEX.items()}}, r"key '6' is not an item id"),
        ({"index": None}, r"no item index \*\.json"),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, files, needle):
    src = write_folder(tmp_path / "src", **files)
    out = tmp_path / "outparent" / "ds"
    out.parent.mkdir()
    with pytest.raises(DatasetError, match=needle):
        import_atspeed(src, out)
    assert list(out.parent.iterdir()) == []  # no dataset, no temp folder


def test_index_that_is_not_json(tmp_path):
    src = write_folder(tmp_path / "src", index=None)
    (src / "broken.json").write_text('{"0": ["<a_1>", "<b_2>",\n oops')
    with pytest.raises(DatasetError, match=r"broken\.json:2: not valid JSON"):
        import_atspeed(src, tmp_path / "out", index=src / "broken.json")


def test_missing_folder_and_existing_out(tmp_path):
    with pytest.raises(DatasetError, match="no such folder"):
        import_atspeed(tmp_path / "nope", tmp_path / "out")
    src = write_folder(tmp_path / "src")
    import_atspeed(src, tmp_path / "out")
    with pytest.raises(DatasetError, match="already exists"):
        import_atspeed(src, tmp_path / "out")
    import_atspeed(src, tmp_path / "out", overwrite=True, name="renamed")
    assert load_dataset(tmp_path / "out").manifest.name == "renamed"


def test_cli_import_atspeed(tmp_path, capsys):
    src = write_folder(tmp_path / "src")
    ok = [
        "data",
        "import",
        "atspeed",
        "--path",
        str(src),
        "--out",
        str(tmp_path / "ok"),
        "--codebook-size",
        "16",
    ]
    assert run_cli(ok) == 0
    printed = capsys.readouterr().out
    assert "items        6" in printed and "+1 disambiguation level" in printed
    assert load_dataset(tmp_path / "ok").manifest.codebook_sizes == [16, 16, 16, 2]
    bad = write_folder(tmp_path / "bad", train="1 1 two\n")
    assert run_cli(["data", "import", "atspeed", "--path", str(bad), "--out", str(tmp_path / "no")]) == 2
    assert "sequential_train.txt:1" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()
