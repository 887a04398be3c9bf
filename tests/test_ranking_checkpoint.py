"""Ranking checkpoints: save/load round trip (same scores in every mode), atomic replacement, clear
errors for missing or malformed folders, and `genrec rank train` writing one."""

from __future__ import annotations

import json

import pytest
import torch

from genrec.workloads.errors import UserInputError
from genrec.workloads.ranking.checkpoint import load_ranking, read_ranking_config, save_ranking
from genrec.workloads.ranking.model import RankingConfig, init_model
from genrec.workloads.ranking.modes import MODES, RankingScorer

CFG = RankingConfig(
    d_user=12, d_seq=5, seq_len=4, d_item=7, d_cross=3, d_attn=6, d_hidden=10, d_user_emb=4, d_tower=8,
    experts=2, tasks=2,
)  # fmt: skip


def request(cfg: RankingConfig, b: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    profile, seq = torch.randn(cfg.d_user, generator=g), torch.randn(cfg.seq_len, cfg.d_seq, generator=g)
    user = {"profile": profile, "seq": seq}
    return user, torch.randn(b, cfg.d_item, generator=g), torch.randn(b, cfg.d_cross, generator=g)


def test_round_trip_gives_the_same_scores(tmp_path):
    model = init_model(CFG, seed=3)
    path = save_ranking(tmp_path / "rank", model, meta={"steps": 0})
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((path / "config.json").read_text())
    assert config["format_version"] == 1 and config["config"]["d_user"] == 12
    loaded = load_ranking(path)
    assert loaded.cfg == CFG and loaded.meta == {"steps": 0} and not loaded.training
    user, items, cross = request(CFG, 9)
    before, after = RankingScorer(model), RankingScorer(loaded)
    for mode in MODES:
        torch.testing.assert_close(
            after.score(user, items, cross, mode), before.score(user, items, cross, mode), rtol=0, atol=0
        )
    assert read_ranking_config(path)[0] == CFG


def test_save_replaces_atomically_and_leaves_no_temp_folders(tmp_path):
    out = tmp_path / "rank"
    save_ranking(out, init_model(CFG, seed=0))
    save_ranking(out, init_model(CFG, seed=1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank"]
    ref = init_model(CFG, seed=1).state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in load_ranking(out).state_dict().items())


def test_missing_and_malformed_folders_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(UserInputError, match="no such folder.*genrec rank train --out DIR"):
        load_ranking(tmp_path / "nope")
    path = save_ranking(tmp_path / "rank", init_model(CFG))
    (path / "model.safetensors").unlink()
    with pytest.raises(UserInputError, match=r"model.safetensors missing.*genrec rank train"):
        load_ranking(path)

    path = save_ranking(tmp_path / "rank", init_model(CFG))
    (path / "config.json").write_text("{oops")
    with pytest.raises(UserInputError, match=r"config.json: not valid JSON"):
        load_ranking(path)

    (path / "config.json").write_text(json.dumps({"format_version": 1, "model": {}}))
    with pytest.raises(UserInputError, match="not a ranking checkpoint"):
        load_ranking(path)

    path = save_ranking(tmp_path / "rank", init_model(CFG))
    config = json.loads((path / "config.json").read_text())
    config["config"]["d_user"] = 13  # the weights were saved for 12
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserInputError, match="do not match config.json"):
        load_ranking(path)

    config["config"]["colour"] = 1
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserInputError, match=r"unknown fields \['colour'\]"):
        load_ranking(path)

    path = save_ranking(tmp_path / "rank", init_model(CFG))
    (path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(UserInputError, match="not a readable safetensors file"):
        load_ranking(path)


def test_rank_train_command_writes_a_loadable_checkpoint(tmp_path):
    import typer
    from typer.testing import CliRunner

    from genrec.platform.commands import rank

    root = typer.Typer()
    rank.register(root)
    root.command("noop")(lambda: None)  # a second command so `rank` stays a subcommand
    out = tmp_path / "rank"
    result = CliRunner().invoke(root, ["rank", "train", "--out", str(out), "--steps", "3", "--seed", "1"])
    assert result.exit_code == 0, result.output
    assert "held-out AUC per task" in result.output and str(out) in result.output
    model = load_ranking(out)
    assert model.cfg == RankingConfig() and model.meta["steps"] == 3 and len(model.meta["valid_auc"]) == 3
    bad = CliRunner().invoke(root, ["rank", "train", "--out", str(out), "--size", "huge"])
    assert bad.exit_code != 0 and "choose one of" in str(bad.exception)
