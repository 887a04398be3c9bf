"""The NEZHA quality benchmark's summary: per-arm means over seeds and the one-sided paired t-tests."""

from __future__ import annotations

import pytest

from genrec.studies.nezha.nezha_quality import DEFAULT_ARMS, QUALITY, main, summarise


def fake_run(seed: int, scores: dict[str, float]) -> dict:
    arms = {}
    for arm in DEFAULT_ARMS:
        q = {m: scores[arm] for m in QUALITY}
        q["invalid_rate"] = 0.0
        arms[arm] = {"quality": q, "timings_ms": {"prefill": 1.0, "decode": 2.0, "system": 0.5}}
    return {"seed": seed, "arms": arms}


def test_nezha_below_beam_is_significant_only_when_it_is_lower_every_seed():
    runs = [
        fake_run(42, {"beam": 0.20, "nezha": 0.10, "nezha-4": 0.10, "mtp": 0.05}),
        fake_run(43, {"beam": 0.22, "nezha": 0.11, "nezha-4": 0.11, "mtp": 0.06}),
        fake_run(44, {"beam": 0.21, "nezha": 0.12, "nezha-4": 0.12, "mtp": 0.04}),
    ]
    table, tests = summarise(runs)
    below_beam = tests["nezha_below_beam"]["hr@10"]
    assert below_beam["mean_diff"] == pytest.approx(-0.10) and below_beam["p_value"] < 0.05
    assert tests["nezha_below_mtp"]["hr@10"]["p_value"] > 0.95  # NEZHA is above MTP
    assert "| nezha | 0.1100 ± 0.0100" in table  # mean ± sample std over seeds
    assert "| 1.00 | 2.00 |" in table  # prefill and decode (system time excluded) columns
    for run, steps in zip(runs, (100, 110, 120)):
        run["train"] = {arm: {"train_steps": steps, "train_seconds": 10.0} for arm in DEFAULT_ARMS}
    assert "| 2.00 | 110 | 10 |" in summarise(runs)[0]  # mean optimiser steps and seconds per arm


def test_runner_trains_and_evaluates_the_chosen_arms_per_seed(synth_dir, tmp_path):
    import json

    argv = ["--data", str(synth_dir), "--out", str(tmp_path), "--model-size", "tiny", "--seeds", "1", "2"]
    argv += ["--epochs", "1", "--batch-size", "64", "--arms", "beam", "nezha", "nezha-4"]
    argv += ["--max-users", "16", "--eval-batch-size", "8", "--device", "cpu", "--quiet"]
    summary = main(argv)
    assert json.loads((tmp_path / "summary.json").read_text())["table"] == summary["table"]
    assert [r["seed"] for r in summary["runs"]] == [1, 2]
    for run in summary["runs"]:
        assert set(run["arms"]) == {"beam", "nezha", "nezha-4"} and run["env"]["device"].startswith("cpu")
        # nezha and nezha-4 decode one checkpoint; beam has its own
        assert run["train"]["nezha"]["model_dir"] == run["train"]["nezha-4"]["model_dir"]
        assert run["train"]["beam"]["model_dir"] != run["train"]["nezha"]["model_dir"]
    assert set(summary["tests"]) == {"nezha_below_beam"}  # mtp did not run
    assert set(summary["tests"]["nezha_below_beam"]) == set(QUALITY)


def test_parallel_training_trains_each_shared_checkpoint_once_and_evaluation_reuses_it(synth_dir, tmp_path):
    import json

    from genrec.studies.nezha.nezha_quality import needed_checkpoints, parse_args

    argv = ["--data", str(synth_dir), "--out", str(tmp_path), "--model-size", "tiny", "--seeds", "1", "2"]
    argv += ["--epochs", "1", "--batch-size", "64", "--arms", "beam", "nezha", "nezha-4", "nezha-every"]
    argv += ["--max-users", "8", "--eval-batch-size", "8", "--device", "cpu", "--threads", "1", "--quiet"]
    # beam + one nezha checkpoint (shared by nezha, nezha-4, nezha-every) per seed
    needed = needed_checkpoints(parse_args(argv))
    assert len(needed) == 4 and {c.seed for c in needed.values()} == {1, 2}

    trained = main([*argv, "--train-jobs", "2", "--train-only"])
    assert sorted(trained["trained"]) == sorted(d.name for d in needed)
    assert "runs" not in trained  # --train-only evaluates nothing
    for d in needed:
        assert "train_seconds" in json.loads((d / "config.json").read_text())

    summary = main([*argv, "--train-jobs", "2"])
    assert summary["trained"] == []  # every checkpoint was reused
    assert {r["train"]["nezha-every"]["model_dir"] for r in summary["runs"]} <= {str(d) for d in needed}


def test_train_jobs_below_one_is_refused(synth_dir, tmp_path):
    import pytest

    with pytest.raises(SystemExit):
        main(["--data", str(synth_dir), "--out", str(tmp_path / "x"), "--train-jobs", "0"])
    assert not (tmp_path / "x").exists()


def test_a_missing_dataset_is_refused_before_any_training_starts(tmp_path):
    import pytest

    from genrec.workloads.errors import UserInputError

    argv = ["--data", str(tmp_path / "missing"), "--out", str(tmp_path / "out"), "--model-size", "tiny"]
    argv += ["--seeds", "1", "2", "--epochs", "1", "--arms", "beam", "--device", "cpu", "--train-jobs", "2"]
    with pytest.raises(UserInputError, match="missing"):
        main(argv)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_a_failed_parallel_training_stops_the_run_with_its_own_error(synth_dir, tmp_path):
    import pytest

    from genrec.studies.nezha.nezha_quality import needed_checkpoints, parse_args

    argv = ["--data", str(synth_dir), "--out", str(tmp_path), "--model-size", "tiny", "--seeds", "1", "2"]
    argv += ["--epochs", "1", "--arms", "beam", "--device", "cpu", "--threads", "1", "--train-jobs", "2"]
    first = sorted(needed_checkpoints(parse_args(argv)))[0]
    (tmp_path / f"{first.name}.lock").mkdir()  # its worker cannot open the lock: a training failure
    with pytest.raises(IsADirectoryError):
        main(argv)
    assert not first.exists()
