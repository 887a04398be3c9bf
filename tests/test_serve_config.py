"""The Serve config file and the app's settings, checked without starting Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_cli

from genrec.platform.params import parse_decoder_params
from genrec.platform.serve.config import ServeConfig, check_model_dir, parse_serve_config, read_serve_file
from genrec.platform.serve.requests import Limits, RequestError, parse_recommend
from genrec.workloads.errors import UserInputError

pytest.importorskip("ray.serve")


def test_shipped_serve_yaml_is_a_valid_serve_config_bound_to_localhost():
    file = read_serve_file(REPO / "serve.yaml")
    assert file.host == "127.0.0.1" and file.port == 8000
    cfg = parse_serve_config(file.args)
    assert cfg.decoders[0] == "beam" and cfg.batching.max_batch_size >= 1
    assert cfg.defaults["beam"]["beam_width"] == 20


def test_bad_serve_files_name_the_problem(tmp_path: Path):
    with pytest.raises(UserInputError, match="no such file"):
        read_serve_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications: [{name: x, import_path: other.module:app}]\n")
    with pytest.raises(UserInputError, match="exactly one application"):
        read_serve_file(bad)
    with pytest.raises(UserInputError, match="batching.max_batch_size"):
        parse_serve_config({"model": "m", "batching": {"max_batch_size": 0}})
    with pytest.raises(UserInputError, match="colour"):
        parse_serve_config({"model": "m", "colour": 1})
    with pytest.raises(UserInputError, match="no checkpoint there"):
        check_model_dir(ServeConfig(model=tmp_path))


def test_serve_command_refuses_a_missing_model_before_starting_ray(tmp_path: Path, capsys):
    assert run_cli(["serve", "--model", str(tmp_path / "nope")]) == 2
    assert "no checkpoint there" in capsys.readouterr().err


def test_serve_config_overrides_from_the_command_line(tmp_path: Path):
    from genrec.platform.serve.server import app_config, serve_config_from

    raw = yaml.safe_load((REPO / "serve.yaml").read_text())["applications"][0]["args"]
    cfg = serve_config_from(raw, {"model": str(tmp_path), "num_replicas": 3, "threads": None})
    assert cfg.model == tmp_path and cfg.num_replicas == 3 and cfg.threads == raw["threads"]
    config = app_config(cfg, None, {"max_batch_size": 1})
    assert "http_options" not in config  # a redeploy leaves the proxies alone
    live = config["applications"][0]["deployments"][0]["user_config"]
    assert live["max_batch_size"] == 1 and live["request_timeout_s"] == cfg.request_timeout_s


def limits() -> Limits:
    return Limits(
        num_items=100,
        max_history=5,
        max_k=50,
        history_policy="reject",
        decoders=("beam",),
        default_decoder="beam",
        defaults={"beam": parse_decoder_params("beam", {"beam_width": 10, "k": 10})},
        constraint_sets={},
        unavailable_sets={"cold_start": "every catalogue item occurs in the training split"},
    )


def test_reject_policy_and_unavailable_sets():
    with pytest.raises(RequestError, match="model's window is 5") as e:
        parse_recommend(b'{"history": [1, 2, 3, 4, 5, 6]}', limits())
    assert e.value.status == 422
    with pytest.raises(RequestError, match="unavailable here: every catalogue item"):
        parse_recommend(b'{"history": [1], "constraint": "cold_start"}', limits())
    with pytest.raises(RequestError, match="`history.0`"):
        parse_recommend(b'{"history": [true]}', limits())  # strict: a bool is not an item id
    job = parse_recommend(b'{"history": [1, 2, 3, 4, 5], "k": 3, "beam_width": 4}', limits())
    assert job.history == (1, 2, 3, 4, 5) and job.k == 3
    assert job.params == parse_decoder_params("beam", {"beam_width": 4, "k": 3})


def test_serve_config_checks_decoders_defaults_and_sets_before_ray():
    with pytest.raises(
        UserInputError, match="`defaults.beam`: `k` \\(30\\) is larger than the beam width \\(20\\)"
    ):
        parse_serve_config({"model": "m", "defaults": {"beam": {"beam_width": 20, "k": 30}}})
    with pytest.raises(UserInputError, match="`decoders`: \\['bem'\\]"):
        parse_serve_config({"model": "m", "decoders": ["bem"], "defaults": {}})
    with pytest.raises(UserInputError, match="constraint_sets.few"):
        parse_serve_config({"model": "m", "constraint_sets": {"few": {"rule": "random"}}})
    with pytest.raises(UserInputError, match="constraint_sets.odd.rule"):
        parse_serve_config({"model": "m", "constraint_sets": {"odd": {"rule": "odd"}}})
    cfg = parse_serve_config({"model": "m", "decoders": ["nezha", "beam"], "defaults": {}})
    assert set(cfg.constraint_sets) == {"all", "cold_start"}  # kept: nezha and beam take a constraint


def test_resource_limits_and_timeouts_are_checked_with_the_key_named():
    cfg = parse_serve_config({"model": "m"})
    assert cfg.limits.max_beam_width == 512 and cfg.body_timeout_s == 5.0 and cfg.decode_in_thread
    with pytest.raises(UserInputError, match="limits.max_beam_width"):
        parse_serve_config({"model": "m", "limits": {"max_beam_width": 0}})
    with pytest.raises(UserInputError, match="colour"):
        parse_serve_config({"model": "m", "limits": {"colour": 1}})
    with pytest.raises(UserInputError, match="body_timeout_s"):
        parse_serve_config({"model": "m", "body_timeout_s": 0})
    cfg = parse_serve_config({"model": "m", "limits": {"max_beam_width": 64}, "client_timeout_s": 10})
    assert cfg.limits.max_beam_width == 64 and cfg.client_timeout_s == 10
