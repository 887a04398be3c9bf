"""Fault suite, faults against `genrec serve` processes (each its own local Ray, 127.0.0.1 only): two
apps on one machine side by side, then SIGTERM and SIGINT to their process groups (what a supervisor
or a script does), repeated: nothing may be left behind (no process of the group, no HAProxy, no
listener, no runtime folder)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from fault_helpers import kill_session, listeners, listening_on, pids_mentioning, session_members, wait_until

pytest.importorskip("ray.serve")

from genrec.platform.serve.ingress import free_port, haproxy_available  # noqa: E402

START_S = 90.0  # a local Ray, Serve and one replica on a busy 2-core machine
STOP_S = 30.0


@dataclass
class App:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def runtime(self) -> Path | None:
        """The app's HAProxy runtime folder, from the command line of the HAProxy on its port."""
        for x in listening_on(self.port):
            if x.pid is None:
                continue
            args = Path(f"/proc/{x.pid}/cmdline").read_bytes().split(b"\0")
            if b"-f" in args:
                return Path(args[args.index(b"-f") + 1].decode()).parent.parent
        return None


def start_app(model: Path, data: Path, tmp_path: Path, name: str) -> App:
    port = free_port()
    log = tmp_path / f"{name}.log"
    argv = [sys.executable, "-c", "from genrec.platform.cli import main; main()", "serve"]
    argv += [
        "--model",
        str(model),
        "--data",
        str(data),
        "--port",
        str(port),
        "--num-cpus",
        "1",
        "--threads",
        "1",
    ]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    return App(proc, port, log)


def healthy(app: App) -> bool:
    if app.proc.poll() is not None:
        raise AssertionError(f"genrec serve exited {app.proc.returncode}:\n{app.log.read_text()[-3000:]}")
    try:
        with urllib.request.urlopen(f"{app.url}/health", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def health_of(app: App) -> dict:
    with urllib.request.urlopen(f"{app.url}/health", timeout=3) as r:
        return json.loads(r.read())


def recommend(app: App) -> int:
    req = urllib.request.Request(
        f"{app.url}/recommend",
        data=json.dumps({"history": [1, 2, 3], "k": 5}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status


def gone(app: App, runtime: Path | None) -> bool:
    """Nothing of the app is left: its session, its HAProxy (and watchdog), its port, its folder."""
    if session_members(app.proc.pid):
        return False
    if runtime is not None and (pids_mentioning(str(runtime)) or runtime.exists()):
        return False
    return not listening_on(app.port)


def haproxy_listeners(runtime) -> list:
    """The listening sockets of the HAProxy processes that name this app's runtime folder."""
    haproxy = set(pids_mentioning(str(runtime)))
    return [x for x in listeners() if x.pid in haproxy]


def stop_and_check(app: App, sig: signal.Signals) -> None:
    runtime = app.runtime()
    t0 = time.monotonic()
    os.killpg(app.proc.pid, sig)
    try:
        app.proc.wait(timeout=STOP_S)
        assert wait_until(lambda: gone(app, runtime), STOP_S - (time.monotonic() - t0) + 5), (
            f"left behind after {sig.name}: session {session_members(app.proc.pid)}, "
            f"runtime {runtime} pids {pids_mentioning(str(runtime)) if runtime else None}, "
            f"port {listening_on(app.port)}\n{app.log.read_text()[-2000:]}"
        )
    finally:
        kill_session(app.proc.pid)


@pytest.mark.slow
def test_two_apps_serve_side_by_side_and_sigterm_or_sigint_leaves_nothing(
    tiny_model_dir, synth_dir, tmp_path
):
    apps = [start_app(tiny_model_dir, synth_dir, tmp_path, name) for name in ("a", "b")]
    try:
        for app in apps:
            assert wait_until(lambda app=app: healthy(app), START_S, poll_s=1.0), app.log.read_text()[-3000:]
            assert recommend(app) == 200
            assert health_of(app)["niceness"] == 0  # replicas at ordinary priority, not Ray's 15
        if haproxy_available():
            runtimes = [app.runtime() for app in apps]
            assert all(runtimes) and runtimes[0] != runtimes[1]
            ports = []
            for runtime in runtimes:
                # polled: on a loaded machine the listener table can lag the health answer (a CI run
                # beside three training jobs once saw none on the first look)
                assert wait_until(lambda runtime=runtime: haproxy_listeners(runtime), 15, poll_s=0.5)
                mine = haproxy_listeners(runtime)
                assert mine and all(x.local_only for x in mine), mine
                ports.append({x.port for x in mine})
            assert not ports[0] & ports[1]  # stats and metrics on ports of their own
        stop_and_check(apps[0], signal.SIGTERM)
        assert recommend(apps[1]) == 200  # the other app is untouched
        stop_and_check(apps[1], signal.SIGINT)
    finally:
        for app in apps:
            kill_session(app.proc.pid)


@pytest.mark.slow
def test_sigterm_to_the_process_group_is_clean_every_time(tiny_model_dir, synth_dir, tmp_path):
    """SIGTERM to the whole process group (it used to fail in two of three tries). One round here: the
    two-apps test sends the same signal to another group, so every run tries it twice (a second
    round here cost a minute of CI)."""
    app = start_app(tiny_model_dir, synth_dir, tmp_path, "group")
    try:
        assert wait_until(lambda: healthy(app), START_S, poll_s=1.0), app.log.read_text()[-3000:]
        stop_and_check(app, signal.SIGTERM)
    finally:
        kill_session(app.proc.pid)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_driver_alone_exits_0_and_leaves_nothing(sig, tiny_model_dir, synth_dir, tmp_path):
    """A supervisor that signals only `genrec serve` (not its process group): the command shuts the app,
    HAProxy and its local Ray down (Ray's agents included) and exits 0, as documented in
    docs/serving.md ("What a local Ray exposes")."""
    app = start_app(tiny_model_dir, synth_dir, tmp_path, sig.name)
    try:
        assert wait_until(lambda: healthy(app), START_S, poll_s=1.0), app.log.read_text()[-3000:]
        runtime = app.runtime()
        os.kill(app.proc.pid, sig)
        code = app.proc.wait(timeout=STOP_S)
        assert code == 0, app.log.read_text()[-3000:]
        assert wait_until(lambda: gone(app, runtime), STOP_S), (
            f"left behind after {sig.name}: {session_members(app.proc.pid)} {listening_on(app.port)}"
        )
    finally:
        kill_session(app.proc.pid)
