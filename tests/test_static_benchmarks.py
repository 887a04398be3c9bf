"""STATIC scaling / branch benchmarks (issue 5): the point functions on tiny sizes, the registry checks,
the shipped experiment files, a tiny sweep through Ray, and the generic benchmark report page."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, run_cli

from genrec.platform.benchmarks import get_benchmark
from genrec.platform.experiment_loading import experiment_from_dict, load_experiment
from genrec.platform.params import parse_benchmark_params
from genrec.platform.tracking import write_result_row
from genrec.studies.static.static_point import branch_point, branch_set, scaling_point
from genrec.workloads.constraints.sets import uniform_random
from genrec.workloads.constraints.transition import build_transition_matrix
from genrec.workloads.errors import UserInputError
from genrec.workloads.results_store import read_results

TINY = {"vocab": 16, "levels": 4, "batch": 2, "beam": 4, "dense_levels": 1, "reps": 3, "warmup": 1}


@pytest.mark.parametrize("backend", ["static", "cpu_trie", "ppv_exact", "ppv_approx", "hash_bitmap"])
def test_scaling_point_metrics_are_sane(backend):
    r = scaling_point(200, backend=backend, threads=1, **TINY)
    assert r["skipped"] == 0 and r["set_size"] == 200
    assert r["step_ms"] > 0 and r["unconstrained_step_ms"] > 0 and r["build_s"] >= 0
    assert r["overhead_ratio"] == pytest.approx(r["step_ms"] / r["unconstrained_step_ms"])
    assert r["mb_per_million"] == pytest.approx(r["memory_mb"] / 200e-6)
    if backend in ("static", "cpu_trie", "ppv_exact"):  # exact backends: every returned SID is in the set
        assert r["compliance"] == 1.0 and r["returned"] > 0


def test_scaling_point_memory_is_the_transition_matrix():
    r = scaling_point(300, backend="static", threads=1, seed=2, **TINY)
    tm = build_transition_matrix(uniform_random((16,) * 4, 300, seed=2), 1)
    assert r["memory_mb"] == pytest.approx(tm.memory_bytes()["total"] / 2**20)
    assert r["memory_mb"] <= r["u_max_mb"]


def test_scaling_point_skips_baselines_above_the_cap():
    r = scaling_point(5000, backend="ppv_exact", baseline_max_size=1000, **TINY)
    assert r["skipped"] == 1 and math.isnan(r["step_ms"])
    assert scaling_point(5000, backend="static", baseline_max_size=1000, threads=1, **TINY)["skipped"] == 0


@pytest.mark.parametrize("b", [1, 3, 16])
def test_branch_set_has_exactly_b_children_at_the_last_level(b):
    cset = branch_set(b, 100, vocab=16, levels=4, seed=1)
    tm = build_transition_matrix(cset, 1)
    assert tm.max_branch[-1] == b and len(cset) == (100 // b) * b
    r = branch_point(b, constraint_size=100, threads=1, **TINY)
    assert r["max_branch_factor"] == b and r["kernel_ms"] > 0 and r["mask_kernel_ms"] > 0
    assert r["candidates_ms"] > 0


BAD_PARAMS = [
    ("static_scaling", {"constraint_size": 10, "backend": "trie"}, "`backend` must be one of"),
    ("static_scaling", {"constraint_size": 0}, "`constraint_size` must be >= 1"),
    ("static_scaling", {"constraint_size": 10, "beam": 2.5}, r"`beam` takes an int, got 2.5 \(float\)"),
    (
        "static_scaling",
        {"constraint_size": 10, "dense_levels": 8, "levels": 8},
        "`dense_levels` must be below",
    ),
    (
        "static_scaling",
        {"constraint_size": 17, "vocab": 4, "levels": 2, "dense_levels": 1},
        "exceeds the SID space",
    ),
    ("static_branch", {"max_branch": 0}, "`max_branch` must be >= 1"),
    ("static_branch", {"max_branch": 64, "vocab": 32}, "cannot exceed the codebook size"),
    ("static_branch", {"max_branch": 4, "kernel": "cuda"}, "`kernel` must be one of"),
]


@pytest.mark.parametrize("name,params,message", BAD_PARAMS)
def test_registry_checks_name_the_problem(name, params, message):
    with pytest.raises(UserInputError, match=message):
        parse_benchmark_params(name, params)


@pytest.mark.parametrize("name", ["static_scaling", "static_vocab", "static_branch"])
def test_shipped_static_experiments_load(name):
    cfg = load_experiment(REPO / "studies" / "static" / "experiments" / f"{name}.yaml")
    assert cfg.benchmark in ("static_scaling", "static_branch")
    assert cfg.metric in get_benchmark(cfg.benchmark).metrics and cfg.resources.cpu == 2


def test_shipped_scaling_experiment_reaches_ten_million_with_baselines_capped():
    cfg = load_experiment(REPO / "studies" / "static" / "experiments" / "static_scaling.yaml")
    assert max(cfg.grid_values()["constraint_size"]) == 10**7
    assert cfg.params["baseline_max_size"] == 10**6


def tiny_experiment(tmp_path: Path) -> dict:
    return {
        "name": "static_tiny",
        "benchmark": "static_scaling",
        "params": {**TINY, "baseline_max_size": 100},
        "search_space": {"constraint_size": {"grid": [50, 500]}, "backend": {"grid": ["ppv_exact"]}},
        "eval": {"threads": 1},
        "metric": "step_ms",
        "mode": "min",
        "resources": {"cpu": 1, "gpu": 0},
        "tracking": {"results_dir": str(tmp_path / "results")},
    }


def test_bad_static_experiment_fails_before_ray(tmp_path, capsys):
    raw = copy.deepcopy(tiny_experiment(tmp_path))
    raw["search_space"]["backend"]["grid"].append("bitmap")  # grid[1]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert run_cli(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert "`search_space.backend.grid[1]` = 'bitmap'" in err and "`backend` must be one of" in err
    assert not (tmp_path / "results").exists()
    assert experiment_from_dict(tiny_experiment(tmp_path)).num_trials() == 2


@pytest.mark.slow  # ~30 s on the 2-core VM: Ray start-up and the sweep driver, not the benchmark
def test_tiny_static_sweep_through_ray(ray_session, tmp_path):
    path = tmp_path / "static_tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_experiment(tmp_path)))
    assert run_cli(["sweep", str(path), "--quiet"]) == 0
    df = read_results(tmp_path / "results", "static_tiny")
    assert len(df) == 2 and (df["benchmark"] == "static_scaling").all()
    df = df.sort_values("param_constraint_size")
    assert df["skipped"].tolist() == [0, 1]  # 500 > baseline_max_size = 100: skipped, NaN times
    assert df["step_ms"].iloc[0] > 0 and pd.isna(df["step_ms"].iloc[1])
    html = (tmp_path / "results" / "reports" / "static_tiny.html").read_text()
    assert "static_scaling: metrics vs parameters" in html and "step_ms vs constraint_size" in html


def _rows(tmp_path: Path, sizes: list[int]) -> None:
    for backend, scale in (("static", 1.0), ("ppv_exact", 3.0)):
        for i, n in enumerate(sizes):
            write_result_row(
                tmp_path,
                {
                    "experiment": "lines",
                    "run_id": f"{backend}-{i}",
                    "benchmark": "static_scaling",
                    "decoder": "benchmark:static_scaling",
                    "param_backend": backend,
                    "param_constraint_size": n,
                    "param_vocab": 2048,
                    "seed": 0,
                    "step_ms": scale * (1 + i),
                    "unconstrained_step_ms": 1.0,
                    "overhead_ratio": scale * (1 + i),
                    "memory_mb": n / 1e5,
                    "device": "cpu:x",
                    "threads": 2,
                    "torch_version": "t",
                    "git_commit": "g",
                    "created_at": "2026-01-01T00:00:00+00:00",
                    "schema_version": 1,
                },
            )


def test_generic_benchmark_report_uses_log_axes_over_decades(tmp_path):
    from genrec.dashboards.report import build_report

    _rows(tmp_path, [1000, 10_000, 100_000, 1_000_000])
    html = Path(build_report(tmp_path, "lines", tmp_path / "r.html", metric="step_ms")).read_text()
    assert "step_ms vs constraint_size" in html and "overhead_ratio vs constraint_size" in html
    assert "backend=static" in html and "backend=ppv_exact" in html  # one line per backend
    assert '"type":"log"' in html.replace(" ", "")
    assert html.index("step_ms vs constraint_size") < html.index("overhead_ratio vs constraint_size")


def test_generic_benchmark_report_keeps_linear_axes_for_a_narrow_range(tmp_path):
    from genrec.dashboards.benchmark_lines import choose_x, log_axes
    from genrec.dashboards.report import build_report

    _rows(tmp_path, [100, 200, 400])
    html = Path(build_report(tmp_path, "lines", tmp_path / "r.html")).read_text()
    assert "step_ms vs constraint_size" in html and '"type":"log"' not in html.replace(" ", "")
    df = read_results(tmp_path, "lines")
    assert choose_x(df, "beam_width") == "param_constraint_size" and choose_x(df, "backend") == (
        "param_constraint_size"
    )  # backend is not numeric: the first varying numeric param
    assert not log_axes(df["param_constraint_size"]) and not log_axes(pd.Series([10, 1000]))
    assert log_axes(pd.Series([10, 1001, None])) and not log_axes(pd.Series([0, 1000]))


def test_static_step_interleaves_sizes_and_reports_flatness(tmp_path):
    """--interleave-sizes times every (size, arm) pair in one alternating loop and reports each arm's
    step over its step at the smallest size."""
    from genrec.studies.static.static_step import main

    out = tmp_path / "b.json"
    argv = "--device cpu --vocab 64 --levels 3 --sizes 3000 600 --beam 8 --dense-levels 1"
    argv += f" --backends static_torch static_dense --repeats 2 --warmup 0 --interleave-sizes --out {out}"
    assert main(argv.split()) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["set_size"] for r in results] == [3000, 600]
    smallest = {r["backend"]: r["step_ms_from_levels"] for r in results[1]["rows"]}
    for res in results:
        rows = {r["backend"]: r for r in res["rows"]}
        assert set(rows) == {"unconstrained", "static_torch", "static_dense"}
        assert rows["static_torch"]["returned"] == rows["static_dense"]["returned"] == 2 * 8
        for name, r in rows.items():
            assert r["step_vs_smallest_size"] == pytest.approx(r["step_ms_from_levels"] / smallest[name])
    assert all(r["step_vs_smallest_size"] == pytest.approx(1.0) for r in results[1]["rows"])


# --- STATIC vs the official implementation (issue 20) ------------------------------------------------
PEER = Path(os.environ.get("GENREC_STATIC_PEER", "/tmp/static-constraint-decoding"))


def test_static_vs_official_names_a_missing_peer(tmp_path, capsys):
    from genrec.studies.static.static_vs_official import main

    assert main(["--peer", str(tmp_path), "--sizes", "100"]) == 2
    assert "static_decoding/decoding_pt.py" in capsys.readouterr().err


@pytest.mark.skipif(
    not (PEER / "static_decoding" / "decoding_pt.py").is_file(),
    reason="needs a checkout of youtube/static-constraint-decoding (GENREC_STATIC_PEER)",
)
def test_static_vs_official_decodes_the_same_sids_and_times_every_level(tmp_path):
    from genrec.studies.static.static_vs_official import main

    out = tmp_path / "vs.json"
    argv = ["--peer", str(PEER), "--vocab", "16", "--levels", "4", "--sizes", "300", "--beam", "4"]
    assert main([*argv, "--repeats", "2", "--warmup", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())["results"][0]
    assert res["same_sids"] == 1.0  # both exact searches over the same logits
    for side in ("ours", "peer"):
        assert len(res[side]["mask_ms_levels"]) == len(res[side]["step_ms_levels"]) == 4
        assert 0 < res[side]["mask_ms_sum"] <= res[side]["step_ms_sum"] and res[side]["memory_mb"] > 0
    assert res["mask_speedup"] > 0 and res["paths"][2:] == ["sparse", "sparse"]
