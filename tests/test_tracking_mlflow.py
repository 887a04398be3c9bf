"""MLflow as its users expect it, against MLflow's sqlite store (no Ray): a sweep is a parent run with
its trials nested under it, runs are named by their configuration, trials carry their real start
and end times, the experiment carries the YAML description, the parent records the best trial, and a
benchmark's parameters are params only."""

from __future__ import annotations

import json

import pytest

from genrec.platform.mlflow_naming import RunNaming
from genrec.platform.mlflow_rows import (
    CREATED_TAG,
    KIND_TAG,
    RUN_ID_TAG,
    best_trial_row,
    split_row_for_mlflow,
    trial_times_ms,
)
from genrec.platform.mlflow_store import NAMING_TAG, PARENT_TAG, MlflowStore, sqlite_uri
from genrec.platform.tracking import write_result_row

mlflow = pytest.importorskip("mlflow")

STARTED = 1_767_225_600.25  # 2026-01-01T00:00:00.25Z, epoch seconds as trials record it


def trial_row(
    exp: str, run_id: str, width: int, recall: float, seed: int = 0, decoder: str = "beam", **extra
):
    """A flat row as a sweep trial writes it (the columns MLflow logging reads)."""
    params = {"beam_width": width, "k": 10}
    return {
        "experiment": exp,
        "run_id": run_id,
        "decoder": decoder,
        "decoder_params": json.dumps(params, sort_keys=True),
        **{f"param_{k}": v for k, v in params.items()},
        "dataset": "synth",
        "model": "tiny",
        "draft": "",
        "split": "test",
        "seed": seed,
        "recall@10": recall,
        "latency_p50_ms": 3.5,
        "device": "cpu",
        "threads": 1,
        "git_commit": "abc123",
        "created_at": "2026-01-01T00:00:07+00:00",
        "ray_trial_id": run_id[-5:],
        "trial_started_at": STARTED,
        "trial_wall_s": 7.5,
        **extra,
    }


@pytest.fixture(scope="module")
def mlflow_root(tmp_path_factory):
    # one sqlite store (its migrations take seconds), one experiment a test
    return tmp_path_factory.mktemp("mlflow")


def store(root, name, **kwargs) -> MlflowStore:
    return MlflowStore(sqlite_uri(root), name, **kwargs)


def trials(s: MlflowStore) -> dict[str, object]:
    return {r.data.tags[RUN_ID_TAG]: r for r in s.runs("trial")}


# ---- names ------------------------------------------------------------------------------------------
def test_run_names_come_from_the_configuration():
    row = trial_row("e", "e-1", 100, 0.5, seed=1)
    assert RunNaming({"beam": ("beam_width",)}).name(row) == "beam_width=100"
    assert RunNaming({"beam": ("beam_width",)}, decoder=True).name(row) == "beam(beam_width=100)"
    assert RunNaming({"beam": ("beam_width",)}, seed=True).name(row) == "beam_width=100 seed=1"
    both = RunNaming({"beam": ("beam_width", "k")}, decoder=True, seed=True)
    assert both.name(row) == "beam(beam_width=100, k=10) seed=1"
    assert RunNaming({"beam": ()}).name(row) == "beam"  # nothing swept: the decoder names it
    floats = trial_row("e", "e-2", 10, 0.5, param_temperature=0.30000000000000004)
    assert RunNaming({"beam": ("temperature",)}).name(floats) == "temperature=0.3"
    naming = RunNaming({"beam": ("beam_width",), "nezha": ()}, decoder=True, seed=True)
    assert RunNaming.from_json(naming.to_json()) == naming


def test_naming_implied_by_rows_shows_what_differs():
    rows = [trial_row("e", f"e-{w}", w, 0.5) for w in (10, 20)]
    assert RunNaming.from_rows(rows) == RunNaming({"beam": ("beam_width",)})
    rows.append(trial_row("e", "e-n", 10, 0.5, decoder="nezha", seed=1))
    naming = RunNaming.from_rows(rows)
    assert naming.decoder and naming.seed and naming.name(rows[-1]) == "nezha seed=1"


# ---- times ------------------------------------------------------------------------------------------
def test_trial_times_are_epoch_milliseconds():
    assert trial_times_ms(trial_row("e", "e-1", 10, 0.5)) == (1_767_225_600_250, 1_767_225_607_750)
    assert trial_times_ms({"trial_started_at": STARTED}) == (1_767_225_600_250, None)
    assert trial_times_ms({}) == (None, None)


