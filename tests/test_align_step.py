"""The all-step training-step benchmark runs end to end on a synthetic set: every arm timed, the same
loss as the objective computes, and a teacher without step beams refused."""

import json

import numpy as np
import pytest
import torch
from conftest import run_cli

from genrec.studies.atspeed import align_step
from genrec.workloads.errors import UserInputError


@pytest.fixture(scope="module")
def teachers(tiny_model_dir, synth_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("teachers")
    argv = [
        "atspeed",
        "teacher",
        "--target",
        str(tiny_model_dir),
        "--data",
        str(synth_dir),
        "--k",
        "4",
        "--quiet",
    ]
    assert run_cli([*argv, "--all-steps", "--out", str(out / "steps.parquet")]) == 0
    assert run_cli([*argv, "--out", str(out / "plain.parquet")]) == 0
    return out / "steps.parquet", out / "plain.parquet"


def test_every_arm_is_timed_and_scores_the_objectives_loss(teachers, tiny_model_dir, synth_dir, tmp_path):
    steps, _ = teachers
    argv = ["--data", str(synth_dir), "--target", str(tiny_model_dir), "--teacher", str(steps)]
    argv += [
        "--objectives",
        "atspeed_s",
        "seqkd",
        "--batch-size",
        "8",
        "--repeats",
        "2",
        "--out",
        str(tmp_path / "o.json"),
    ]
    summary = align_step.main(argv)
    rows = summary["rows"]
    assert set(rows) == {"atspeed_s", "atspeed_s+all_steps", "seqkd", "seqkd+all_steps"}
    assert all(r["steps"] == 4 and 0 < r["min_s"] <= r["median_s"] <= r["max_s"] for r in rows.values())
    assert rows["atspeed_s+all_steps"]["ratio_to_final_only"] > 0
    assert json.loads((tmp_path / "o.json").read_text())["rows"] == rows
    # the loss it reports is the objective's on the first batch, with the same seeded draft
    arms = align_step.build_objectives(align_step.parse_args(argv))
    n = len(arms["seqkd"].windows)
    first = np.random.default_rng(0).choice(n, size=min(8, n), replace=False)
    with torch.no_grad():
        assert arms["seqkd+all_steps"].loss(first).item() == pytest.approx(
            rows["seqkd+all_steps"]["loss_first_batch"]
        )


def test_a_teacher_without_step_beams_is_refused(teachers, tiny_model_dir, synth_dir):
    _, plain = teachers
    argv = ["--data", str(synth_dir), "--target", str(tiny_model_dir), "--teacher", str(plain)]
    with pytest.raises(UserInputError, match="--all-steps"):
        align_step.main(argv)
