"""The result row: one schema shared by eval, sweeps, serving load tests and reports.

Nested while it is built (quality, latency, timings, counters, params), flattened to one level of
scalar columns for Parquet and MLflow by `to_flat()`.
"""

from __future__ import annotations

import json
import os
import platform as py_platform
import resource
import shlex
import subprocess
import sys
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch

RESULT_SCHEMA_VERSION = 1


@dataclass
class Environment:
    device: str
    threads: int
    torch_version: str
    triton_version: str
    python_version: str
    git_commit: str
    host: str
    # the machine's 1-minute load average when the row was measured: on a shared machine a timing
    # taken at load 3 on 2 cores is not comparable with one taken idle (reports show it)
    load_1m: float | None = None


def command_line(module: str, argv: list[str] | None = None) -> str:
    """How a `python -m module` run was invoked (argv None: this process's own arguments), for results
    files to record next to their figures."""
    return f"python -m {module} " + shlex.join(sys.argv[1:] if argv is None else argv)


def git_commit(repo: Path | None = None) -> str:
    """HEAD of the checkout this code runs from, with '+dirty' for local changes.

    Outside a git checkout (e.g. a working tree copied to a GPU machine) GENREC_GIT_COMMIT names it.
    """
    if os.environ.get("GENREC_GIT_COMMIT"):
        return os.environ["GENREC_GIT_COMMIT"]
    repo = repo or Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=5
        )
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "-uno"], cwd=repo, capture_output=True, text=True, timeout=5
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu:{py_platform.processor() or py_platform.machine()}"


def current_environment(device: torch.device) -> Environment:
    try:
        import triton  # noqa: PLC0415 - optional, present on GPU machines

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    return Environment(
        device=describe_device(device),
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        triton_version=triton_version,
        python_version=sys.version.split()[0],
        git_commit=git_commit(),
        host=py_platform.node(),
        load_1m=load_average(),
    )


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # not available on this platform
        return None


def benchmark_summary(
    module: str,
    argv: list[str] | None,
    device: torch.device,
    args: object,
    rows: dict,
    out: str | None = None,
    **extra: object,
) -> dict:
    """A benchmark's JSON record: its command line, the environment, `extra` fields, its arguments and
    result rows; written atomically to `out` when given."""
    summary = {
        "command": command_line(module, argv),
        "environment": asdict(current_environment(device)),
        **extra,
        "args": vars(args),
        "rows": rows,
    }
    if out:
        from genrec.workloads.io import atomic_write_text

        atomic_write_text(out, json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def spread_columns(column: str) -> tuple[str, str]:
    """The columns holding a measurement's smallest and largest repeat beside its median: `latency_p50_ms`
    -> (`latency_p50_lo_ms`, `latency_p50_hi_ms`), other columns `X` -> (`X_lo`, `X_hi`). One rule for
    the writers (eval passes, benchmark repeats) and the reports that read them."""
    for unit in ("_ms", "_us", "_s"):
        if column.endswith(unit):
            stem = column[: -len(unit)]
            return f"{stem}_lo{unit}", f"{stem}_hi{unit}"
    return f"{column}_lo", f"{column}_hi"


def median_over_repeats(runs: list[dict]) -> dict:
    """One result from repeated runs of a benchmark: each numeric value's median with its smallest and
    largest run in `spread_columns`; everything else as the first run had it."""
    import numpy as np

    out = dict(runs[0])
    if len(runs) < 2:
        return out
    for key, value in runs[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            values = [float(r[key]) for r in runs if isinstance(r.get(key), int | float)]
            lo, hi = spread_columns(key)
            out[key], out[lo], out[hi] = float(np.median(values)), min(values), max(values)
    out["repeats"] = len(runs)
    return out


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated by torch on CUDA; the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20


@dataclass
class ResultRow:
    decoder: str
    decoder_params: dict
    dataset: str
    model: str
    split: str
    env: Environment
    draft: str = ""  # AtSpeed's draft model (label, like `model`); empty when the run loaded none
    # the model's backbone: family, n_params, dtype, vocab_size (+ architecture for an imported HF model)
    backbone: dict[str, object] = field(default_factory=dict)
    quality: dict[str, float] = field(default_factory=dict)  # hr@K, ndcg@K, recall@K, invalid_rate
    latency_ms: dict[str, float] = field(default_factory=dict)  # per batch: mean, std, p50, p90, p99
    timings_ms: dict[str, float] = field(default_factory=dict)  # mean per batch for each phase
    counters: dict[str, float] = field(default_factory=dict)
    users: int = 0
    batch_size: int = 0
    throughput_users_per_s: float = 0.0
    memory_peak_mb: float = 0.0
    seed: int = 0
    experiment: str = "adhoc"
    repeats: int = 1  # timed passes behind latency_ms (median over passes; _lo/_hi their range)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    schema_version: int = RESULT_SCHEMA_VERSION

    def to_flat(self) -> dict[str, object]:
        d = asdict(self)
        flat: dict[str, object] = {}
        for key, value in d.items():
            if key == "env":
                flat.update(value)
            elif key == "quality":
                flat.update(value)
            elif key == "decoder_params":
                flat["decoder_params"] = json.dumps(value, sort_keys=True)
                flat.update({f"param_{k}": v for k, v in value.items()})
            elif key in ("latency_ms", "timings_ms"):
                prefix = "latency" if key == "latency_ms" else "time"
                flat.update({f"{prefix}_{k}_ms": v for k, v in value.items()})
            elif key == "counters":
                flat.update({f"count_{k}": v for k, v in value.items()})
            elif key == "backbone":
                flat.update({f"backbone_{k}": v for k, v in value.items()})
            else:
                flat[key] = value
        return flat

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)
