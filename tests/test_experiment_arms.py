"""Multi-decoder experiments (`arms:`): validation names the arm, the trials are the union of every
arm's grid, each trial gets its arm's decoder and model; `eval.repeats` reaches the trial. No Ray."""

from __future__ import annotations

import copy
import shutil

import pytest
import yaml
from conftest import REPO

from genrec.platform.experiment_loading import experiment_from_dict, load_experiment
from genrec.workloads.errors import UserInputError


@pytest.fixture
def base(synth_dir, tiny_model_dir, tmp_path) -> dict:
    return {
        "name": "arms",
        "dataset": {"path": str(synth_dir)},
        "model": {"checkpoint": str(tiny_model_dir)},
        "arms": [
            {"decoder": "beam", "params": {"k": 10}, "search_space": {"beam_width": {"grid": [10, 20]}}},
            {"decoder": "static", "params": {"k": 10, "beam_width": 10}},
            {"decoder": "popular", "params": {"k": 10}},
        ],
        "seeds": [0, 1],
        "eval": {"ks": [5, 10], "max_users": 20, "repeats": 3},
        "tracking": {"results_dir": str(tmp_path / "results")},
    }


def test_trials_are_the_union_of_every_arms_grid(base):
    cfg = experiment_from_dict(base)
    assert cfg.num_trials() == (2 + 1 + 1) * 2 == len(cfg.trial_grid())
    assert [p["decoder"] for p in cfg.arm_points()] == ["beam", "beam", "static", "popular"]
    assert cfg.arm_points()[1]["params"] == {"k": 10, "beam_width": 20}
    assert cfg.trial_grid()[0] == {"decoder": "beam", "k": 10, "beam_width": 10, "seed": 0}
    assert cfg.decoder == "beam+static+popular"  # a label for summaries


def test_each_trial_gets_its_arms_decoder_model_and_repeats(base, tmp_path, tiny_model_dir):
    raw = copy.deepcopy(base)
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)  # (a symlink would resolve to the same path)
    raw["arms"][1]["model"] = str(other)
    cfg = experiment_from_dict(raw)
    spec = cfg.trial_spec(1.0, "cpu")
    assert spec.repeats == 3
    points = cfg.arm_points()
    s_beam, p_beam = spec.for_trial({"arm": points[0], "seed": 0})
    s_static, p_static = spec.for_trial({"arm": points[2], "seed": 1})
    assert (s_beam.decoder, s_beam.model) == ("beam", str(tiny_model_dir))
    assert (s_static.decoder, s_static.model) == ("static", str(other))
    assert s_static.decoder_params(p_static).beam_width == 10
    assert s_beam.decoder_params(p_beam).beam_width == 10
    plain, point = spec.for_trial({"params": {"beam_width": 12}})  # a one-decoder experiment's trial
    assert plain is spec and point == {"beam_width": 12}


def test_fingerprint_changes_with_the_arms(base):
    a = experiment_from_dict(base).fingerprint()
    raw = copy.deepcopy(base)
    raw["arms"][0]["search_space"]["beam_width"]["grid"] = [10, 40]
    assert experiment_from_dict(raw).fingerprint() != a


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda r: r.update(decoder="beam"), "`arms` replaces decoder"),
        (lambda r: r["arms"][1].update(decoder="nope"), "`arms[1]` (nope): `decoder`: unknown decoder"),
        (lambda r: r["arms"][0]["params"].update(beam_widht=3), "`arms[0]` (beam): `params.beam_widht`"),
        (
            lambda r: r["arms"][0]["search_space"].update(beam_width={"choice": [10, 20]}),
            "`arms[0].search_space.beam_width`: an arm takes grid or range values only",
        ),
        (lambda r: r["arms"][1]["params"].update(beam_width=5), "`arms[1]` (static)"),
        (lambda r: r["eval"].update(repeats=0), "`eval.repeats`: must be >= 1"),
        (lambda r: r["arms"][2].update(model="/no/such/model"), "`arms[2]` (popular)"),
    ],
)
def test_bad_arms_name_the_arm(base, change, expected):
    raw = copy.deepcopy(base)
    change(raw)
    with pytest.raises(UserInputError) as err:
        experiment_from_dict(raw)
    assert expected in str(err.value)


def test_the_demo_experiment_validates():
    cfg = load_experiment(REPO / "experiments" / "demo.yaml", base_dir=REPO, check_files=False)
    decoders = {p["decoder"] for p in cfg.arm_points()}
    assert {"beam", "xgr", "nezha", "static", "atspeed_strict", "atspeed_relaxed", "popular"} <= decoders
    arms = yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text())["arms"]
    assert cfg.eval.repeats >= 3 and cfg.num_trials() == len(cfg.arm_points()) > len(arms)
