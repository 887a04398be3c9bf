"""Fault suite, hostile files through the real CLI under `prlimit --data`: each hostile checkpoint config,
dataset and experiment file of test_hostile_files.py (plus two million seeds and two million samples)
is refused by the command that reads it - `genrec eval` for checkpoints and datasets, `genrec sweep
--dry-run` for experiment files - with exit 2, one line on stderr, at most 500 MB of peak RSS, and
within 5 s of CPU and of wall time beyond what the CLI's own start costs.

The limits: the data segment (RLIMIT_DATA: heap and private writable mappings, not torch's
address-space reservations, which RLIMIT_AS would count) is capped at what a process holds after
importing torch and the CLI + 500 MB, so a regression that allocates fails fast instead of taking the
machine. Start-up allowance: on the shared 2-core CI machine importing torch alone takes 3-10 s of wall
time (3-10 s under another job's load), so the wall-time bound is 5 s on top of 3x the start-up
measured here alongside (`Baseline`): a guard against the hangs of minutes that the hostile files
caused; the 5 s bound proper is on CPU time (5 s on top of the start-up's), which load does not
inflate."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from fault_helpers import corrupt_copy
from test_hostile_files import CHECKPOINTS, DATASETS, EXPERIMENTS, experiment_yaml

SECONDS, MEGABYTES = 5.0, 500
# the real CLI; at exit it writes its /proc status (VmHWM: its own peak RSS) where STATUS_TO names.
# Not wait4's ru_maxrss: Linux carries the forking parent's peak (pytest's, ~600 MB) into the child's.
CLI = (
    "import atexit, os\n"
    "atexit.register(lambda: open(os.environ['STATUS_TO'], 'w').write(open('/proc/self/status').read()))\n"
    "from genrec.platform.cli import main; main()"
)
START = (  # the CLI's start: prints VmData (KiB) once torch and the CLI are imported
    "import torch, genrec.platform.cli\n"
    "print([x.split()[1] for x in open('/proc/self/status') if x.startswith('VmData')][0])"
)
WALL_ALLOWANCE = 3  # x the start-up's wall time: on a loaded 2-core machine wall time swings 3x
HANG_S = 120.0  # kill a command that hangs (a failure either way)

MORE_EXPERIMENTS = {
    "seeds-2e6": (
        experiment_yaml(seeds="[" + ",".join(map(str, range(2_000_000))) + "]"),
        "-byte limit for a YAML experiment file",
    ),
    "num-samples-2e6": (experiment_yaml() + "num_samples: 2000000\n", "the limit is 10,000"),
}


@dataclass(frozen=True)
class Outcome:
    code: int
    stderr: str
    wall_s: float
    cpu_s: float
    rss_mb: float


def run_limited(argv: list[str], status_to: Path, data_limit: int | None = None) -> Outcome:
    """ARGV under `prlimit --data=LIMIT` (bytes), with its exit code, stderr, wall and CPU seconds (wait4's
    rusage of that child) and peak RSS (the VmHWM it wrote to `status_to` at exit; inf if it wrote none)."""
    if data_limit is not None:
        argv = [shutil.which("prlimit") or "prlimit", f"--data={data_limit}", "--", *argv]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"STATUS_TO": str(status_to)}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    timer = threading.Timer(HANG_S, proc.kill)
    timer.start()
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.extend([proc.stdout.read(), proc.stderr.read()]))
    reader.start()  # drain both pipes before wait4, so a chatty command cannot block on a full pipe
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    reader.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    status = status_to.read_text() if status_to.is_file() else ""
    hwm = [int(x.split()[1]) / 1024 for x in status.splitlines() if x.startswith("VmHWM:")]
    # prlimit execs the command, so the rusage is the command's own
    cpu = usage.ru_utime + usage.ru_stime
    return Outcome(
        proc.returncode, out[1].decode(errors="replace"), wall, cpu, hwm[0] if hwm else float("inf")
    )


@dataclass(frozen=True)
class Baseline:
    data_bytes: int  # VmData after importing torch and the CLI
    wall_s: float
    cpu_s: float


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Baseline:
    if shutil.which("prlimit") is None:
        pytest.skip("`prlimit` (util-linux) is not installed")
    tmp = tmp_path_factory.mktemp("start")
    with ThreadPoolExecutor(2) as pool:  # two at a time, as the cases run
        runs = list(pool.map(lambda i: run_limited([sys.executable, "-c", START], tmp / f"{i}"), range(2)))
    assert all(r.code == 0 for r in runs), runs
    data_kb = int(
        subprocess.run([sys.executable, "-c", START], capture_output=True, text=True).stdout.strip()
    )
    return Baseline(data_kb * 1024, max(r.wall_s for r in runs), max(r.cpu_s for r in runs))


def hostile_commands(model: Path, data: Path, tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """Case name -> (the genrec arguments that read the hostile file, words the refusal names)."""
    cases = {}
    for name, (corrupt, words) in CHECKPOINTS.items():
        bad = corrupt_copy(model, tmp_path / name, "config.json", corrupt)
        cases[name] = (["eval", "--model", str(bad), "--data", str(data), "--threads", "1"], words)
    for name, (file, corrupt, words) in DATASETS.items():
        bad = corrupt_copy(data, tmp_path / name, file, corrupt)
        cases[name] = (["eval", "--model", str(model), "--data", str(bad), "--threads", "1"], words)
    for name, (text, words) in {**EXPERIMENTS, **MORE_EXPERIMENTS}.items():
        path = tmp_path / f"{name}.yaml"
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        cases[name] = (["sweep", str(path), "--dry-run"], words)
    return cases


def test_every_hostile_file_is_refused_by_the_cli_within_limits(
    baseline, tiny_model_dir, synth_dir, tmp_path
):
    cases = hostile_commands(tiny_model_dir, synth_dir, tmp_path)
    limit = baseline.data_bytes + MEGABYTES * (1 << 20)
    with ThreadPoolExecutor(2) as pool:  # two at a time: the CI machine has two cores
        outcomes = dict(
            zip(
                cases,
                pool.map(
                    lambda n: run_limited(
                        [sys.executable, "-c", CLI, *cases[n][0]], tmp_path / f"{n}.status", limit
                    ),
                    cases,
                ),
            )
        )
    wrong = {}
    for name, (_, words) in cases.items():
        o = outcomes[name]
        lines = o.stderr.strip().splitlines()
        if not (
            o.code == 2
            and len(lines) == 1
            and words in lines[0]
            and o.rss_mb < MEGABYTES
            and o.cpu_s < SECONDS + baseline.cpu_s
            and o.wall_s < SECONDS + WALL_ALLOWANCE * baseline.wall_s
        ):
            wrong[name] = {**o.__dict__, "stderr": o.stderr[-600:]}
    assert not wrong, json.dumps({"baseline": baseline.__dict__, "limit": limit, "wrong": wrong}, indent=1)


def test_a_good_model_still_evaluates_under_the_same_limit(baseline, tiny_model_dir, synth_dir, tmp_path):
    """The limit leaves room for real work: without it the test above could pass by starving everything."""
    limit = baseline.data_bytes + MEGABYTES * (1 << 20)
    argv = [
        "eval",
        "--model",
        str(tiny_model_dir),
        "--data",
        str(synth_dir),
        "--threads",
        "1",
        "--max-users",
        "5",
    ]
    o = run_limited([sys.executable, "-c", CLI, *argv], tmp_path / "status", limit)
    assert o.code == 0, o.stderr[-2000:]
