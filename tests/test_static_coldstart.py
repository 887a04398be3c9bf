"""The cold-start benchmark (static_coldstart) end to end on the tiny synth model: a copy of the synth
data whose few test-target items lose their training interactions, so they become cold-start items."""

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from genrec.studies.static.static_coldstart import main
from genrec.workloads.data.dataset import load_dataset

METHODS = {"unconstrained", "constrained", "constrained_random"}


def cold_copy(synth_dir: Path, out: Path, n_items: int = 3) -> Path:
    """synth_dir with the training interactions of the `n_items` most frequent test targets removed."""
    shutil.copytree(synth_dir, out)
    path = out / "interactions.parquet"
    inter = pd.read_parquet(path)
    test_items = inter.loc[inter["split"] == "test", "item_id"].value_counts().index[:n_items]
    keep = ~((inter["split"] == "train") & inter["item_id"].isin(test_items))
    inter[keep].reset_index(drop=True).to_parquet(path, index=False)
    return out


def test_coldstart_compares_the_three_methods_on_cold_target_users(
    synth_dir, tiny_model_dir, tmp_path, capsys
):
    data = cold_copy(synth_dir, tmp_path / "cold")
    ds = load_dataset(data)
    cold = set(np.flatnonzero(ds.item_popularity("train") == 0).tolist())
    users = [e for e in ds.eval_examples("test") if cold & set(e.targets)]
    assert 0 < len(cold) <= 10 and users  # the setup the assertions below rely on

    out = tmp_path / "cold.json"
    argv = ["--model", str(tiny_model_dir), "--data", str(data), "--device", "cpu", "--beam-width", "12"]
    argv += ["--dense-levels", "1", "--batch-size", "8", "--random-draws", "5", "--threads", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads(out.read_text())
    assert printed == written
    assert written["users"] == len(users) and written["cold_start_items"] == len(cold)
    assert written["catalogue_items"] == ds.num_items and written["beam_width"] == 12
    results = written["results"]
    assert set(results) == METHODS
    for r in results.values():
        assert set(r) == {"recall@1", "recall@10"} and 0.0 <= r["recall@1"] <= r["recall@10"] <= 1.0
    # at most 10 cold items and a wider beam: constrained search and random guessing return them all
    assert results["constrained"]["recall@10"] == 1.0
    assert results["constrained_random"]["recall@10"] == 1.0

    assert main([*argv, "--max-users", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["users"] == 1


def test_coldstart_without_cold_target_users_exits_2(synth_dir, tiny_model_dir, capsys):
    ds = load_dataset(synth_dir)
    cold = set(np.flatnonzero(ds.item_popularity("train") == 0).tolist())
    if any(cold & set(e.targets) for e in ds.eval_examples("test")):
        pytest.skip("the synth data has a test user with a cold-start target")
    assert main(["--model", str(tiny_model_dir), "--data", str(synth_dir), "--device", "cpu"]) == 2
    assert "no test user has a cold-start target" in capsys.readouterr().err
