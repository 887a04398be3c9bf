"""Start and stop the Serve app in this process's Ray (local by default): used by `genrec serve`,
the tests and the batching benchmark."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from genrec.platform.ray_options import on_loopback
from genrec.platform.serve.config import (
    APP_IMPORT_PATH,
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEPLOYMENT_NAME,
    ServeConfig,
    check_model_dir,
)
from genrec.platform.serve.ingress import (
    ingress_environment,
    remove_haproxy_runtime,
    resolve_ingress,
    started_with,
)
from genrec.workloads.errors import UserInputError

APP_NAME = "genrec"
SERVE_SHUTDOWN_TIMEOUT_S = 15.0  # Serve's own is 30 s; a controller already gone should not hold us
_STARTED_RAY = False  # this process started the local Ray it serves on (and so stops it)


@dataclass
class HttpSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    request_timeout_s: float | None = None  # Serve's proxy timeout (the app's own is ServeConfig's)
    ingress: str = "auto"  # auto | haproxy | proxy: what receives HTTP (platform/serve/ingress.py)
    handler_loop: str | None = None  # thread | replica; None keeps Serve's default (thread)


def get_json(url: str, timeout: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (a local URL we built)
        return json.loads(r.read())


def wait_healthy(url: str, timeout_s: float = 180.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return get_json(f"{url}/health", timeout=5.0)
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError) as e:
            last = e
            time.sleep(0.5)
    raise RuntimeError(f"{url}/health did not answer within {timeout_s:.0f} s (last error: {last})")


def app_config(
    cfg: ServeConfig, http: HttpSettings | None, user_config: dict[str, Any] | None = None
) -> dict:
    """The Serve config (the same format as serve.yaml) that deploys `cfg`; `user_config` overrides the
    deployment's live settings. Only a changed user_config between two deploys is a lightweight update."""
    args = json.loads(cfg.resolved().model_dump_json())
    live = {**cfg.batching.model_dump(), "request_timeout_s": cfg.request_timeout_s, **(user_config or {})}
    config: dict[str, Any] = {
        "applications": [
            {
                "name": APP_NAME,
                "route_prefix": "/",
                "import_path": APP_IMPORT_PATH,
                "args": args,
                "deployments": [{"name": DEPLOYMENT_NAME, "user_config": live}],
            }
        ],
    }
    if http is not None:  # proxies start once; a redeploy leaves them as they are
        config["http_options"] = {"host": http.host, "port": http.port}
        if http.request_timeout_s:
            config["http_options"]["request_timeout_s"] = http.request_timeout_s
    return config


def deploy(config: dict, timeout_s: float = 300.0) -> None:
    """Apply a Serve config through the controller (what `serve deploy` does) and wait until the app runs;
    a failed deployment raises with Serve's message (e.g. the replica's constructor error)."""
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    _get_global_client().deploy_apps(ServeDeploySchema.model_validate(config))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        app = serve.status().applications.get(APP_NAME)
        status = str(getattr(app, "status", "")) if app else ""
        if status.endswith("RUNNING") and _deployments_settled(app):
            return
        if status.endswith("DEPLOY_FAILED") or status.endswith("UNHEALTHY"):
            raise RuntimeError(f"deployment failed: {app.message}")
        time.sleep(0.5)
    raise RuntimeError(f"the app did not reach RUNNING within {timeout_s:.0f} s")


def _deployments_settled(app) -> bool:
    # after a redeploy the app may still read RUNNING while a deployment updates
    return all(str(d.status).endswith("HEALTHY") for d in app.deployments.values())


def ray_init_options(address: str, num_cpus: int | None) -> dict[str, Any]:
    """ray.init's options: a local Ray gets the CPU count, ordinary worker priority (Ray runs workers at
    nice 15 by default, so a load generator on the same machine would take the CPU from the replicas)
    and session files in a folder of this user's only."""
    from genrec.platform.ray_options import local_ray_options

    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if address == "local":
        kwargs["num_cpus"] = num_cpus
        kwargs["_system_config"] = {"worker_niceness": 0}
        kwargs.update(local_ray_options())
    return kwargs


def ray_environment(cfg: ServeConfig, http: HttpSettings, ingress: str, address: str) -> dict[str, str]:
    """What a local Ray's processes inherit (the ingress settings); a cluster keeps its own."""
    if address != "local":
        return {}
    retry = max(1, math.ceil(cfg.retry_after_s))
    return ingress_environment(ingress, http.handler_loop, cfg.body_timeout_s, cfg.client_timeout_s, retry)


