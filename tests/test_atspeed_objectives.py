"""The AtSpeed objectives driver end to end on a small synthetic set: one shared target, drafts per seed,
strict rows equal to beam search, relaxed rows compared with the target's sampling beam search."""

import json
from pathlib import Path

import pytest

from genrec.studies.atspeed import atspeed_objectives
from genrec.workloads.errors import UserInputError
from genrec.workloads.training.teacher import load_teacher


def test_shared_target_strict_and_relaxed(synth_dir, tiny_model_dir, tmp_path):
    models = tmp_path / "models"
    argv = [
        "--data", str(synth_dir), "--models-dir", str(models), "--target", str(tiny_model_dir),
        "--objectives", "sft", "atspeed_s", "atspeed_r", "--seeds", "1", "2", "--epochs", "1",
        "--draft-size", "tiny", "--k", "3", "--draft-beams", "6", "--gamma", "2", "--users", "6",
        "--verification", "strict", "relaxed", "--out", str(tmp_path / "out.json"),
    ]  # fmt: skip
    result = atspeed_objectives.main(argv)
    assert (tmp_path / "out.json").is_file()
    # one target for both seeds (not trained here), drafts per seed and objective
    for seed in (1, 2):
        assert result["training"][seed]["target"]["dir"] == str(tiny_model_dir.resolve())
    assert len([d for d in models.glob("draft-tiny-*-seed*-*") if d.is_dir()]) == 6  # 3 objectives x 2 seeds
    teachers = sorted(p.name for p in models.glob("teacher-*.parquet"))
    assert any(t.startswith("teacher-beam-k10-shared-") for t in teachers)
    assert sum(t.startswith("teacher-sample-k10-shared-") for t in teachers) == 2  # one per seed
    strict = [r for r in result["rows"] if r["verification"] == "strict"]
    relaxed = [r for r in result["rows"] if r["verification"] == "relaxed"]
    assert len(strict) == len(relaxed) == 6
    assert all(r["identical_share"] == 1.0 for r in strict)  # strict is lossless for any draft
    for r in relaxed:
        assert len(r["per_user_atspeed_recall"]) == len(r["per_user_reference_recall"]) == 6
        assert 0.0 <= r["atspeed_recall@3"] <= 1.0
    summary = result["summary"]
    assert set(summary) == {"k3_n6_strict", "k3_n6_relaxed"}
    assert "atspeed_s_vs" in summary["k3_n6_strict"]["sft"]  # AtSpeed-S is the strict arm's main
    assert "atspeed_r_vs" in summary["k3_n6_relaxed"]["sft"]  # ... AtSpeed-R the relaxed one's
    rec = summary["k3_n6_relaxed"]["atspeed_r"]["recall"]
    assert len(rec["atspeed_per_seed"]) == 2 and 0 <= rec["users_sign_flip_lower"]["p_value"] <= 1


def test_a_missing_shared_target_is_a_clear_error(synth_dir, tmp_path):
    argv = ["--data", str(synth_dir), "--models-dir", str(tmp_path), "--target", str(tmp_path / "nope")]
    with pytest.raises(UserInputError, match="no checkpoint there"):
        atspeed_objectives.main(argv)


def test_mix_objectives_train_on_the_sft_drafts_mixture(synth_dir, tiny_model_dir, tmp_path):
    """`atspeed_s-mix`: the SFT draft of the seed is trained first and mixed with the target; the
    teacher file names the draft and lambda, and another lambda builds another file."""
    models = tmp_path / "models"
    argv = [
        "--data", str(synth_dir), "--models-dir", str(models), "--target", str(tiny_model_dir),
        "--objectives", "atspeed_s-mix", "--seeds", "1", "--epochs", "1", "--draft-size", "tiny",
        "--k", "3", "--teacher-k", "3", "--draft-beams", "3", "--gamma", "2", "--users", "2",
    ]  # fmt: skip
    result = atspeed_objectives.main([*argv, "--mix-lambda", "0.5"])
    sft = [d for d in models.glob("draft-tiny-sft-seed1-*") if d.is_dir()]
    assert len(sft) == 1  # q, trained by the driver though `sft` was not asked for
    (mixed,) = models.glob("teacher-mix0.5-k3-*.parquet")
    teacher = load_teacher(mixed)
    assert teacher.kind == "mixture" and teacher.manifest["mix_draft"] == str(sft[0].resolve())
    draft_dir = Path(result["training"][1]["atspeed_s-mix"]["dir"])
    draft = json.loads((draft_dir / "config.json").read_text())
    assert draft["teacher"] == str(mixed.resolve()) and draft["teacher_kind"] == "mixture"
    assert all(r["identical_share"] == 1.0 for r in result["rows"])
    atspeed_objectives.main([*argv, "--mix-lambda", "0.25"])
    assert len(list(models.glob("teacher-mix0.25-k3-*.parquet"))) == 1
    assert len([d for d in models.glob("draft-tiny-atspeed_s-mix-seed1-*") if d.is_dir()]) == 2


