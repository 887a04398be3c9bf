"""Fault suite, Ray's exposure: a local Ray that genrec starts keeps its session files in a folder of this
user's only (platform/ray_options.py), and what it listens on beyond loopback is what docs/serving.md
lists (Ray 2.60 binds some listeners to the node address whatever `_node_ip_address` says)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest
from fault_helpers import listeners

from genrec.platform.ray_options import local_ray_options, private_temp_dir
from genrec.workloads.errors import UserInputError


def test_the_ray_root_is_this_users_only(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    root = private_temp_dir()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and root.stat().st_uid == os.getuid()
    root.chmod(0o777)  # loosened since: tightened again on the next start
    assert stat.S_IMODE(private_temp_dir().stat().st_mode) == 0o700
    assert local_ray_options() == {"_temp_dir": str(root / "r")}  # Ray chmods r, never root
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "mine"))
    assert local_ray_options() == {}  # the user's own choice is kept


def test_a_planted_link_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    (tmp_path / f"genrec-ray-{os.getuid()}").symlink_to(tmp_path)
    with pytest.raises(UserInputError, match="a link or file"):
        private_temp_dir()


PROBE = textwrap.dedent(
    """
    import json, os, ray
    from genrec.platform.ray_options import local_ray_options
    opts = local_ray_options()
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR", **opts)
    session = ray._private.worker._global_node.get_session_dir_path()
    print(json.dumps({"root": opts["_temp_dir"], "session": session}), flush=True)
    input()  # the test lists the listeners, then closes stdin
    ray.shutdown()
    """
)


@pytest.mark.slow
def test_a_local_ray_keeps_its_session_in_the_private_root(tmp_path):
    pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_TMPDIR", "RAY_ADDRESS")}
    before = {(x.address, x.port) for x in listeners()}
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        info = json.loads(proc.stdout.readline())
        new = [x for x in listeners() if (x.address, x.port) not in before]
    finally:
        proc.communicate("\n", timeout=120)
    private = os.path.dirname(info["root"])  # Ray makes its root and what is in it 0777; not this one
    assert info["session"].startswith(info["root"] + os.sep)
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700 and os.stat(private).st_uid == os.getuid()
    # what is still bound beyond loopback is documented (docs/serving.md, "What a local Ray exposes")
    exposed = sorted({x.address for x in new if not x.local_only})
    print("non-loopback listeners of a local Ray:", exposed, len([x for x in new if not x.local_only]))
