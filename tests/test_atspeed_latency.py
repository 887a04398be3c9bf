"""The AtSpeed walltime driver on the synthetic set: every arm timed on the same batches, strict rows
identical to beam search, and with --hf Hugging Face generate timed beside them and agreeing with ours."""

import pytest

from genrec.studies.atspeed import atspeed_latency


def run(synth_dir, tiny_model_dir, tmp_path, *extra: str) -> dict:
    argv = [
        "--model", str(tiny_model_dir), "--draft", str(tiny_model_dir), "--data", str(synth_dir),
        "--k", "3", "--draft-beams", "3", "6", "--gamma", "2", "--users", "6", "--batch-size", "2",
        "--repeats", "2", "--warmup", "1", "--threads", "1", "--out", str(tmp_path / "out.json"), *extra,
    ]  # fmt: skip
    return atspeed_latency.main(argv)


def test_strict_arms_equal_beam_search_and_report_their_phases(synth_dir, tiny_model_dir, tmp_path):
    rows = run(synth_dir, tiny_model_dir, tmp_path)["rows"]
    assert set(rows) == {"beam", "strict_N3", "strict_N6"}
    for name in ("strict_N3", "strict_N6"):
        row = rows[name]
        assert row["identical_to_beam"] == 1.0  # the draft is the target: still lossless, never more
        assert row["users"] == 6 * 2
        assert row["ws"] > 0 and row["free_draft_ceiling"] >= row["ws"]
        assert row["phases_ms"]["verify"] > 0 and row["target_calls_per_batch"] >= 1
    assert rows["beam"]["ws"] == pytest.approx(1.0)
    assert "ws_vs_hf" not in rows["strict_N3"]  # no HF arm unless asked for


def test_hf_arm_is_timed_beside_the_others_and_agrees_with_beam(synth_dir, tiny_model_dir, tmp_path):
    pytest.importorskip("transformers")
    rows = run(synth_dir, tiny_model_dir, tmp_path, "--hf")["rows"]
    assert set(rows) == {"beam", "strict_N3", "strict_N6", "hf_beam"}
    assert rows["hf_beam"]["agrees_with_beam"] == 1.0  # same weights, same search: same top-K
    assert "accepted_steps" not in rows["hf_beam"]  # a reference arm: no draft counters
    for row in rows.values():
        assert row["ws_vs_hf"] == pytest.approx(rows["hf_beam"]["median_ms"] / row["median_ms"])