def test_all_step_objectives_train_on_the_all_step_teacher_file(synth_dir, tiny_model_dir, tmp_path):
    """`atspeed_s-ad` / `seqkd-ad` / `atspeed_r-ad`: extra teacher files holding every level's beams
    (beam, and sampled per seed), and drafts whose config says all_steps (so they never share a cache
    entry with the plain ones)."""
    models = tmp_path / "models"
    argv = [
        "--data", str(synth_dir), "--models-dir", str(models), "--target", str(tiny_model_dir),
        "--objectives", "atspeed_s", "atspeed_s-ad", "seqkd-ad", "atspeed_r-ad", "--seeds", "1",
        "--epochs", "1", "--draft-size", "tiny", "--k", "3", "--teacher-k", "3", "--draft-beams", "3",
        "--gamma", "2", "--users", "2",
    ]  # fmt: skip
    result = atspeed_objectives.main(argv)
    (steps,) = models.glob("teacher-beam-all-k3-shared-*.parquet")
    (plain,) = models.glob("teacher-beam-k3-shared-*.parquet")
    assert load_teacher(steps).step_codes is not None and load_teacher(plain).step_codes is None
    (sampled,) = models.glob("teacher-sample-all-k3-shared-*-seed1.parquet")
    assert load_teacher(sampled).kind == "sample" and load_teacher(sampled).step_codes is not None
    names = ("atspeed_s", "atspeed_s-ad", "seqkd-ad", "atspeed_r-ad")
    dirs = {o: Path(result["training"][1][o]["dir"]) for o in names}
    configs = {o: json.loads((d / "config.json").read_text()) for o, d in dirs.items()}
    assert configs["atspeed_s"]["train"]["all_steps"] is False
    for o in ("atspeed_s-ad", "seqkd-ad"):
        assert configs[o]["train"]["all_steps"] is True and configs[o]["teacher"] == str(steps.resolve())
    assert configs["atspeed_r-ad"]["train"]["all_steps"] is True
    assert configs["atspeed_r-ad"]["teacher"] == str(sampled.resolve())
    assert len(set(dirs.values())) == 4
    assert all(r["identical_share"] == 1.0 for r in result["rows"])  # strict stays lossless


def test_unknown_mix_objectives_are_refused(synth_dir, tmp_path):
    argv = ["--data", str(synth_dir), "--models-dir", str(tmp_path)]
    for objectives in (["atspeed_r-mix"], ["wordkd-mix"], ["atspeed_s-literal-mix"], ["atspeed_s-ad-mix"]):
        with pytest.raises(SystemExit):
            atspeed_objectives.parse_args([*argv, "--objectives", *objectives])
    with pytest.raises(SystemExit):
        atspeed_objectives.parse_args([*argv, "--objectives", "seqkd-mix", "--mix-lambda", "2"])


def test_recipe_flags_reach_every_trained_model_and_its_cache_key(synth_dir, tiny_model_dir, tmp_path):
    """--lr / --batch-size / --warmup-steps / --weight-decay / --patience go into the drafts'
    TrainConfig (and so into config.json and the cached folder's name); left out, the config is
    TrainConfig's default, so drafts cached before the flags existed are reused."""
    models = tmp_path / "models"
    base = [
        "--data", str(synth_dir), "--models-dir", str(models), "--target", str(tiny_model_dir),
        "--objectives", "sft", "--seeds", "1", "--epochs", "1", "--draft-size", "tiny",
        "--k", "3", "--draft-beams", "3", "--gamma", "2", "--users", "2",
    ]  # fmt: skip
    assert atspeed_objectives.recipe_overrides(atspeed_objectives.parse_args(base)) == {}
    recipe = [
        "--lr", "0.001", "--batch-size", "64", "--warmup-steps", "7", "--weight-decay", "0.1",
        "--patience", "2",
    ]  # fmt: skip
    plain = atspeed_objectives.main(base)["training"][1]["sft"]["dir"]
    tuned = atspeed_objectives.main([*base, *recipe])["training"][1]["sft"]["dir"]
    assert plain != tuned
    train = json.loads((Path(tuned) / "config.json").read_text())["train"]
    assert (train["lr"], train["batch_size"], train["warmup_steps"]) == (0.001, 64, 7)
    assert (train["weight_decay"], train["patience"]) == (0.1, 2)
    default = json.loads((Path(plain) / "config.json").read_text())["train"]
    assert (default["lr"], default["weight_decay"]) == (3e-3, 0.05)
    with pytest.raises(UserInputError, match="weight_decay must be >= 0"):
        atspeed_objectives.main([*base, "--weight-decay", "-1"])


