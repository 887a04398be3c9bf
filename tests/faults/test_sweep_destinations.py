"""Fault suite: where a sweep writes and what it connects to are checked before it starts, one line each
and within seconds (platform/sweep/reachability.py), by the real run and by `--dry-run` alike."""

from __future__ import annotations

import socket
import time

import pytest
from experiment_files import cpu_sweep, write_experiment

pytest.importorskip("ray")

from genrec.platform.sweep.reachability import (  # noqa: E402
    CONNECT_TIMEOUT_S,
    check_mlflow_uri,
    check_ray_address,
    check_writable_folder,
)
from genrec.workloads.errors import UserInputError  # noqa: E402


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_results_dir_under_a_file_is_refused(tmp_path):
    afile = tmp_path / "passwd"
    afile.write_text("x")
    with pytest.raises(UserInputError, match="which is a file, not a folder"):
        check_writable_folder(afile / "x", "tracking.results_dir")
    assert check_writable_folder(tmp_path / "new" / "results", "k").startswith("ok k:")


def test_an_mlflow_uri_naming_a_foreign_file_is_refused(tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("not a database")
    with pytest.raises(UserInputError, match="not a SQLite database"):
        check_mlflow_uri(f"sqlite:///{afile}")
    assert "will be created" in check_mlflow_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")


@pytest.mark.parametrize(
    "check, target",
    [
        (check_mlflow_uri, "http://127.0.0.1:{port}"),
        (check_ray_address, "127.0.0.1:{port}"),
        (check_ray_address, "ray://127.0.0.1:{port}"),
    ],
)
def test_an_unreachable_server_is_refused_within_seconds(check, target):
    t0 = time.perf_counter()
    with pytest.raises(UserInputError, match="did not answer within"):
        check(target.format(port=closed_port()))
    assert time.perf_counter() - t0 < CONNECT_TIMEOUT_S + 2


def test_dry_run_checks_what_the_real_run_would(tiny_model_dir, synth_dir, tmp_path, capsys):
    from conftest import run_cli

    afile = tmp_path / "passwd"
    afile.write_text("x")
    raw = cpu_sweep("dest", synth_dir, tiny_model_dir, afile / "x", k=5, widths=[5])
    raw["eval"], raw["metric"] = {"ks": [5]}, "hr@5"
    assert run_cli(["sweep", str(write_experiment(tmp_path / "e.yaml", raw)), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tracking.results_dir" in err and "is a file" in err, err


def test_a_300_character_name_is_refused_in_one_line(tiny_model_dir, synth_dir, tmp_path):
    from genrec.platform.experiment_loading import experiment_from_dict

    raw = cpu_sweep("n" * 300, synth_dir, tiny_model_dir, tmp_path, k=5, widths=[5])
    with pytest.raises(UserInputError, match="has 300 characters; use at most 100"):
        experiment_from_dict(raw, base_dir=tmp_path, check_files=False)