# ---- benchmark rows: parameters are params only -----------------------------------------------------
def test_a_benchmark_rows_parameters_are_params_only_and_none_is_empty():
    pytest.importorskip("torch")
    from genrec.platform.benchmark_trial import benchmark_row
    from genrec.platform.benchmarks import get_benchmark
    from genrec.platform.experiment import TrialSpec

    params = {"b": 4, "d_user": 8, "d_item": 8, "d_hidden": 8, "reps": 2, "warmup": 1}
    measured = get_benchmark("mari_matmul").run(**params, threads=1)
    assert {"b", "d_user", "d_cross", "reps"} <= set(measured)  # what the benchmark echoes
    spec = TrialSpec(
        experiment="mm", results_dir=".", decoder="benchmark:mari_matmul", benchmark="mari_matmul"
    )
    flat = benchmark_row(spec, "mm-1", params, 0, measured, "cpu")
    mparams, metrics, tags = split_row_for_mlflow(flat)

    for name in ("b", "d_user", "d_item", "d_hidden", "reps", "warmup", "d_cross", "seed"):
        assert name not in metrics, name
    assert mparams["param_b"] == "4" and mparams["param_reps"] == "2"
    assert "b" not in mparams  # the experiment's value is there once, as param_b
    assert mparams["d_cross"] == "0"  # a default the experiment left alone: still a param
    assert not {"dataset", "model", "split"} & set(mparams)
    assert not [k for k, v in mparams.items() if v == ""]
    assert {"time_speedup", "flops_speedup", "time_mari_ms", "max_abs_diff"} <= set(metrics)
    assert tags["threads"] == str(flat["threads"]) and tags["benchmark"] == "mari_matmul"


def test_eval_rows_keep_their_mapping():
    mparams, metrics, tags = split_row_for_mlflow(trial_row("e", "e-1", 10, 0.5))
    assert metrics["recall_at_10"] == 0.5 and metrics["trial_wall_s"] == 7.5
    assert mparams["param_beam_width"] == "10" and mparams["decoder"] == "beam"
    assert "draft" not in mparams  # empty: no draft model
    assert tags["device"] == "cpu" and tags["trial_started_at"] == str(STARTED)
    assert tags["mlflow.source.git.commit"] == "abc123" and tags[KIND_TAG] == "trial"
    assert next(iter(metrics)) == "recall_at_10"  # quality first: MLflow's tables open on it
    assert list(metrics).index("recall_at_10") < list(metrics).index("trial_wall_s")


def test_the_sweep_runs_description_opens_with_the_decision(mlflow_root):
    from genrec.platform.mlflow_store import DECISION_TAG, NOTE_TAG

    s = store(mlflow_root, "decided")
    parent = s.open_sweep(RunNaming({"beam": ("beam_width",)}))
    rows = [trial_row("decided", f"decided-{w}", w, r) for w, r in ((10, 0.61), (20, 0.62))]
    for row in rows:
        s.log_row(row)
    decision = "Within 10.0 ms: deploy beam(beam_width=10): the reference, recall@10 0.6100."
    s.log_sweep({}, {}, [], tags={DECISION_TAG: decision}, best=rows[0], metric="recall@10")
    note = s.client.get_run(parent).data.tags[NOTE_TAG]
    assert note.startswith(decision) and "Best trial by recall@10" in note


