"""Options for a local Ray instance that `genrec sweep` and `genrec serve` start: its root folder.

Ray writes its session folders (sockets, logs, the runtime environment) under /tmp/ray by default and
makes its root, each session folder and the folders in it mode 0777 without the sticky bit - again
each time a Ray process starts on the node, so setting them back does not last: any local user could
replace a socket or a log. `local_ray_options` gives Ray the root `$TMPDIR/genrec-ray-<uid>/r`:
Ray chmods `r` and below, never the folder above it, which is this user's only (mode 0700, checked to
be a real folder owned by this user), so nothing Ray makes is in other users' reach whatever its
modes. RAY_TMPDIR, when set, is the user's choice and is kept. Short on purpose: Ray's Unix socket
paths under the root must stay within 107 bytes.
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
    """Keyword arguments for `ray.init` of a new local instance (none where RAY_TMPDIR decides): Ray's
    root `r` inside this user's private folder."""
    if os.environ.get("RAY_TMPDIR"):
        return {}
    return {"_temp_dir": str(private_temp_dir() / "r")}
