"""`genrec serve` fails early (issue 34): a decoder the checkpoint cannot run, and an HTTP port another
process listens on, are exit 2 with one line before Ray starts, for both ingress modes. `genrec eval`
gives the same line, and `genrec decoders` says what each decoder is and needs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
from conftest import run_cli


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def head_checkpoint(tiny_model_dir: Path, tmp_path: Path, kind: str) -> Path:
    """The tiny checkpoint's files with a `kind` head declared: the start-up check reads config.json only."""
    out = tmp_path / f"{kind}-ckpt"
    shutil.copytree(tiny_model_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["head"] = {"kind": kind, "dim": 8, "codebook_sizes": [4, 4, 4]}
    (out / "config.json").write_text(json.dumps(config))
    return out


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "decoder, fits", [("nezha", "plain"), ("beam", "nezha"), ("atspeed_strict", "plain")]
)
def test_serve_refuses_a_decoder_the_checkpoint_cannot_run_in_one_line(
    decoder, fits, tiny_model_dir, tmp_path, capsys, monkeypatch
):
    import ray

    model = tiny_model_dir if fits == "plain" else head_checkpoint(tiny_model_dir, tmp_path, fits)
    # refused before Ray starts: the check must not reach ray.init (in a full run another test's Ray
    # may already be up, so is_initialized() says nothing)
    started = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append(1))
    t0 = time.perf_counter()
    argv = ["serve", "--model", str(model), "--decoders", decoder, "--port", str(free_port())]
    assert run_cli(argv) == 2
    assert time.perf_counter() - t0 < 10.0
    lines = error_lines(capsys)
    assert len(lines) == 1 and f"decoder {decoder!r}" in lines[0], lines
    assert not started


def test_eval_refuses_beam_on_a_nezha_checkpoint_in_one_line(tiny_model_dir, tmp_path, capsys):
    model = head_checkpoint(tiny_model_dir, tmp_path, "nezha")
    assert run_cli(["eval", "--model", str(model), "--decoder", "beam", "--quiet"]) == 2
    lines = error_lines(capsys)
    assert len(lines) == 1 and "next-token head is untrained" in lines[0] and "--decoder nezha" in lines[0]


@pytest.mark.parametrize("ingress", ["proxy", "haproxy"])
def test_serve_on_a_busy_port_exits_2_naming_the_holder(ingress, tiny_model_dir, capsys):
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as Serve's proxy binds it
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        argv = ["serve", "--model", str(tiny_model_dir), "--port", str(port), "--ingress", ingress]
        assert run_cli(argv) == 2
    lines = error_lines(capsys)
    assert len(lines) == 1 and f"--port {port}" in lines[0] and "already in use" in lines[0], lines
    assert f"pid {os.getpid()}" in lines[0]  # the holder, named


def test_a_free_port_and_a_time_wait_port_are_free():
    from genrec.platform.port_owner import port_busy, port_in_use_message

    port = free_port()
    assert not port_busy("127.0.0.1", port) and port_in_use_message("127.0.0.1", port) == ""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        busy = server.getsockname()[1]
        assert port_busy("127.0.0.1", busy) and port_busy("0.0.0.0", busy)


def test_genrec_decoders_says_what_each_is_and_needs(capsys):
    from genrec.workloads.decoding.base import decoder_names

    assert run_cli(["decoders"]) == 0
    out = capsys.readouterr().out
    for name in decoder_names():
        assert f"\n{name}: " in f"\n{out}"
    assert "needs: a checkpoint with a nezha head (genrec train --objective nezha)" in out
    assert "--draft DIR" in out and "constraint: str = 'none'" in out
