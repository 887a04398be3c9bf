"""Experiment files: typed loading, every validation error names its key (exit code 2, nothing
written), relative path resolution, dry-run trial grid. No Ray here."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from experiment_files import beam_sweep, write_experiment

from genrec.platform.experiment_loading import experiment_from_dict, load_experiment
from genrec.workloads.errors import UserInputError


@pytest.fixture
def base(synth_dir, tiny_model_dir, tmp_path) -> dict:
    raw = beam_sweep("bw", synth_dir, tiny_model_dir, tmp_path / "results", k=10, widths=[10, 20])
    return raw | {"seeds": [0, 1], "eval": {"ks": [5, 10], "max_users": 20}}


def write(tmp_path: Path, raw: dict) -> Path:
    return write_experiment(tmp_path / "exp.yaml", raw)


def test_valid_file_loads_typed_and_expands_the_grid(base, tmp_path):
    cfg = load_experiment(write(tmp_path, base))
    assert cfg.decoder == "beam" and cfg.metric == "recall@10" and cfg.mode == "max"
    assert cfg.num_trials() == 4
    assert cfg.trial_grid() == [
        {"beam_width": 10, "seed": 0},
        {"beam_width": 20, "seed": 0},
        {"beam_width": 10, "seed": 1},
        {"beam_width": 20, "seed": 1},
    ]
    assert cfg.mlflow_uri == f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"
    assert cfg.storage_path == tmp_path / "results" / "ray"
    assert cfg.artifact_location.startswith("file://")


def test_relative_paths_resolve_against_the_current_directory(base, tmp_path, monkeypatch, synth_dir):
    (tmp_path / "data").symlink_to(synth_dir)
    raw = copy.deepcopy(base)
    raw["dataset"]["path"] = "data"
    raw["tracking"] = {"results_dir": "out/results", "storage_path": "out/tune"}
    (tmp_path / "experiments").mkdir()
    path = write_experiment(tmp_path / "experiments" / "x.yaml", raw)
    monkeypatch.chdir(tmp_path)
    cfg = load_experiment("experiments/x.yaml")
    assert cfg.dataset.path == synth_dir.resolve()  # absolute, against cwd (not the YAML's folder)
    assert cfg.results_dir == tmp_path / "out" / "results"
    assert cfg.storage_path == tmp_path / "out" / "tune"
    assert cfg.source == path.resolve()


def test_ranges_choices_and_samples(base):
    raw = copy.deepcopy(base)
    raw["search_space"] = {"beam_width": {"range": {"low": 10, "high": 16, "step": 3}}}
    raw["num_samples"] = 2
    cfg = experiment_from_dict(raw)
    assert cfg.grid_values() == {"beam_width": [10, 13, 16]}
    assert cfg.num_trials() == 3 * 2 * 2
    raw["search_space"] = {"beam_width": {"choice": [10, 12]}}
    cfg = experiment_from_dict(raw)
    assert cfg.num_trials() == 2 * 2 and cfg.trial_grid()[0]["beam_width"] == "choice[10, 12]"
    raw["search_space"] = {"beam_width": {"randint": {"low": 10, "high": 30}}}
    assert experiment_from_dict(raw).num_trials() == 4


def test_training_step_instead_of_a_checkpoint(base, tmp_path):
    raw = copy.deepcopy(base)
    raw["model"] = {"train": {"out": str(tmp_path / "m"), "size": "tiny", "epochs": 1}}
    cfg = experiment_from_dict(raw)  # no checkpoint yet: the sweep trains it first
    assert cfg.model.path == tmp_path / "m" and cfg.model.checkpoint is None
    raw["model"]["train"]["size"] = "huge"
    with pytest.raises(UserInputError, match="`model.train`: model_size must be one of"):
        experiment_from_dict(raw)


def test_training_step_can_train_a_draft_head(base, tmp_path):
    raw = copy.deepcopy(base)
    raw["model"] = {"train": {"out": str(tmp_path / "m"), "objective": "nezha", "head_variant": "add"}}
    train = experiment_from_dict(raw).model.train.to_train_config()
    assert (train.objective, train.head_variant) == ("nezha", "add")
    raw["model"]["train"]["objective"] = "distill"
    with pytest.raises(UserInputError, match="`model.train`: objective must be one of"):
        experiment_from_dict(raw)


def test_fingerprint_tracks_the_search_space(base):
    a = experiment_from_dict(base)
    raw = copy.deepcopy(base)
    raw["description"] = "a note"
    assert experiment_from_dict(raw).fingerprint() == a.fingerprint()
    raw["search_space"]["beam_width"]["grid"] = [10, 30]
    assert experiment_from_dict(raw).fingerprint() != a.fingerprint()


def _set(raw: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        raw = raw.setdefault(p, {})
    if value is _DELETE:
        raw.pop(last)
    else:
        raw[last] = value


_DELETE = object()

BAD = [
    ("decoder", "bem", ["`decoder`", "unknown decoder 'bem'", "beam", "popular"]),
    (
        "search_space.beam_width.grid",
        [10, -1],
        ["search_space.beam_width.grid[1]", "`beam_width` must be >= 1, got -1"],
    ),
    (
        "search_space.beam_width.grid",
        [5, 10],
        ["`search_space.beam_width.grid[0]` = 5", "`k` (10) is larger than the beam width (5)"],
    ),
    (
        "search_space.beam_width.grid",
        [10, "ten"],
        ["`search_space.beam_width.grid[1]` = 'ten'", "`beam_width` takes an int, got 'ten' (str)"],
    ),
    ("search_space.beam_width.grid", [], ["search_space.beam_width.grid", "at least one value"]),
    ("search_space.beam_width", {"grdi": [10]}, ["unknown key `search_space.beam_width.grdi`", "grid"]),
    (
        "search_space.beam_widht",
        {"grid": [10]},
        [
            "`search_space.beam_widht`",
            "decoder 'beam' has no parameter 'beam_widht'; valid: [",
            "'beam_width'",
        ],
    ),
    ("search_space.seed", {"grid": [1]}, ["search_space.seed", "seeds"]),
    (
        "params.k",
        20,
        ["`search_space.beam_width.grid[0]` = 10", "`k` (20) is larger than the beam width (10)"],
    ),
    ("params.k", "ten", ["`params.k`:", "`k` takes an int, got 'ten' (str)"]),
    ("params.constraint", "bogus", ["`params.constraint`:", "'bogus' is not a constraint rule"]),
    ("params.constraint", "random", ["`constraint` 'random' needs constraint_size >= 1"]),
    ("dataset", _DELETE, ["missing required key `dataset`"]),
    ("dataset.path", "/nonexistent/data", ["`dataset.path`", "genrec data synth"]),
    ("model.checkpoint", "/nonexistent/model", ["`model.checkpoint`", "genrec train"]),
    ("model.train", {"out": "/tmp/x"}, ["`model`", "exactly one of"]),
    ("bogus", 1, ["unknown key `bogus`", "valid keys here", "search_space"]),
    ("eval.bach_size", 8, ["unknown key `eval.bach_size`", "batch_size"]),
    ("eval.split", "train", ["`eval.split`"]),
    ("eval.ks", [0, 10], ["`eval.ks`", ">= 1"]),
    ("metric", "recall@20", ["`metric`", "recall@10"]),
    ("mode", "maximise", ["`mode`"]),
    ("resources.cpu", 0, ["`resources.cpu`", "> 0"]),
    ("resources.gpu", -1, ["`resources.gpu`"]),
    ("seeds", [], ["`seeds`"]),
    ("name", "../evil", ["`name`"]),
]


@pytest.mark.parametrize("key,value,expected", BAD, ids=[f"{k}={v!r}"[:40] for k, v, _ in BAD])
def test_bad_files_fail_fast_with_exit_2_naming_the_key(base, tmp_path, capsys, key, value, expected):
    raw = copy.deepcopy(base)
    _set(raw, key, value)
    path = write(tmp_path, raw)
    assert run_cli(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    for part in expected:
        assert part in err, (part, err)
    assert not (tmp_path / "results").exists()  # nothing written


def test_not_yaml_and_missing_file(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("name: [unclosed")
    with pytest.raises(UserInputError, match="not valid YAML"):
        load_experiment(path)
    with pytest.raises(UserInputError, match="no such experiment file"):
        load_experiment(tmp_path / "missing.yaml")


def test_dry_run_prints_the_trials_and_writes_nothing(base, tmp_path, capsys):
    assert run_cli(["sweep", str(write(tmp_path, base)), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 trials" in out and "beam_width" in out and "seed" in out
    assert not (tmp_path / "results").exists()
    assert run_cli(["sweep", str(write(tmp_path, base)), "--resume", "--overwrite"]) == 2


@pytest.mark.parametrize("name", ["experiments/beam_width.yaml", "studies/beam/experiments/beauty_beam.yaml"])
def test_shipped_experiments_are_valid(name):
    cfg = load_experiment(REPO / name, base_dir=REPO, check_files=False)
    assert cfg.decoder == "beam" and cfg.num_trials() == 12
    assert cfg.dataset.path.is_absolute() and cfg.model.path.is_absolute()


def test_every_shipped_experiment_file_validates():
    # decoder names and parameters are checked against the registry; input files may not exist yet
    # the general ones at the top level, each study's beside its drivers
    files = sorted([*(REPO / "experiments").glob("*.yaml"), *(REPO / "studies").glob("*/experiments/*.yaml")])
    assert len(files) >= 21 and {"demo.yaml", "nezha_vs_beam.yaml", "xgr_serving.yaml"} <= {
        f.name for f in files
    }
    for path in files:
        cfg = load_experiment(path, base_dir=REPO, check_files=False)
        assert cfg.num_trials() >= 1, path.name
