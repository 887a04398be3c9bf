"""Helpers of the fault suite (tests/faults): corrupt copies of fixtures, listeners, processes.

Every fault test talks to 127.0.0.1 only, bounds its own time, and leaves no process behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

# ---- corrupting files -------------------------------------------------------------------------


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def random_bytes(path: Path) -> None:
    path.write_bytes(os.urandom(max(64, path.stat().st_size // 8)))


def empty(path: Path) -> None:
    path.write_bytes(b"")


def edit_json(
    key_path: tuple[str, ...], value: object = None, delete: bool = False
) -> Callable[[Path], None]:
    """A corruption that sets (or deletes) one key of a JSON file."""

    def corrupt(path: Path) -> None:
        doc = json.loads(path.read_text())
        node = doc
        for key in key_path[:-1]:
            node = node[key]
        if delete:
            del node[key_path[-1]]
        else:
            node[key_path[-1]] = value(node.get(key_path[-1])) if callable(value) else value
        path.write_text(json.dumps(doc))

    return corrupt


def write_bytes(data: bytes) -> Callable[[Path], None]:
    def corrupt(path: Path) -> None:
        path.write_bytes(data)

    return corrupt


def corrupt_copy(src: Path, dst: Path, name: str, corrupt: Callable[[Path], None]) -> Path:
    """A copy of folder `src` at `dst` whose file `name` went through `corrupt`."""
    shutil.copytree(src, dst)
    corrupt(dst / name)
    return dst


# ---- listeners and processes ------------------------------------------------------------------


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    pid: int | None
    process: str = ""  # the name `ss -ltnp` shows (the process's comm, 15 characters at most)

    @property
    def local_only(self) -> bool:
        host = self.address.removeprefix("[").removesuffix("]").removeprefix("::ffff:")  # v4-mapped
        return host == "::1" or host.startswith("127.")


def listeners() -> list[Listener]:
    """Every listening TCP socket of this machine (`ss -ltnpH`)."""
    if shutil.which("ss") is None:
        pytest.skip("`ss` (iproute2) is not installed")
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        address, _, port = parts[3].rpartition(":")
        pid, process = None, ""
        if "pid=" in line:
            pid = int(line.split("pid=", 1)[1].split(",", 1)[0])
            process = line.split('(("', 1)[1].split('"', 1)[0] if '(("' in line else ""
        found.append(Listener(address, int(port), pid, process))
    return found


def descendants(root: int) -> set[int]:
    """`root` and every live process below it (by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo += children.get(pid, [])
    return tree


def listeners_of(root: int) -> list[Listener]:
    """The listening sockets of `root`'s process tree (a command and the Ray it started)."""
    tree = descendants(root) | set(session_members(root))
    return [x for x in listeners() if x.pid in tree]


SERVING_DOCS = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def documented_listeners(docs: Path = SERVING_DOCS) -> dict[str, str]:
    """Process name -> the address it binds, from the table after `<!-- listeners` in docs/serving.md
    ("What a local Ray exposes")."""
    rows: dict[str, str] = {}
    for line in docs.read_text().split("<!-- listeners", 1)[1].splitlines()[1:]:
        if not line.strip().startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and not cells[0].startswith("process") and set(cells[0]) != {"-"}:
            rows[cells[0]] = cells[2]
    return rows


def undocumented(found: list[Listener], docs: Path = SERVING_DOCS) -> list[Listener]:
    """The listeners neither on loopback nor in a docs row of their process that names their address
    (`*` covers every address)."""
    rows = documented_listeners(docs)

    def covered(x: Listener) -> bool:
        binds = rows.get(x.process)
        return binds is not None and (binds == "*" or binds == x.address)

    exposed = {x for x in found if not x.local_only and not covered(x)}
    return sorted(exposed, key=lambda x: (x.process, x.port))


def listening_on(port: int) -> list[Listener]:
    return [x for x in listeners() if x.port == port]


def pids_mentioning(text: str) -> list[int]:
    """Processes whose command line contains `text` (this one excluded)."""
    needle = text.encode()
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "cmdline").read_bytes() and int(entry.name) != os.getpid():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of session `sid`."""
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(entry.name))
    return out


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()


def kill_session(sid: int) -> None:
    """Last resort for a test that failed half-way: SIGKILL what is left of the session it started."""
    for pid in session_members(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
