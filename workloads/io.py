"""Small file helpers: atomic writes so a crash never leaves a half-written file, and the cleanup of
what a killed writer left behind.

Every atomic writer builds its output under a hidden sibling, `.NAME.tmp-PID@HOST-XXXXXX`, and renames
it into place (a replaced folder is parked as `.NAME.old-PID` for a moment). A writer killed in between
leaves that sibling behind; the next write of the same NAME removes the ones whose writer is gone: on
this host, a pid that no longer runs; from another host or without a pid (older genrec), anything older
than STALE_AFTER_S (a shared folder may hold another machine's write in progress).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

STALE_AFTER_S = 24 * 3600
_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"
_TEMP_RE = re.compile(r"\.(?:tmp|old)-(?:(?P<pid>\d+)(?:@(?P<host>[A-Za-z0-9._]+))?)?")


def temp_prefix(path: Path) -> str:
    """The name prefix of `path`'s temporary sibling, naming this process (for the cleanup above)."""
    return f".{path.name}.tmp-{os.getpid()}@{_HOST}-"


def temp_sibling_dir(path: str | os.PathLike) -> Path:
    """A new empty folder beside `path` to build it in; stale leftovers of `path` are removed first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(path)
    return Path(tempfile.mkdtemp(prefix=temp_prefix(path), dir=path.parent))


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Build `path` with `write(tmp)` in a temporary sibling, then rename it into place: readers never
    see half a file, and a failed write leaves nothing. The file gets the permissions a plain write
    would give it (mkstemp makes 0600; a result, report or teacher file should be readable)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(path)  # what a killed writer of this path left behind
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def write_parquet_atomic(table: pa.Table, path: str | os.PathLike) -> Path:
    """One Parquet file, written atomically (`atomic_write`)."""
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def clean_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary siblings of `path` (`.NAME.tmp-*`, `.NAME.old-*`) whose writer is gone;
    returns what was removed. A sibling of a live writer is left alone."""
    path = Path(path)
    removed: list[Path] = []
    if not path.parent.is_dir():
        return removed
    lead = f".{path.name}."
    for entry in path.parent.iterdir():
        if not entry.name.startswith(lead):
            continue
        m = _TEMP_RE.match(entry.name, len(lead) - 1)
        if m is None or not _is_stale(entry, m.group("pid"), m.group("host")):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except FileNotFoundError:  # another writer cleaned it first
            continue
        removed.append(entry)
    return removed


def _is_stale(entry: Path, pid: str | None, host: str | None) -> bool:
    if pid is not None and host == _HOST:
        return not _alive(int(pid))
    try:  # another host's write, or a name without a pid: only age tells
        return time.time() - entry.lstat().st_mtime > STALE_AFTER_S
    except FileNotFoundError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
