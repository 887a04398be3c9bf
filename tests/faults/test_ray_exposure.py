"""Fault suite, Ray's exposure: a local Ray that genrec starts keeps its session files in a folder of this
user's only and listens on loopback (platform/ray_options.py); every listener of a real `genrec serve`
that is not on loopback is in the table of docs/serving.md ("What a local Ray exposes"), which says why
and how it is protected (`genrec sweep`'s listeners: test_sweep_signals.py)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest
from fault_helpers import kill_session, listeners_of, undocumented, wait_until

from genrec.platform.ray_options import local_ray_options, private_temp_dir
from genrec.workloads.errors import UserInputError


def test_the_ray_root_is_this_users_only(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    root = private_temp_dir()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and root.stat().st_uid == os.getuid()
    root.chmod(0o777)  # loosened since: tightened again on the next start
    assert stat.S_IMODE(private_temp_dir().stat().st_mode) == 0o700
    assert local_ray_options() == {"_temp_dir": str(root / "r")}  # Ray chmods r, never root
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "mine"))
    assert local_ray_options() == {}  # the user's own choice is kept


def test_a_planted_link_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    (tmp_path / f"genrec-ray-{os.getuid()}").symlink_to(tmp_path)
    with pytest.raises(UserInputError, match="a link or file"):
        private_temp_dir()


PROBE = textwrap.dedent(
    """
    import json, os, ray
    from genrec.platform.ray_options import local_ray_options, on_loopback
    opts = local_ray_options()
    with on_loopback():
        ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR", **opts)
    session = ray._private.worker._global_node.get_session_dir_path()
    print(json.dumps({"root": opts["_temp_dir"], "session": session}), flush=True)
    input()  # the test lists the listeners, then closes stdin
    ray.shutdown()
    """
)


@pytest.mark.slow
def test_a_local_ray_keeps_its_session_in_the_private_root(tmp_path):
    pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_TMPDIR", "RAY_ADDRESS")}
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        info = json.loads(proc.stdout.readline())
        new = listeners_of(proc.pid)
    finally:
        proc.communicate("\n", timeout=120)
    private = os.path.dirname(info["root"])  # Ray makes its root and what is in it 0777; not this one
    assert info["session"].startswith(info["root"] + os.sep)
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700 and os.stat(private).st_uid == os.getuid()
    # Ray's own daemons on loopback (plain Ray, without Serve: nothing beyond loopback at all)
    assert {"gcs_server", "raylet"} <= {x.process for x in new}, new
    assert [x for x in new if not x.local_only] == []


@pytest.mark.slow
def test_every_listener_of_genrec_serve_is_on_loopback_or_documented(tiny_model_dir, synth_dir, tmp_path):
    """`ss -ltnp` during a real `genrec serve` (the CLI in a subprocess, one replica): each listener of its
    process tree is on loopback or in docs/serving.md's table under its process name and address."""
    pytest.importorskip("ray.serve")
    from test_serve_process import START_S, healthy, recommend, start_app, stop_and_check

    app = start_app(tiny_model_dir, synth_dir, tmp_path, "exposure")
    seen: set = set()
    try:
        assert wait_until(lambda: healthy(app), START_S, poll_s=1.0), app.log.read_text()[-3000:]
        assert recommend(app) == 200
        for _ in range(6):  # a few looks: Ray's agents and Serve's actors come up at their own pace
            seen |= set(listeners_of(app.proc.pid))
            time.sleep(0.5)
        refused = {x.port: unauthenticated_call(x.port) for x in seen if not x.local_only}
        stop_and_check(app, signal.SIGTERM)
    finally:
        kill_session(app.proc.pid)
    assert {"gcs_server", "raylet", "ray::ServeRepli"} <= {x.process for x in seen}, seen
    assert undocumented(list(seen)) == [], "listeners neither on loopback nor in docs/serving.md's table"
    # what stays off loopback (the replicas' gRPC) refuses a client without Ray's token, as documented
    assert refused and all(code == "UNAUTHENTICATED" for code in refused.values()), refused


def unauthenticated_call(port: int) -> str:
    """The status of a call without Ray's token to Serve's replica-to-replica gRPC method on `port`."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            channel.unary_unary("/ray.serve.ASGIService/HandleRequest")(b"", timeout=10)
        except grpc.RpcError as e:
            return e.code().name
    return "OK"