# ---- the sweep: a parent run with its trials nested under it ----------------------------------------
def test_a_sweep_is_a_parent_run_with_named_nested_trials_and_its_best(mlflow_root, tmp_path):
    s = store(mlflow_root, "nest", description="beam search versus beam width")
    exp = s.client.get_experiment(s.experiment_id)
    assert exp.tags["mlflow.note.content"] == "beam search versus beam width"
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"

    parent = s.open_sweep(RunNaming({"beam": ("beam_width",)}), tags={"genrec.experiment_file": "x.yaml"})
    (sweep,) = s.runs("sweep")  # before any trial row
    assert sweep.info.run_id == parent and sweep.info.status == "RUNNING" and s.runs("trial") == []

    rows = [trial_row("nest", f"nest-{w}", w, r) for w, r in ((10, 0.61), (20, 0.64), (30, 0.63))]
    for row in rows:
        s.log_row(row)
    runs = trials(s)
    assert {r.info.run_name for r in runs.values()} == {"beam_width=10", "beam_width=20", "beam_width=30"}
    for r in runs.values():
        assert r.data.tags[PARENT_TAG] == parent and r.info.status == "FINISHED"
        assert (r.info.start_time, r.info.end_time) == (1_767_225_600_250, 1_767_225_607_750)

    yaml_file, report = tmp_path / "nest.yaml", tmp_path / "nest.html"
    yaml_file.write_text("name: nest\n")
    report.write_text("<html></html>")
    best = best_trial_row(rows, "recall@10", "max")
    s.log_sweep({"trials_done": 3}, {"metric": "recall@10", "gpu_per_trial": 0.0}, [yaml_file, report],
                best=best, metric="recall@10")  # fmt: skip
    done = s.client.get_run(parent)
    assert done.info.status == "FINISHED" and done.info.end_time >= done.info.start_time
    assert done.data.metrics["trials_done"] == 3 and done.data.metrics["best_recall_at_10"] == 0.64
    tags = done.data.tags
    assert tags["best.mlflow_run_id"] == runs["nest-20"].info.run_id
    assert tags["best.run_name"] == "beam_width=20" and tags["best.run_id"] == "nest-20"
    assert json.loads(tags["best.params"]) == {"beam_width": 20, "k": 10} and tags["best.seed"] == "0"
    assert runs["nest-20"].info.run_id in tags["mlflow.note.content"]
    assert tags["genrec.experiment_file"] == "x.yaml" and done.data.params["metric"] == "recall@10"
    assert sorted(a.path for a in s.client.list_artifacts(parent)) == ["nest.html", "nest.yaml"]

    # --resume: the same parent, RUNNING again; the naming and its trials come back with it
    again = store(mlflow_root, "nest")
    assert again.open_sweep(RunNaming({"beam": ("beam_width",)}), resume=True) == parent
    assert again.client.get_run(parent).info.status == "RUNNING"
    attached = store(mlflow_root, "nest")  # as the Tune callback attaches in its setup
    assert attached.find_sweep().info.run_id == parent and attached.naming == again.naming
    attached.log_row(trial_row("nest", "nest-40", 40, 0.66))
    assert trials(again)["nest-40"].data.tags[PARENT_TAG] == parent
    # a resumed sweep may log a different value of a param (gpu: auto on another cluster)
    again.log_sweep({"trials_done": 4}, {"metric": "recall@10", "gpu_per_trial": 0.25}, [],
                    best=best_trial_row([*rows, trial_row("nest", "nest-40", 40, 0.66)], "recall@10", "max"),
                    metric="recall@10")  # fmt: skip
    done = again.client.get_run(parent)
    assert done.info.status == "FINISHED" and done.data.params["gpu_per_trial"] == "0.0"
    assert done.data.tags["resumed.gpu_per_trial"] == "0.25"
    assert done.data.tags["best.run_name"] == "beam_width=40" and done.data.metrics["trials_done"] == 4
    assert len(again.runs("sweep")) == 1

    # a fresh sweep (no --resume) replaces the parent
    fresh = store(mlflow_root, "nest")
    assert fresh.open_sweep(RunNaming({"beam": ("beam_width",)})) != parent
    assert [r.info.run_id for r in fresh.runs("sweep")] == [fresh.parent_run_id]


def test_an_interrupted_sweep_ends_its_run_killed_and_resume_reopens_it(mlflow_root):
    naming = RunNaming({"beam": ("beam_width",)})
    s = store(mlflow_root, "ctrl_c")
    assert s.kill_sweep() is None  # Ctrl-C before the parent run was opened: nothing to end
    parent = s.open_sweep(naming)
    assert s.kill_sweep() == parent
    killed = s.client.get_run(parent)
    assert killed.info.status == "KILLED" and killed.info.end_time >= killed.info.start_time

    again = store(mlflow_root, "ctrl_c")  # --resume: the same run, RUNNING, then FINISHED
    assert again.open_sweep(naming, resume=True) == parent
    assert again.client.get_run(parent).info.status == "RUNNING"
    again.log_sweep({"trials_done": 0}, {"metric": "recall@10"}, [])
    assert again.client.get_run(parent).info.status == "FINISHED" and len(again.runs("sweep")) == 1