def test_training_logs_a_line_per_model_and_epoch_unless_quiet(synth_dir, tiny_model_dir, tmp_path, capsys):
    """A 20-epoch run trains for an hour in silence otherwise: each model it trains gets a line naming
    it, then one per epoch; a reused model gets none; --quiet drops them and keeps the rows."""
    base = [
        "--data", str(synth_dir), "--models-dir", str(tmp_path / "models"), "--target", str(tiny_model_dir),
        "--objectives", "sft", "--seeds", "1", "--epochs", "2", "--patience", "5", "--draft-size", "tiny",
        "--k", "3", "--draft-beams", "3", "--gamma", "2", "--users", "2",
    ]  # fmt: skip
    atspeed_objectives.main(base)
    out = capsys.readouterr().out
    assert "training draft-tiny-sft-seed1-" in out and "(next_item, up to 2 epochs)" in out
    assert "epoch 1: train loss" in out and "epoch 2: train loss" in out
    atspeed_objectives.main(base)  # reused: nothing to train
    assert "training " not in capsys.readouterr().out
    atspeed_objectives.main([*base, "--seeds", "2", "--quiet"])
    quiet = capsys.readouterr().out
    assert "training " not in quiet and "epoch 1:" not in quiet
    assert "sft" in quiet  # the measured rows still print


def test_an_objectives_own_alpha_trains_its_own_draft_and_names_its_rows(synth_dir, tiny_model_dir, tmp_path):
    """`seqkd@0.3` beside `seqkd` (--alpha 0.5): two drafts, each with its alpha in config.json, two row
    labels in the summary; `seqkd@0.5` is the same configuration as `seqkd` and reuses its draft."""
    models = tmp_path / "models"
    base = [
        "--data", str(synth_dir), "--models-dir", str(models), "--target", str(tiny_model_dir),
        "--seeds", "1", "--epochs", "1", "--draft-size", "tiny", "--k", "3", "--teacher-k", "3",
        "--draft-beams", "3", "--gamma", "2", "--users", "2", "--alpha", "0.5",
    ]  # fmt: skip
    result = atspeed_objectives.main([*base, "--objectives", "atspeed_s@0.7", "seqkd@0.3", "seqkd"])
    drafts = result["training"][1]
    labels = ["atspeed_s@0.7", "seqkd@0.3", "seqkd"]
    alphas = {o: json.loads((Path(drafts[o]["dir"]) / "config.json").read_text())["alpha"] for o in labels}
    assert alphas == {"atspeed_s@0.7": 0.7, "seqkd@0.3": 0.3, "seqkd": 0.5}
    assert drafts["seqkd@0.3"]["dir"] != drafts["seqkd"]["dir"]
    assert Path(drafts["seqkd@0.3"]["dir"]).name.startswith("draft-tiny-seqkd-seed1-")
    per_k = result["summary"]["k3_n3_strict"]
    assert set(per_k) == set(labels)
    assert "atspeed_s@0.7_vs" in per_k["seqkd"]  # the labelled AtSpeed-S is the one compared
    again = atspeed_objectives.main([*base, "--objectives", "seqkd@0.5"])
    assert again["training"][1]["seqkd@0.5"]["dir"] == drafts["seqkd"]["dir"]


@pytest.mark.parametrize("label", ["seqkd@high", "seqkd@1.5", "sft@0.3", "nope@0.5", "seqkd@nan"])
def test_a_bad_alpha_label_is_refused(synth_dir, tmp_path, label, capsys):
    argv = ["--data", str(synth_dir), "--models-dir", str(tmp_path), "--objectives", label]
    with pytest.raises(SystemExit):
        atspeed_objectives.parse_args(argv)
    assert label in capsys.readouterr().err
