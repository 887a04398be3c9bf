"""Issue 6's comparison as a benchmark: one arm per trial, shared checkpoints, the report page's tests."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from genrec.platform.benchmarks import get_benchmark
from genrec.studies.nezha.nezha_arms import ARMS, arm_point, checkpoint_dir
from genrec.workloads.errors import UserInputError
from genrec.workloads.metrics import paired_t_test_less
from genrec.workloads.training.train_config import TrainConfig

QUICK = {"epochs": 1, "max_steps": 4, "batch_size": 32, "max_users": 16, "eval_batch_size": 8}


def test_arms_share_a_checkpoint_only_when_they_train_the_same_way(synth_dir, tmp_path):
    models = tmp_path / "models"
    nezha4 = arm_point("nezha-4", data=str(synth_dir), models_dir=str(models), seed=7, **QUICK)
    nezha = arm_point("nezha", data=str(synth_dir), models_dir=str(models), seed=7, **QUICK)
    beam = arm_point("beam", data=str(synth_dir), models_dir=str(models), seed=7, **QUICK)
    every = arm_point("nezha-every", data=str(synth_dir), models_dir=str(models), seed=7, **QUICK)
    assert nezha["model_dir"] == nezha4["model_dir"] == every["model_dir"] != beam["model_dir"]
    # checking every step's prefixes leaves only beams that can end in an item: K items per user
    assert every["invalid_rate"] == every["missing_rate"] == 0.0 and every["users_with_k_valid"] == 1.0
    assert 0.0 <= nezha4["users_with_k_valid"] <= nezha["users_with_k_valid"] <= 1.0
    assert len([p for p in models.iterdir() if p.is_dir()]) == 2  # nezha-4 trained it, nezha reused it
    # same checkpoint, same drafts: verification can only drop SIDs that are not items
    assert nezha["drafts_valid_share"] == pytest.approx(nezha4["drafts_valid_share"])
    assert nezha["invalid_rate"] == 0.0
    unverified = nezha4["invalid_rate"] + nezha4["missing_rate"]
    assert unverified == pytest.approx(1 - nezha4["drafts_valid_share"])
    assert math.isnan(beam["drafts_valid_share"]) and math.isnan(beam["history_blind_val_loss"])
    for row in (nezha, beam):
        assert row["users"] == 16 and row["train_steps"] == 4 and row["latency_p50_ms"] > 0
        assert 0 <= row["hr@5"] <= row["hr@10"] <= 1 and row["prefill_ms"] > 0 and row["decode_ms"] > 0
    assert nezha["history_blind_val_loss"] > 0  # head objectives record their reference loss


def test_checkpoint_names_change_with_the_training_configuration(tmp_path):
    base = TrainConfig(model_size="tiny", epochs=8, seed=42, objective="nezha")
    same = checkpoint_dir(tmp_path, "data", TrainConfig(**vars(base)))
    assert checkpoint_dir(tmp_path, "data", base) == same
    for changed in (
        TrainConfig(**{**vars(base), "epochs": 9}),
        TrainConfig(**{**vars(base), "head_variant": "add"}),
        TrainConfig(**{**vars(base), "seed": 43}),
        TrainConfig(**{**vars(base), "head_batching": "per_example"}),
    ):
        assert checkpoint_dir(tmp_path, "data", changed) != same
    assert checkpoint_dir(tmp_path, "other-data", base) != same
    # next_item ignores head_batching, so the beam arms keep one checkpoint for either
    beam = TrainConfig(model_size="tiny", epochs=8, seed=42)
    per_example = TrainConfig(**{**vars(beam), "head_batching": "per_example"})
    assert checkpoint_dir(tmp_path, "data", beam) == checkpoint_dir(tmp_path, "data", per_example)


def test_unknown_arms_and_bad_budgets_are_rejected():
    from genrec.platform.params import parse_benchmark_params

    def check(values):
        return parse_benchmark_params("nezha_arm", values)

    with pytest.raises(UserInputError, match="`arm` must be one of"):
        check({"arm": "medusa"})
    with pytest.raises(UserInputError, match="`epochs` must be >= 1, got 0"):
        check({"arm": "beam", "epochs": 0})
    with pytest.raises(UserInputError, match="head_batching must be one of"):
        check({"arm": "nezha", "head_batching": "bucketed"})
    assert check({"arm": "nezha", "head_batching": "per_example"}).head_batching == "per_example"
    assert get_benchmark("nezha_arm").Params(arm="beam").epochs == 8
    assert set(ARMS) == {
        "beam", "nezha", "nezha-1", "nezha-2", "nezha-3", "nezha-4", "nezha-every", "mtp", "beam-converged"
    }  # fmt: skip
    assert ARMS["beam-converged"].epoch_factor == 5 and ARMS["beam"].epoch_factor == 1


def test_shipped_arm_experiment_resolves_its_paths_against_the_repository():
    from genrec.platform.experiment_loading import load_experiment

    repo = Path(__file__).resolve().parents[1]
    cfg = load_experiment(
        repo / "studies" / "nezha" / "experiments" / "nezha_vs_beam.yaml", base_dir=repo, check_files=False
    )
    assert Path(cfg.params["data"]).is_absolute() and cfg.params["data"].endswith("runs/data/synth")
    assert Path(cfg.params["models_dir"]).is_absolute()
    assert cfg.num_trials() == 9 * 3


def test_arm_experiment_without_its_dataset_fails_before_ray(tmp_path):
    import yaml

    from genrec.platform.experiment_loading import load_experiment

    repo = Path(__file__).resolve().parents[1]
    raw = yaml.safe_load((repo / "studies" / "nezha" / "experiments" / "nezha_vs_beam.yaml").read_text())
    raw["params"]["data"] = "no/such/data"
    path = tmp_path / "arms.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserInputError, match=r"`params.data`: .*no/such/data is not a dataset folder"):
        load_experiment(path, base_dir=tmp_path)
    load_experiment(path, base_dir=tmp_path, check_files=False)  # the check is about files only


def fake_rows(seeds=(42, 43, 44)):
    rng = np.random.default_rng(0)
    rows = []
    for arm, level in (("beam", 0.30), ("nezha", 0.31), ("mtp", 0.10)):
        for s in seeds:
            q = level + rng.normal(0, 0.01)
            rows.append(
                {
                    "benchmark": "nezha_arm",
                    "param_arm": arm,
                    "seed": s,
                    "dataset_name": "synth",
                    **{m: q for m in ("hr@5", "hr@10", "ndcg@5", "ndcg@10")},
                    "valid_share": 1.0,
                    "drafts_valid_share": 0.9,
                    "latency_p50_ms": 10.0,
                    "prefill_ms": 6.0,
                    "decode_ms": 4.0,
                    "train_seconds": 1.0,
                    "train_steps": 10,
                    "device": "cpu",
                    "threads": 1,
                    "torch_version": "x",
                    "git_commit": "abc",
                }
            )
    return pd.DataFrame(rows)


def test_report_page_runs_paired_tests_matched_by_seed(tmp_path):
    from genrec.studies.nezha.report import build_nezha_report, is_nezha_frame, paired_tests

    df = fake_rows()
    assert is_nezha_frame(df)
    rows = {r[0]: r for r in paired_tests(df, "nezha", "beam")}
    nezha = df[df.param_arm == "nezha"].sort_values("seed")["hr@10"].tolist()
    beam = df[df.param_arm == "beam"].sort_values("seed")["hr@10"].tolist()
    expected = paired_t_test_less(nezha, beam)
    assert rows["hr@10"][1] == 3 and rows["hr@10"][4] == f"{expected['p_value']:.3f}"
    mtp = {r[0]: r for r in paired_tests(df, "mtp", "nezha")}
    assert mtp["hr@10"][5] == "significantly below"  # 0.10 vs 0.31 over three seeds
    # a seed present in one arm only is left out of the pairs
    partial = pd.concat([df, df[(df.param_arm == "nezha") & (df.seed == 42)].assign(seed=45)])
    assert {r[0]: r for r in paired_tests(partial, "nezha", "beam")}["hr@10"][1] == 3
    one_seed = {r[0]: r for r in paired_tests(fake_rows(seeds=(42,)), "nezha", "beam")}
    assert "needs 2 or more seeds" in one_seed["hr@10"][5]
    page = build_nezha_report(df, tmp_path / "r.html", "arms").read_text()
    assert "H1: NEZHA below beam" in page and "H1: NEZHA below mtp" in page and page.count("<table") >= 4
