"""Is a TCP port free to listen on, and if not, which process holds it (Linux /proc; best effort).

`genrec serve` binds the port once itself before Ray starts: binding (not connecting) is the test
that matters, since a listener on 0.0.0.0 also blocks 127.0.0.1, and Serve's proxy would otherwise
join an existing listener through SO_REUSEPORT. SO_REUSEADDR is set so a port whose last connection
is in TIME_WAIT still counts as free, as it will for the server.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

LISTEN = "0A"  # /proc/net/tcp state of a listening socket


def port_busy(host: str, port: int) -> bool:
    """Whether binding (host, port) fails because the address is in use."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on `port` (any address), from /proc/net/tcp and tcp6."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def fd_links(proc: Path) -> set[str]:
    """What a process's file descriptors point to; an fd that closes while we look is skipped (our
    own listing's fd among them), a process we may not inspect has none."""
    links = set()
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:
        return links
    for fd in fds:
        try:
            links.add(os.readlink(fd))
        except OSError:
            continue
    return links


def port_owners(port: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes listening on `port` that this user may inspect."""
    wanted = {f"socket:[{i}]" for i in listening_inodes(port)}
    owners = []
    if not wanted:
        return owners
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        if fd_links(proc) & wanted:
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                cmd = ""
            owners.append((int(proc.name), cmd))
    return sorted(owners)


def port_in_use_message(host: str, port: int) -> str:
    """'' when (host, port) is free; else one line naming the holder (when it can) and the fix."""
    if not port_busy(host, port):
        return ""
    owners = port_owners(port)
    if owners:
        pid, cmd = owners[0]
        who = f"pid {pid} ({cmd[:120]})" if cmd else f"pid {pid}"
    else:
        who = "another process (not visible to this user)"
    return (
        f"--port {port}: {host}:{port} is already in use by {who}; stop it, or pass --port N with a free port"
    )
