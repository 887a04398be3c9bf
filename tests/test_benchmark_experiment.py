"""Model-free benchmark experiments (`benchmark: NAME`): validation against the registered function's
signature before Ray starts, the trial's result row, one tiny sweep through Ray into Parquet + MLflow,
and the MaRI report pages."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_cli

from genrec.platform.benchmarks import benchmark_names, get_benchmark
from genrec.platform.experiment import TrialSpec
from genrec.platform.experiment_loading import experiment_from_dict, load_experiment
from genrec.platform.tracking import write_result_row
from genrec.workloads.errors import UserInputError
from genrec.workloads.results_store import read_results


def base(tmp_path: Path) -> dict:
    return {
        "name": "mm_tiny",
        "benchmark": "mari_matmul",
        "params": {"d_item": 16, "d_cross": 4, "d_hidden": 8, "reps": 2, "warmup": 0},
        "search_space": {"b": {"grid": [4, 8]}, "d_user": {"grid": [32]}},
        "eval": {"threads": 1},
        "metric": "time_speedup",
        "resources": {"cpu": 1, "gpu": 0},
        "tracking": {"results_dir": str(tmp_path / "results")},
    }


def test_benchmark_experiment_needs_no_dataset_model_or_decoder(tmp_path):
    cfg = experiment_from_dict(base(tmp_path))
    assert cfg.benchmark == "mari_matmul" and cfg.decoder == "benchmark:mari_matmul"
    assert cfg.dataset is None and cfg.model.train is None and cfg.model.checkpoint is None
    assert cfg.num_trials() == 2 and "time_speedup" in cfg.valid_metrics()
    assert '"benchmark": "mari_matmul"' in cfg.fingerprint()


@pytest.mark.parametrize("name", ["mari_grid", "mari_grid_full", "mari_fragmented", "mari_model"])
def test_shipped_mari_experiments_load(name):
    cfg = load_experiment(REPO / "studies" / "mari" / "experiments" / f"{name}.yaml")
    assert cfg.benchmark in benchmark_names() and cfg.metric in get_benchmark(cfg.benchmark).metrics


BAD = [
    ("benchmark", "mari_fast", ["`benchmark`", "unknown benchmark 'mari_fast'", "mari_matmul"]),
    ("params.bogus", 1, ["`params.bogus`", "has no parameter 'bogus'", "d_user"]),
    ("params.seed", 1, ["`params.seed`", "seeds"]),
    ("params.reps", "many", ["`params.reps`", "`reps` takes an int, got 'many' (str)"]),
    ("search_space.b", {"grid": [4, 0]}, ["`search_space.b.grid[1]` = 0", "`b` must be >= 1, got 0"]),
    ("params.d_cross", -1, ["`params.d_cross`", "`d_cross` must be >= 0, got -1"]),
    ("metric", "recall@10", ["`metric`", "not reported by benchmark", "time_speedup"]),
    ("decoder", "beam", ["runs without a dataset, model or decoder", "decoder"]),
    ("search_space.d_item", {"grid": [8]}, ["`params.d_item` is also in `search_space`"]),
]


@pytest.mark.parametrize("key,value,expected", BAD, ids=[f"{k}={v!r}"[:40] for k, v, _ in BAD])
def test_bad_benchmark_experiments_fail_fast(tmp_path, capsys, key, value, expected):
    raw = copy.deepcopy(base(tmp_path))
    node = raw
    *parents, last = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert run_cli(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    for part in expected:
        assert part in err, (part, err)
    assert not (tmp_path / "results").exists()


def test_missing_dataset_without_benchmark_names_the_key(tmp_path):
    with pytest.raises(UserInputError, match="missing required key `dataset`"):
        experiment_from_dict(
            {"name": "x", "model": {"checkpoint": "m"}, "decoder": "beam"}, check_files=False
        )


def test_benchmark_row_has_the_shared_columns():
    from genrec.platform.benchmark_trial import benchmark_kwargs, benchmark_row

    spec = TrialSpec(
        experiment="e", results_dir="r", decoder="benchmark:mari_matmul", benchmark="mari_matmul"
    )
    assert spec.torch_threads == 1  # threads 0: the trial's CPU count
    kwargs = benchmark_kwargs(spec, {"b": 4, "d_user": 8}, seed=3)
    assert kwargs == {"b": 4, "d_user": 8, "seed": 3, "threads": 1, "device": "cpu"}
    metrics = get_benchmark("mari_matmul").run(**kwargs, d_item=4, d_hidden=4, reps=2, warmup=0)
    row = benchmark_row(spec, "e-1", {"b": 4, "d_user": 8}, 3, metrics, "cpu")
    assert row["decoder"] == "benchmark:mari_matmul" and row["benchmark"] == "mari_matmul"
    assert row["param_b"] == 4 and json.loads(row["decoder_params"]) == {"b": 4, "d_user": 8}
    assert row["seed"] == 3 and row["threads"] >= 1 and "git_commit" in row and row["time_speedup"] > 0
    assert row["dataset"] == ""  # a synthetic kernel benchmark reads no dataset
    # a benchmark that reads one names it (nezha_arm's dataset_name), so reports can group by dataset
    named = benchmark_row(spec, "e-2", {"b": 4}, 3, {**metrics, "dataset_name": "beauty"}, "cpu")
    assert named["dataset"] == "beauty"


def test_tiny_benchmark_sweep_through_ray(ray_session, tmp_path):
    path = tmp_path / "mm_tiny.yaml"
    path.write_text(yaml.safe_dump(base(tmp_path)))
    assert run_cli(["sweep", str(path), "--quiet"]) == 0
    results = tmp_path / "results"
    df = read_results(results, "mm_tiny")
    assert sorted(df["param_b"]) == [4, 8] and df["run_id"].is_unique
    assert all(df["run_id"].str.startswith("mm_tiny-")) and (df["benchmark"] == "mari_matmul").all()
    assert (df["max_abs_diff"] < 1e-4).all() and (df["flops_speedup"] > 1).all()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    exp = client.get_experiment_by_name("mm_tiny")
    runs = client.search_runs([exp.experiment_id], "tags.`genrec.kind` = 'trial'")
    assert sorted(r.data.tags["genrec.run_id"] for r in runs) == sorted(df["run_id"])
    html = (results / "reports" / "mm_tiny.html").read_text()
    assert "speedup heatmaps" in html and "Time speedup vs B" in html


def test_mari_report_pages_for_fragmented_and_model_rows(tmp_path):
    from genrec.dashboards.report import build_report

    common = {
        "experiment": "mari_mix",
        "device": "cpu:x",
        "threads": 2,
        "torch_version": "t",
        "git_commit": "g",
        "created_at": "2026-01-01T00:00:00+00:00",
        "schema_version": 1,
    }
    for i, chunk in enumerate((50, 100)):
        write_result_row(
            tmp_path,
            {
                **common,
                "run_id": f"f{i}",
                "benchmark": "mari_fragmented",
                "decoder": "benchmark:mari_fragmented",
                "param_chunk": chunk,
                "degradation_vs_neat_pct": 50.0 - i,
                "degradation_vs_vanilla_pct": 10.0,
                "time_mari_neat_ms": 1.0,
                "time_mari_fragmented_ms": 1.5,
                "time_vanilla_ms": 2.0,
            },
        )
    for i, b in enumerate((100, 1000)):
        write_result_row(
            tmp_path,
            {
                **common,
                "run_id": f"m{i}",
                "benchmark": "mari_model",
                "decoder": "benchmark:mari_model",
                "param_b": b,
                "time_vani_ms": 3.0,
                "time_uoi_ms": 2.0,
                "time_mari_ms": 1.0,
                "speedup_uoi_vs_vani": 1.5,
                "speedup_mari_vs_uoi": 2.0,
                "speedup_mari_vs_vani": 3.0,
                "max_abs_diff_mari": 1e-7,
            },
        )
    out = build_report(tmp_path, "mari_mix", tmp_path / "r.html")
    html = Path(out).read_text()
    assert "Fragmented vs neat layout" in html and "Whole model: VanI / UOI / MaRI" in html
    assert html.count('class="figure"') == 2  # chunk lines + mode bars
