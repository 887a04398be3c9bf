"""Merging AtSpeed objectives runs: the union of rows goes through the driver's own compare, labels can be
prefixed per file, pair tests point the right way, and runs of another setup or overlapping rows are
refused before anything is written."""

import json
import subprocess
import sys

import numpy as np
import pytest

from genrec.studies.atspeed import atspeed_merge
from genrec.studies.atspeed.atspeed_objectives import compare
from genrec.workloads.errors import UserInputError

SETUP = {"data": "/d", "target": "/t", "users": 8, "gamma": 2, "teacher_k": 3}


def row(objective: str, seed: int, per_user: list[float], verification: str = "strict", n: int = 6) -> dict:
    r = {
        "objective": objective, "seed": seed, "k": 3, "draft_beams": n, "verification": verification,
        "accepted_steps": float(np.mean(per_user)), "per_user_accepted_steps": per_user,
    }  # fmt: skip
    if verification == "strict":
        return r | {"identical_share": 1.0}
    recall = [float(u % 2) for u in range(len(per_user))]
    return r | {
        "atspeed_recall@3": float(np.mean(recall)), "reference_recall@3": float(np.mean(recall)),
        "per_user_atspeed_recall": recall, "per_user_reference_recall": recall,
    }  # fmt: skip


def write_part(path, rows, **setup) -> str:
    path.write_text(json.dumps({"args": SETUP | setup, "rows": rows}))
    return str(path)


def steps(seed: int, shift: float) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(x) for x in rng.integers(0, 3, size=8) + shift]


@pytest.fixture
def two_recipes(tmp_path):
    """Recipe A (plain labels) and recipe B (prefixed), B's AtSpeed-S one step ahead for every user."""
    a = [
        row(o, s, steps(s, 0.0), v)
        for o in ("atspeed_s", "seqkd")
        for s in (1, 2)
        for v in ("strict", "relaxed")
    ]
    b = [row("atspeed_s", s, steps(s, 1.0), v) for s in (1, 2) for v in ("strict", "relaxed")]
    return write_part(tmp_path / "a.json", a), "b:" + write_part(tmp_path / "b.json", b)


def test_the_merge_is_the_drivers_compare_over_the_union(two_recipes, tmp_path):
    a, b = two_recipes
    out = tmp_path / "merged.json"
    result = atspeed_merge.main([a, b, "--pair", "b:atspeed_s>atspeed_s", "--pair", "atspeed_s>b:atspeed_s",
                                 "--out", str(out)])  # fmt: skip
    rows = atspeed_merge.merge_rows([a, b])
    labels = ["atspeed_s", "seqkd", "b:atspeed_s"]
    settings = [(3, 6, "strict"), (3, 6, "relaxed")]
    same = json.dumps(compare(rows, labels, settings), sort_keys=True)  # as text: NaN t-statistics
    assert json.dumps(result["summary"], sort_keys=True) == same
    assert result["summary"]["k3_n6_strict"]["b:atspeed_s"]["per_seed"] == [
        float(np.mean(steps(1, 1.0))),
        float(np.mean(steps(2, 1.0))),
    ]
    ahead = result["pairs"]["k3_n6_strict"]["b:atspeed_s>atspeed_s"]["users_sign_flip"]["p_value"]
    behind = result["pairs"]["k3_n6_strict"]["atspeed_s>b:atspeed_s"]["users_sign_flip"]["p_value"]
    assert ahead < 0.01 < 0.99 < behind  # 16 users, every one a step ahead
    saved = json.loads(out.read_text())
    assert saved["seeds"] == [1, 2] and not any(k.startswith("per_user") for r in saved["rows"] for k in r)


def test_overlapping_rows_are_refused_with_the_prefix_hint(two_recipes, tmp_path):
    a, _ = two_recipes
    out = tmp_path / "merged.json"
    with pytest.raises(UserInputError, match=r"in both .*a\.json.*give one of them a prefix"):
        atspeed_merge.main([a, a, "--out", str(out)])
    assert not out.exists()
    assert atspeed_merge.main([a, f"again:{a}"])["seeds"] == [1, 2]  # a prefix makes it a new label


def test_runs_of_another_setup_are_refused(tmp_path):
    a = write_part(tmp_path / "a.json", [row("sft", 1, [1.0] * 8)])
    b = write_part(tmp_path / "b.json", [row("seqkd", 1, [1.0] * 8)], users=16)
    with pytest.raises(UserInputError, match=r"--users 16 .* 8: its rows are a different measurement"):
        atspeed_merge.main([a, b])


def test_only_settings_every_label_has_are_compared_and_seed_sets_must_match(tmp_path):
    a = write_part(tmp_path / "a.json", [row("sft", 1, [1.0] * 8), row("sft", 1, [1.0] * 8, n=12)])
    b = write_part(tmp_path / "b.json", [row("seqkd", 1, [2.0] * 8)])
    assert list(atspeed_merge.main([a, b])["summary"]) == ["k3_n6_strict"]  # N = 12 only for sft
    c = write_part(tmp_path / "c.json", [row("wordkd", 2, [2.0] * 8)])
    with pytest.raises(UserInputError, match=r"wordkd has seeds \[2\] but sft has \[1\]"):
        atspeed_merge.main([a, c])


@pytest.mark.parametrize("pair", ["sft", "sft>sft", "sft>nope", ">sft"])
def test_a_bad_pair_is_refused(tmp_path, pair):
    a = write_part(tmp_path / "a.json", [row("sft", 1, [1.0] * 8), row("seqkd", 1, [1.0] * 8)])
    with pytest.raises(UserInputError, match="want 'A>B' with two different labels"):
        atspeed_merge.main([a, "--pair", pair])


def test_missing_or_foreign_files_say_what_is_wanted(tmp_path):
    with pytest.raises(UserInputError, match="no such file"):
        atspeed_merge.main([str(tmp_path / "none.json")])
    (tmp_path / "x.json").write_text('{"rows": []}')
    with pytest.raises(UserInputError, match="not an `atspeed_objectives --out` file"):
        atspeed_merge.main([str(tmp_path / "x.json")])
    (tmp_path / "y.json").write_text(json.dumps({"args": SETUP, "rows": [{"objective": "sft", "seed": 1}]}))
    with pytest.raises(UserInputError, match=r"not an `atspeed_objectives --out` file \(KeyError\('k'\)"):
        atspeed_merge.main([str(tmp_path / "y.json")])  # a row without the fields it is looked up by
    cmd = [sys.executable, "-m", "genrec.studies.atspeed.atspeed_merge", str(tmp_path / "none.json")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 2 and "error:" in done.stderr and "Traceback" not in done.stderr
