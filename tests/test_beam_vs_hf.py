"""Our beam search against HF transformers' (beam_vs_hf) end to end on the tiny synth model."""

import json
import math

import numpy as np
import pytest

pytest.importorskip("transformers")

from genrec.studies.beam.beam_vs_hf import main  # noqa: E402


def test_beam_vs_hf_times_both_and_agrees_at_every_width(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "sub" / "vs.json"
    argv = ["--model", str(tiny_model_dir), "--beam-widths", "3", "12", "--users", "6", "--batch-size", "4"]
    argv += ["--repeats", "2", "--warmup", "1", "--threads", "1", "--out", str(out)]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["benchmark"] == "beam_vs_hf" and result["command"].endswith(" ".join(argv))
    assert (result["users"], result["batch_size"], result["repeats"], result["warmup"]) == (6, 4, 2, 1)
    assert result["hf_attn_implementation"] == "sdpa" and result["codebook_sizes"] == [8, 8, 8]
    assert [r["beam_width"] for r in result["rows"]] == [3, 12]
    for r in result["rows"]:
        assert r["k"] == min(10, r["beam_width"]) and r["batches"] == 2  # 6 users in batches of 4
        assert r["timed_batches_per_decoder"] == 2 * 2 == len(r["samples_ms"]["ours"])
        assert len(r["samples_ms"]["hf"]) == 4
        for side in ("ours", "hf"):
            ms = r[f"{side}_ms"]
            assert 0 < ms["p50"] <= ms["p99"] and ms["p50"] == pytest.approx(np.median(r["samples_ms"][side]))
        assert r["speed_ratio"] == pytest.approx(r["hf_ms"]["p50"] / r["ours_ms"]["p50"])
        assert r["agreement"] == 1.0 and r["max_score_diff"] <= 1e-4  # same weights, same search
        assert 0.0 <= r["overhead_share"] <= 1.0 or math.isnan(r["overhead_share"])
        assert f"{r['agreement']:.3f}" in stdout and f"{r['speed_ratio']:.2f}x" in stdout
    header = stdout.splitlines()[0]
    assert "beam search vs HF transformers" in header and "6 users in batches of 4" in header
    assert f"wrote {out}" in stdout


def test_beam_vs_hf_fails_on_disagreement_unless_allowed(tiny_model_dir, monkeypatch, capsys):
    from genrec.studies.beam import beam_vs_hf

    monkeypatch.setattr(beam_vs_hf, "user_agrees", lambda *args: False)  # every user disagrees
    argv = ["--model", str(tiny_model_dir), "--beam-widths", "2", "--users", "2", "--repeats", "1"]
    argv += ["--warmup", "0", "--threads", "1"]
    assert main(argv) == 1
    assert "top-K SIDs differ from HF at beam widths [2]" in capsys.readouterr().err
    assert main([*argv, "--allow-mismatch"]) == 0
    assert "0.000" in capsys.readouterr().out
