"""`genrec serve`: run the Ray Serve app (local Ray by default) until Ctrl-C.

Ray and Serve are imported inside the command so `genrec --help` stays fast.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from genrec.workloads.errors import UserInputError


def serve_command(
    model: Annotated[
        Path | None,
        typer.Option(
            help="Checkpoint folder, or hf:DIR (a Hugging Face folder imported on first use with the "
            "data set's items); overrides args.model of --config."
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="Ray Serve config file (see serve.yaml); its args are the app's settings."),
    ] = None,
    data: Annotated[Path | None, typer.Option(help="Dataset folder (default: the checkpoint's).")] = None,
    draft: Annotated[
        Path | None,
        typer.Option(
            help="Draft model for AtSpeed decoders (atspeed_*): a checkpoint on the model's codec "
            "or hf:DIR (overrides args.draft of --config)."
        ),
    ] = None,
    ranking: Annotated[
        Path | None,
        typer.Option(help="Ranking checkpoint folder for POST /rank (from `genrec rank train --out DIR`)."),
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Bind address (default 127.0.0.1: this machine only).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default 8000).")] = None,
    decoders: Annotated[
        str | None, typer.Option(help="Comma-separated decoders to serve; the first is the default.")
    ] = None,
    max_batch_size: Annotated[
        int | None, typer.Option(help="Dynamic batching: largest batch (1 = off).")
    ] = None,
    batch_wait_ms: Annotated[
        float | None, typer.Option(help="Dynamic batching: longest wait for a batch to fill (ms).")
    ] = None,
    replicas: Annotated[int | None, typer.Option(help="Replicas (each loads the model).")] = None,
    threads: Annotated[int | None, typer.Option(help="Torch threads (and Ray CPUs) per replica.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda.")] = None,
    num_cpus: Annotated[
        int | None, typer.Option(help="CPUs of the local Ray instance (default: all).")
    ] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster to deploy on (default: local).")
    ] = None,
    ingress: Annotated[
        str,
        typer.Option(
            help="What receives HTTP: haproxy (replicas serve HTTP behind HAProxy), proxy (Serve's Python "
            "proxy) or auto (haproxy when installed). Fixed when Ray starts; see docs/serving.md."
        ),
    ] = "auto",
) -> None:
    """Serve recommendations over HTTP: POST /recommend (and /rank with --ranking), GET /health, /decoders,
    /constraint-sets."""
    from genrec.platform.serve.config import read_serve_file
    from genrec.platform.serve.server import check_before_start, serve_config_from

    check_serve_options(port, replicas, threads, num_cpus, max_batch_size, batch_wait_ms, host)
    file = read_serve_file(config) if config is not None else None
    args = dict(file.args) if file else {}
    batching = batching_settings(file, args, max_batch_size, batch_wait_ms)
    overrides = {
        "model": str(model) if model else None,
        "data": str(data) if data else None,
        "draft": str(draft) if draft else None,
        "ranking": str(ranking) if ranking else None,
        "decoders": [d.strip() for d in decoders.split(",") if d.strip()] if decoders else None,
        "num_replicas": replicas,
        "threads": threads,
        "device": device,
        "batching": batching or None,
    }
    if overrides["decoders"]:  # keep defaults only for decoders still served (the file's, or built-in)
        args["defaults"] = served_defaults(args, overrides["decoders"])
    resolve_served_models(args, overrides)
    cfg = serve_config_from(args, overrides)
    http = http_settings(file, host, port, ingress)
    check_decoders_fit(cfg)  # eval's one line, in well under a second: before anything loads
    check_port_free(http.host, http.port)  # never share a port with another server (both ingresses)
    print_starting(cfg)
    check_before_start(cfg, http, ray_address)  # bad files, device or ingress: exit 2 before Ray starts
    serve_until_stopped(cfg, http, ray_address, num_cpus)


def resolve_served_models(args: dict, overrides: dict) -> None:
    """hf:DIR as model or draft (flag or config file) -> its cached import, before paths turn absolute;
    the items' SIDs come from --data / args.data (serve/config.py resolve_hf_models)."""
    from genrec.platform.serve.config import resolve_hf_models

    given = {
        key: overrides[key] if overrides[key] is not None else args.get(key) for key in ("model", "draft")
    }
    resolved = resolve_hf_models(given, overrides["data"] or args.get("data"), how="--{key} (or args.{key})")
    for key, value in resolved.items():
        if value != given[key]:
            overrides[key] = value


def check_decoders_fit(cfg) -> None:
    """Every decoder served against the checkpoint's config.json (head kind) and the draft option."""
    from genrec.platform.decoder_needs import check_decoder_fits

    for name in cfg.decoders:
        check_decoder_fits(name, cfg.model, cfg.draft is not None, how_draft="--draft DIR (or args.draft)")


def check_port_free(host: str, port: int) -> None:
    """Bind the HTTP port once, here, before Ray, HAProxy or Serve's proxy could bind it: a port that
    another process listens on is exit 2 naming that process (Serve's proxy would otherwise share it
    through SO_REUSEPORT and split the requests between two different apps)."""
    from genrec.platform.port_owner import port_in_use_message

    message = port_in_use_message(host, port)
    if message:
        raise UserInputError(message)