def test_sync_from_parquet_nests_and_names_runs_it_repairs_and_keeps(mlflow_root, tmp_path):
    from mlflow.entities import RunTag

    name = "resync"
    rows = [trial_row(name, f"{name}-{w}-{seed}", w, 0.6, seed=seed) for w in (10, 20) for seed in (0, 1)]
    for row in rows:
        write_result_row(tmp_path, row)
    s = store(mlflow_root, name)
    # a run an older genrec logged: kept (same row), but flat, named by its run id
    old = s.client.create_run(s.experiment_id, tags={KIND_TAG: "trial"}, run_name=rows[0]["run_id"])
    _, _, tags = split_row_for_mlflow(rows[0])
    s.client.log_batch(old.info.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    s.client.set_terminated(old.info.run_id, "FINISHED")

    assert s.sync_from_parquet(tmp_path) == {"logged": 3, "deleted": 0}
    (sweep,) = s.runs("sweep")  # none existed: rebuilt, FINISHED, spanning the trials
    assert sweep.info.status == "FINISHED"
    assert (sweep.info.start_time, sweep.info.end_time) == (1_767_225_600_250, 1_767_225_607_750)
    assert RunNaming.from_json(sweep.data.tags[NAMING_TAG]) == RunNaming({"beam": ("beam_width",)}, seed=True)
    runs = trials(s)
    assert runs[rows[0]["run_id"]].info.run_id == old.info.run_id  # kept, not logged again
    assert {r.info.run_name for r in runs.values()} == {
        f"beam_width={w} seed={seed}" for w in (10, 20) for seed in (0, 1)
    }
    assert all(r.data.tags[PARENT_TAG] == sweep.info.run_id for r in runs.values())
    assert all(r.data.tags[CREATED_TAG] for r in runs.values())
    assert store(mlflow_root, name).sync_from_parquet(tmp_path) == {"logged": 0, "deleted": 0}
    assert len(s.runs("sweep")) == 1


def test_a_row_logged_alone_is_named_by_its_label_or_configuration(mlflow_root):
    s = store(mlflow_root, "alone")
    s.log_row(trial_row("alone", "lt-1", 5, 0.5, label="batching=on"))
    s.log_row(trial_row("alone", "lt-2", 5, 0.5))
    runs = trials(s)
    assert runs["lt-1"].info.run_name == "batching=on"
    assert runs["lt-2"].info.run_name == "beam(beam_width=5, k=10)"
    assert PARENT_TAG not in runs["lt-1"].data.tags and s.runs("sweep") == []


def test_the_best_trial_is_the_one_of_the_configuration_the_sweep_chose():
    rows = [
        trial_row("e", "e-a0", 10, 0.70, seed=0),
        trial_row("e", "e-a1", 10, 0.50, seed=1),
        trial_row("e", "e-b0", 20, 0.60, seed=0),
        trial_row("e", "e-b1", 20, 0.62, seed=1),
        trial_row("e", "e-nan", 30, float("nan")),
    ]
    assert best_trial_row(rows, "recall@10", "max")["run_id"] == "e-a0"
    assert best_trial_row(rows, "recall@10", "min")["run_id"] == "e-a1"
    chosen = {"recall@10": 0.61, "beam_width": 20, "seed": None}  # e.g. a median over seeds
    assert best_trial_row(rows, "recall@10", "max", chosen)["run_id"] == "e-b1"
    assert best_trial_row(rows, "recall@10", "max", {"beam_width": 99})["run_id"] == "e-a0"
    assert best_trial_row([], "recall@10", "max") is None


def test_run_naming_of_an_experiment_file(tmp_path):
    pytest.importorskip("ray")
    from genrec.platform.experiment import ExperimentConfig
    from genrec.platform.sweep.callbacks import run_naming

    base = {"name": "x", "dataset": {"path": str(tmp_path)}, "model": {"checkpoint": str(tmp_path)}}
    one = ExperimentConfig.model_validate(
        {**base, "decoder": "beam", "params": {"k": 10}, "search_space": {"beam_width": {"grid": [10, 20]}}}
    )
    assert run_naming(one) == RunNaming({"beam": ("beam_width",)})
    arms = ExperimentConfig.model_validate(
        {
            **base,
            "seeds": [0, 1],
            "arms": [
                {"decoder": "beam", "search_space": {"beam_width": {"grid": [10, 20]}}},
                {"decoder": "nezha", "params": {"beam_width": 10}},
            ],
        }
    )
    naming = run_naming(arms)
    assert naming == RunNaming({"beam": ("beam_width",), "nezha": ()}, decoder=True, seed=True)
    assert naming.name(trial_row("x", "x-1", 20, 0.5, seed=1)) == "beam(beam_width=20) seed=1"
