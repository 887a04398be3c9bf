"""`eval.repeats`: timed passes whose median is the row's latency, with the fastest and slowest pass
beside it; quality comes from the first pass and does not depend on the number of passes."""

from __future__ import annotations

import numpy as np
import pytest

from genrec.workloads.evaluation import EvalConfig, evaluate, latency_over_passes, load_context
from genrec.workloads.metrics import latency_summary


def test_latency_over_passes_is_the_median_pass_with_its_range():
    passes = [[1.0, 2.0, 3.0], [10.0, 20.0, 30.0], [2.0, 4.0, 6.0]]
    out = latency_over_passes(passes)
    p50s = [latency_summary(p)["p50"] for p in passes]
    assert out["p50"] == np.median(p50s) == 4.0
    assert (out["p50_lo"], out["p50_hi"]) == (2.0, 20.0)
    assert out["p99_lo"] <= out["p99"] <= out["p99_hi"]
    single = latency_over_passes(passes[:1])
    assert single == latency_summary(passes[0])  # one pass: no range columns


def test_repeats_keep_quality_and_record_the_spread(synth_dir, tiny_model_dir):
    ctx, ds, _ = load_context(tiny_model_dir, synth_dir, "cpu")
    base = dict(decoder="beam", params={"beam_width": 10}, ks=(5, 10), batch_size=16, max_users=48, threads=1)
    one = evaluate(ctx, ds, EvalConfig(**base), progress=False)
    three = evaluate(ctx, ds, EvalConfig(**base, repeats=3), progress=False)
    assert three.ranked == one.ranked and three.row.quality == one.row.quality
    flat = three.row.to_flat()
    assert flat["repeats"] == 3
    assert flat["latency_p50_lo_ms"] <= flat["latency_p50_ms"] <= flat["latency_p50_hi_ms"]
    assert "latency_p50_lo_ms" not in one.row.to_flat() and one.row.to_flat()["repeats"] == 1
    assert flat["load_1m"] is None or flat["load_1m"] >= 0


def test_repeats_must_be_positive():
    from genrec.workloads.errors import UserInputError

    with pytest.raises(UserInputError, match="repeats must be >= 1"):
        EvalConfig(repeats=0).validate()


def test_benchmark_repeats_become_medians_with_their_range():
    from genrec.workloads.results import median_over_repeats, spread_columns

    runs = [
        {"kernel_ms": 3.0, "speedup": 2.0, "name": "a", "ok": True},
        {"kernel_ms": 1.0, "speedup": 4.0},
        {"kernel_ms": 2.0, "speedup": 3.0},
    ]
    out = median_over_repeats(runs)
    assert (out["kernel_ms"], out["kernel_lo_ms"], out["kernel_hi_ms"]) == (2.0, 1.0, 3.0)
    assert (out["speedup"], out["speedup_lo"], out["speedup_hi"]) == (3.0, 2.0, 4.0)
    assert out["name"] == "a" and out["ok"] is True and out["repeats"] == 3
    assert median_over_repeats(runs[:1]) == runs[0]  # one run: as it was
    assert spread_columns("latency_p50_ms") == ("latency_p50_lo_ms", "latency_p50_hi_ms")


def test_the_headline_reads_a_benchmarks_range():
    import pandas as pd

    from genrec.dashboards.headline import Axis, verdict
    from genrec.workloads.results import median_over_repeats

    rows = []
    for backend, base in (("fast", 1.0), ("slow", 3.0)):
        out = median_over_repeats([{"kernel_ms": base * f} for f in (0.9, 1.0, 1.1)])
        rows.append({"decoder": "benchmark:x", "param_backend": backend, **out})
    v = verdict(pd.DataFrame(rows), Axis("kernel_ms", False, "timing", "kernel", "ms"))
    assert v.winner == "benchmark:x(backend=fast)" and v.margin.value == 3.0
