"""Options for a local Ray instance that `genrec sweep` and `genrec serve` start: its root folder.

Ray writes its session folders (sockets, logs, the runtime environment) under /tmp/ray by default, a
folder any local user can enter, and makes each session folder mode 0777 without the sticky bit: any
local user could then replace a socket or a log. `private_temp_dir` gives Ray a root folder of this
user's only (checked to be a real folder owned by this user). Ray itself makes that root 0777 when
it starts, so `seal_session_folders` sets the root and the session folder back to 0700 once
`ray.init` returns (Ray's processes run as this user and need nothing more); what Ray makes inside
is then out of other users' reach whatever its own modes. RAY_TMPDIR, when set, is the user's choice
and is kept (still sealed when this user owns it). Short on purpose: Ray's Unix socket paths under
the root must stay within 107 bytes.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from genrec.workloads.errors import UserInputError


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
    """Keyword arguments for `ray.init` of a new local instance (none where RAY_TMPDIR decides)."""
    if os.environ.get("RAY_TMPDIR"):
        return {}
    return {"_temp_dir": str(private_temp_dir())}


def seal_session_folders() -> list[Path]:
    """After `ray.init` of a local instance: its root and session folders, where this user owns them,
    set to mode 0700; the folders changed."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    if node is None:
        return []
    session = Path(node.get_session_dir_path())
    sealed = []
    for folder in (session.parent, session):
        info = folder.lstat()
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            folder.chmod(0o700)
            sealed.append(folder)
    return sealed
