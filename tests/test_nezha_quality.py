"""The NEZHA quality benchmark's summary: per-arm means over seeds and the one-sided paired t-tests."""

from __future__ import annotations

import pytest

from genrec.workloads.benchmarks.nezha_quality import ARMS, QUALITY, summarise


def fake_run(seed: int, scores: dict[str, float]) -> dict:
    arms = {}
    for arm, *_ in ARMS:
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