def check_serve_options(
    port: int | None,
    replicas: int | None,
    threads: int | None,
    num_cpus: int | None,
    max_batch_size: int | None,
    batch_wait_ms: float | None,
    host: str | None,
) -> None:
    """Before the config file is read: a given number is checked, never swapped for a default."""
    from genrec.platform.commands.common import check_range

    check_range("--port", port, 1, 65535)
    check_range("--replicas", replicas, 1)
    check_range("--threads", threads, 1, note="torch threads and Ray CPUs per replica")
    check_range("--num-cpus", num_cpus, 1, note="CPUs of the local Ray instance")
    check_range("--max-batch-size", max_batch_size, 1, note="1 = no dynamic batching")
    check_range("--batch-wait-ms", batch_wait_ms, 0)
    if host is not None and not host.strip():
        raise UserInputError("--host '': give a bind address, e.g. 127.0.0.1 (this machine) or 0.0.0.0 (all)")


def batching_settings(file, args: dict, max_batch_size: int | None, batch_wait_ms: float | None) -> dict:
    """args.batching of the file, then its user_config, then --max-batch-size / --batch-wait-ms."""
    batching = dict(args.get("batching") or {})
    if file and file.user_config:
        batching.update(file.user_config)
    if max_batch_size is not None:
        batching["max_batch_size"] = max_batch_size
    if batch_wait_ms is not None:
        batching["batch_wait_timeout_s"] = batch_wait_ms / 1e3
    return batching


def served_defaults(args: dict, served: list[str]) -> dict:
    """The decoder defaults (the file's, or built-in) of the decoders still served."""
    from genrec.platform.serve.config import ServeConfig

    given = (
        args["defaults"]
        if "defaults" in args
        else ServeConfig.model_fields["defaults"].get_default(call_default_factory=True)
    )
    return {k: v for k, v in given.items() if k in served}


def http_settings(file, host: str | None, port: int | None, ingress: str):
    """--host / --port, else the file's, else 127.0.0.1:8000."""
    from genrec.platform.serve.server import HttpSettings

    return HttpSettings(
        host=host if host is not None else (file.host if file else "127.0.0.1"),
        port=port if port is not None else (file.port if file else 8000),
        request_timeout_s=file.request_timeout_s if file else None,
        ingress=ingress,
    )


def print_starting(cfg) -> None:
    drafted = f", draft {cfg.draft}" if cfg.draft else ""
    typer.echo(
        f"starting Ray Serve: model {cfg.model}{drafted}, decoders {cfg.decoders}, "
        f"max_batch_size {cfg.batching.max_batch_size}, wait {cfg.batching.batch_wait_timeout_s * 1e3:g} ms"
    )


def serve_until_stopped(cfg, http, ray_address: str | None, num_cpus: int | None) -> None:
    """Start the app and serve until SIGTERM, SIGINT or SIGHUP; always shut down Ray (and HAProxy)."""
    from genrec.platform.serve.server import get_json, start_server, stop_server

    stop = StopSignal()
    try:
        try:
            url = start_server(
                cfg,
                http,
                ray_address=ray_address,
                num_cpus=num_cpus,
                checked=True,
                after_ray_init=stop.reinstall,
            )
        except RuntimeError as e:
            raise UserInputError(f"the app did not come up: {e}") from None
        stop.serving = True
        print_usage(url, get_json(url + "/health").get("ingress"), cfg.ranking)
        stop.wait()
    except Stopped:
        pass
    finally:
        typer.echo("shutting down", err=True)
        stop_server(shutdown_ray=True)  # bounded; also ends HAProxy and removes its runtime folder
        stop.restore()


class Stopped(Exception):
    """SIGTERM, SIGINT or SIGHUP arrived while the app was still starting."""


class StopSignal:
    """SIGTERM, SIGINT (Ctrl-C) and SIGHUP all stop the server the same way: a supervisor's SIGTERM to
    the process group must leave no process or listener behind, as Ctrl-C does. While starting, the
    signal interrupts the start; once serving, it ends the wait; a second signal during the shutdown
    is ignored (the shutdown is bounded)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self) -> None:
        self.event = threading.Event()
        self.serving = False
        self.previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}

    def reinstall(self) -> None:
        """Take the signals back after `ray.init`: Ray's core worker installs a handler that aborts
        the process on SIGTERM (exit 134, a stack dump), skipping the shutdown."""
        for sig in self.SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame) -> None:
        if self.event.is_set():
            return
        self.event.set()
        if not self.serving:
            raise Stopped(signum)

    def wait(self) -> None:
        while not self.event.wait(1.0):
            pass

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def print_usage(url: str, ingress: str | None, ranking: Path | None) -> None:
    typer.echo(f"serving at {url} through {ingress}  (Ctrl-C stops)")
    typer.echo(f"  curl -s {url}/health")
    typer.echo(
        f"  curl -s -X POST {url}/recommend -H 'content-type: application/json' "
        """-d '{"history": [1, 2, 3], "k": 5}'"""
    )
    if ranking is not None:
        typer.echo(f"  POST {url}/rank  (ranking model {ranking}; see docs/serving.md)")
    typer.echo(f"  genrec loadtest --url {url} --rate 20 --duration 30 --slo-ms 200")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
