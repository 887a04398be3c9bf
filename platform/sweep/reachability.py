"""What a sweep writes to and connects to, checked before it starts (and by `genrec sweep --dry-run`):
the results folder is a writable folder (or can be made one), the MLflow tracking URI is a SQLite
database or a server that answers a TCP connect within a few seconds, and a Ray address answers the
same way. Each check is one line: `ok ...` for the dry run, or a UserInputError naming the key and the
fix; an unreachable server costs at most CONNECT_TIMEOUT_S instead of a client's minutes of retries.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from genrec.workloads.errors import UserInputError

if TYPE_CHECKING:
    from genrec.platform.experiment import ExperimentConfig

CONNECT_TIMEOUT_S = 3.0
SQLITE_MAGIC = b"SQLite format 3\x00"


def check_writable_folder(path: Path, key: str) -> str:
    """`path` is a folder this user can write, or its nearest existing ancestor is one (it will be made)."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise UserInputError(
            f"`{key}`: {path} is under {probe}, which is a file, not a folder; choose a folder"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserInputError(f"`{key}`: {probe} is not writable by this user; choose a folder you can write")
    return f"ok {key}: {path} ({'exists' if probe == path else f'will be created under {probe}'})"


def check_tcp(host: str, port: int, what: str) -> None:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return
    except OSError as e:
        raise UserInputError(
            f"{what}: {host}:{port} did not answer within {CONNECT_TIMEOUT_S:g} s ({e.strerror or e}); "
            "start it, fix the address, or leave it out"
        ) from None


def sqlite_head(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(16)
    except OSError as e:
        raise UserInputError(f"`tracking.mlflow_uri`: {path} cannot be read ({e.strerror})") from None


def check_mlflow_uri(uri: str) -> str:
    """A sqlite:/// URI names a SQLite file (or a place for one); http(s) answers a TCP connect."""
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        path = Path(parsed.path[1:] if parsed.path.startswith("//") else parsed.path)
        if path.exists():
            head = b"dir" if path.is_dir() else sqlite_head(path)
            if head and head != SQLITE_MAGIC:  # SQLite takes an empty file as an empty database
                raise UserInputError(
                    f"`tracking.mlflow_uri`: {path} exists and is not a SQLite database; name a new "
                    "file or an MLflow database"
                )
            return f"ok tracking.mlflow_uri: {uri} (SQLite database)"
        check_writable_folder(path.parent, "tracking.mlflow_uri")
        return f"ok tracking.mlflow_uri: {uri} (will be created)"
    if parsed.scheme in ("http", "https"):
        # the client's default retries last minutes
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        check_tcp(parsed.hostname or "", port, f"`tracking.mlflow_uri` {uri}")
        return f"ok tracking.mlflow_uri: {uri} (answers)"
    return f"not checked tracking.mlflow_uri: {uri} (scheme {parsed.scheme or 'file'!r})"


def check_ray_address(address: str) -> str:
    """`local` and `auto` need nothing; HOST:PORT and ray://HOST:PORT must answer a TCP connect."""
    if address in ("local", "auto"):
        return f"ok ray address: {address}"
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    if not parsed.hostname or parsed.port is None:
        raise UserInputError(f"ray address {address!r}: expected HOST:PORT or ray://HOST:PORT")
    check_tcp(parsed.hostname, parsed.port, f"ray address {address}")
    return f"ok ray address: {address} (answers)"


def sweep_destinations(cfg: ExperimentConfig, address: str) -> list[str]:
    """Every check above for a sweep of `cfg` on Ray `address`: one `ok` line each, or UserInputError."""
    lines = [check_writable_folder(cfg.results_dir, "tracking.results_dir")]
    if cfg.tracking.storage_path is not None:
        lines.append(check_writable_folder(cfg.storage_path, "tracking.storage_path"))
    if cfg.tracking.mlflow:
        lines.append(check_mlflow_uri(cfg.mlflow_uri))
    lines.append(check_ray_address(address))
    return lines