def start_server(
    cfg: ServeConfig,
    http: HttpSettings | None = None,
    ray_address: str | None = None,
    num_cpus: int | None = None,
    user_config: dict[str, Any] | None = None,
    checked: bool = False,
    after_ray_init: Callable[[], None] | None = None,
) -> str:
    """Deploy the app (starting local Ray and Serve if needed); returns its base URL once healthy.
    `checked`: the caller already ran `check_before_start`. `after_ray_init`: called once Ray is up
    (`genrec serve` puts its signal handlers back there: Ray's core worker replaces them with one that
    aborts the driver, exit 134, on SIGTERM)."""
    import ray
    from ray import serve

    global _STARTED_RAY
    http = http or HttpSettings()
    cfg = cfg.resolved()
    if not checked:
        check_before_start(cfg, http, ray_address)
    ingress = resolve_ingress(http.ingress)
    address = ray_address or os.environ.get("RAY_ADDRESS") or "local"
    if not ray.is_initialized():
        with started_with(ray_environment(cfg, http, ingress, address)), on_loopback(address):
            ray.init(address=address, **ray_init_options(address, num_cpus))
        _STARTED_RAY = address == "local"
    if after_ray_init is not None:
        after_ray_init()
    config = app_config(cfg, http, user_config)
    serve.start(http_options=config["http_options"])
    deploy(config)
    host = "127.0.0.1" if http.host in ("0.0.0.0", "::") else http.host
    url = f"http://{host}:{http.port}"
    running = wait_healthy(url).get("ingress")
    if running != ingress and http.ingress != "auto":
        print(
            f"note: asked for ingress {ingress}, but this Ray instance serves through {running}: Serve "
            "fixes it when Ray starts (see platform/serve/ingress.py); restart Ray to change it",
            file=sys.stderr,
        )
    return url


def reconfigure(cfg: ServeConfig, **user_config: Any) -> None:
    """Change batching or the request timeout live: the running replicas get the new user_config in
    `reconfigure` and keep their loaded model (a lightweight update, as `serve deploy` does)."""
    deploy(app_config(cfg, None, user_config))


def check_before_start(cfg: ServeConfig, http: HttpSettings, ray_address: str | None = None) -> None:
    """Everything that can be checked before Ray starts: the files (loaded once, on the CPU, when they
    are this machine's), the device and the ingress."""
    cfg = cfg.resolved()
    check_model_dir(cfg)
    resolve_ingress(http.ingress)
    if (ray_address or os.environ.get("RAY_ADDRESS") or "local") == "local":
        preflight(cfg)


def preflight(cfg: ServeConfig) -> None:
    """Load the checkpoint, dataset and draft once here, on the CPU, so a corrupt or mismatched file is
    one clear error (exit 2) instead of a replica that fails to start ("deployment failed")."""
    from genrec.platform.commands.common import check_device
    from genrec.workloads.evaluation import load_context

    check_device(cfg.device)
    load_context(cfg.model, cfg.data, "cpu", draft_dir=cfg.draft)


def stop_server(shutdown_ray: bool = False, timeout_s: float = SERVE_SHUTDOWN_TIMEOUT_S) -> None:
    """Stop the app; with `shutdown_ray`, also the local Ray this process started, any HAProxy left
    from it and its runtime folder. Bounded: a controller that is already gone (a signal to the whole
    process group reaches Ray's workers too) costs at most `timeout_s`."""
    global _STARTED_RAY
    import ray

    try:
        if ray.is_initialized():
            _shutdown_serve(timeout_s)
    finally:
        if shutdown_ray and ray.is_initialized():
            ray.shutdown()
        if shutdown_ray and _STARTED_RAY:
            remove_haproxy_runtime()
            _STARTED_RAY = False


def _shutdown_serve(timeout_s: float) -> None:
    """serve.shutdown() with a time limit (Serve's own waits 30 s for a controller that may be gone)."""
    from ray.serve import context

    client, had_cached = context._check_cached_client_alive()
    if client is None and not had_cached:  # a fresh process: find a running controller, if any
        with contextlib.suppress(Exception):
            client = context._get_global_client(raise_if_no_controller_running=False)
    if client is None:
        return
    try:
        client.shutdown(timeout_s)
    finally:
        context._disconnect()


def serve_config_from(args: dict[str, Any], overrides: dict[str, Any]) -> ServeConfig:
    from genrec.platform.serve.config import parse_serve_config

    merged = {**args, **{k: v for k, v in overrides.items() if v is not None}}
    if "model" not in merged:
        raise UserInputError(
            "no model: pass --model DIR (a checkpoint folder) or set args.model in the config"
        )
    return parse_serve_config(merged)
