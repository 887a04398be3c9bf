"""Run by tests/faults/test_hostile_files.py in a child process: load each hostile file under an address
space limit of what the process already maps + LIMIT_MB (prlimit's RLIMIT_AS, set once the imports are
done), and print one JSON line per case: the error class and first line, seconds, and peak RSS growth.

    python hostile_probe.py CASES.json    (CASES: [[name, kind, path], ...]; kind: checkpoint | dataset |
                                           experiment)
"""

from __future__ import annotations

import json
import resource
import sys
import time

LIMIT_MB = 500


def mapped_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def main() -> None:
    from genrec.platform.experiment_loading import load_experiment
    from genrec.workloads.data.dataset import load_dataset
    from genrec.workloads.models.checkpoint import load_checkpoint

    loaders = {
        "checkpoint": lambda p: load_checkpoint(p, "cpu"),
        "dataset": load_dataset,
        "experiment": lambda p: load_experiment(p, check_files=False),
    }
    cases = json.loads(open(sys.argv[1]).read())
    limit = mapped_bytes() + LIMIT_MB * (1 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for name, kind, path in cases:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
        t0 = time.perf_counter()
        try:
            loaders[kind](path)
            error, message = None, ""
        except BaseException as e:  # noqa: BLE001 - the probe reports whatever happened
            error, message = type(e).__name__, (str(e).splitlines() or [""])[0]
        seconds = time.perf_counter() - t0
        grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        print(
            json.dumps({"name": name, "error": error, "message": message[:300], "s": seconds, "mb": grew_mb})
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
