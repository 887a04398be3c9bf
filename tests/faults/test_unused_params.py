"""One rule for parameters the request cannot use, whatever the entry point: a value given for a setting
that the chosen constraint rule or mask backend never reads is refused by name in YAML experiments and
`genrec eval --param` (POST /recommend: tests/faults/test_bad_requests.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic")

from genrec.platform.params import ParamError, eval_params  # noqa: E402
from genrec.workloads.errors import UserInputError  # noqa: E402


@pytest.mark.parametrize(
    "decoder, values, name",
    [
        ("beam", {"constraint": "all", "constraint_path": "/etc/passwd"}, "constraint_path"),
        ("beam", {"constraint": "cold_start", "constraint_size": 50}, "constraint_size"),
        (
            "static",
            {"constraint": "file", "constraint_path": "x.npy", "constraint_seed": 3},
            "constraint_seed",
        ),
        ("static", {"backend": "hash_bitmap", "dense_levels": 0}, "dense_levels"),
    ],
)
def test_an_unused_parameter_is_refused_by_name(decoder, values, name):
    with pytest.raises(ParamError) as e:
        eval_params(decoder, values, (5, 10))
    assert e.value.param == name and f"`{name}`" in str(e.value) and "not used with" in str(e.value)


def test_a_default_left_in_place_and_a_used_value_pass():
    eval_params("beam", {"constraint": "all", "constraint_path": ""}, (5, 10))
    eval_params("beam", {"constraint": "random", "constraint_size": 5, "constraint_seed": 2}, (5, 10))
    eval_params("static", {"backend": "static", "kernel": "torch", "dense_levels": 1}, (5, 10))


def test_yaml_names_the_key_of_an_unused_parameter(tmp_path):
    from genrec.platform.experiment_loading import experiment_from_dict

    raw = {
        "name": "unused",
        "dataset": {"path": str(tmp_path)},
        "model": {"checkpoint": str(tmp_path)},
        "decoder": "beam",
        "params": {"k": 10, "constraint_path": "/etc/passwd"},
        "search_space": {"constraint": {"grid": ["all", "cold_start"]}},
        "tracking": {"results_dir": str(tmp_path / "results")},
    }
    with pytest.raises(UserInputError) as e:
        experiment_from_dict(raw, base_dir=tmp_path, check_files=False)
    assert "`params.constraint_path`" in str(e.value) and "not used with constraint 'all'" in str(e.value)


def test_cli_refuses_an_unused_parameter_in_one_line(tiny_model_dir, capsys):
    from conftest import run_cli

    argv = ["eval", "--model", str(tiny_model_dir), "--param", "constraint_size=9", "--quiet"]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "`constraint_size` 9 is not used with constraint 'none'" in err, err
