"""Options for a local Ray instance that `genrec sweep` and `genrec serve` start: its root folder.

Ray writes its session folders (sockets, logs, the runtime environment) under /tmp/ray by default and
makes its root, each session folder and the folders in it mode 0777 without the sticky bit - again
each time a Ray process starts on the node, so setting them back does not last: any local user could
replace a socket or a log. `local_ray_options` gives Ray the root `$TMPDIR/genrec-ray-<uid>/r`:
Ray chmods `r` and below, never the folder above it, which is this user's only (mode 0700, checked to
be a real folder owned by this user), so nothing Ray makes is in other users' reach whatever its
modes. RAY_TMPDIR, when set, is the user's choice and is kept. Short on purpose: Ray's Unix socket
paths under the root must stay within 107 bytes.

Listeners: Ray 2.60 binds its daemons to loopback only when the node's address is a loopback one, and
`ray.init` turns a `_node_ip_address` of 127.0.0.1 into the machine's address unless Ray clusters are
switched off (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, what macOS and Windows get by default).
`on_loopback` switches them off around `ray.init` of a new local instance: the node's address is then
127.0.0.1 and the GCS, the raylet, every worker, the agents and the metrics servers listen there
(docs/serving.md, "What a local Ray exposes", lists what each one binds).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from genrec.workloads.errors import UserInputError

# Ray's switch for multi-node clusters: "0" makes a new local node's address 127.0.0.1 (Ray's processes
# read it too, so it is set in the environment they inherit)
CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def private_temp_dir() -> Path:
    """This user's Ray root folder, made mode 0700 if new; UserInputError if it is a link, not a
    folder, or someone else's (another user could have made it to catch this user's sockets)."""
    root = Path(tempfile.gettempdir()) / f"genrec-ray-{os.getuid()}"
    try:
        root.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = root.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise UserInputError(
            f"{root}: expected this user's own folder for Ray's session files, found "
            f"{'a link or file' if not stat.S_ISDIR(info.st_mode) else f'a folder of uid {info.st_uid}'}; "
            "remove it, or set RAY_TMPDIR to a folder of yours"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        root.chmod(0o700)
    return root


def local_ray_options() -> dict[str, Any]:
    """Keyword arguments for `ray.init` of a new local instance (none where RAY_TMPDIR decides): Ray's
    root `r` inside this user's private folder."""
    if os.environ.get("RAY_TMPDIR"):
        return {}
    return {"_temp_dir": str(private_temp_dir() / "r")}


@contextlib.contextmanager
def on_loopback(address: str = "local") -> Iterator[None]:
    """Around `ray.init(address=...)`: for a new local instance ("local") its node address is
    127.0.0.1, so every listener Ray starts binds loopback; joining a cluster changes nothing. A value
    of RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER the user set is kept."""
    from ray._private import ray_constants

    if address != "local" or os.environ.get(CLUSTER_SWITCH) is not None:
        yield
        return
    saved = ray_constants.ENABLE_RAY_CLUSTER  # read once when ray is imported: set it here too
    os.environ[CLUSTER_SWITCH] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        os.environ.pop(CLUSTER_SWITCH, None)
        ray_constants.ENABLE_RAY_CLUSTER = saved
