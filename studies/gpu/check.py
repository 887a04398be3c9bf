"""The one-call GPU check: every pending GPU measurement, in priority order, within one device call.

    python -m genrec.studies.gpu.check --out $OUT                      # on the lent GPU (docs/gpu_runbook.md)
    python -m genrec.studies.gpu.check --out /tmp/gc --device cpu --dry-run   # the CPU dry run CI runs

Each step (studies/gpu/plan.py) runs as its own process under its own timeout, and starts only while the
budget (`--budget-s`, default 8 minutes) still holds its estimate, so a slow early step costs the last,
least important ones, never a silent gap. After every step the runner rewrites, atomically, the three
files the device call brings back (at most 8 may come back):
    $OUT/summary.txt     one line per target: figure, goal, met / not met / why not
    $OUT/gpu_check.json  the same as data, with each step's status, return code and seconds
    $OUT/raw.tar.gz      every step's raw JSON and log
so a timeout of the whole call loses nothing that finished. No Ray, MLflow or network is needed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from genrec.studies.gpu.plan import CheckConfig, Step, Target, plan, targets
from genrec.workloads.errors import UserInputError, run_main
from genrec.workloads.io import atomic_write, atomic_write_text


@dataclass
class StepRun:
    name: str
    status: str  # ok | failed (rc N) | timeout | not run (budget) | not run (needs X) | not built
    seconds: float = 0.0


def run_step(step: Step, cfg: CheckConfig, left_s: float, log: Path) -> StepRun:
    """Run a step's commands in turn, stdout and stderr into its log, within min(its timeout, budget)."""
    deadline = time.monotonic() + min(step.timeout_s, left_s)
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if cfg.dry:
        env["TRITON_INTERPRET"] = "1"
    with log.open("a") as out:
        for argv in step.commands:
            out.write(f"$ {' '.join(argv)}\n")
            out.flush()
            try:
                rc = subprocess.run(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    timeout=max(1.0, deadline - time.monotonic()),
                ).returncode
            except subprocess.TimeoutExpired:
                return StepRun(step.name, "timeout", time.monotonic() - t0)
            if rc != 0:
                return StepRun(step.name, f"failed (rc {rc})", time.monotonic() - t0)
    return StepRun(step.name, "ok", time.monotonic() - t0)


def target_line(t: Target, runs: dict[str, StepRun], cfg: CheckConfig) -> dict:
    """The figure and verdict of one target; a figure is read only from a step that succeeded."""
    run = runs.get(t.step)
    row = {"target": t.label, "goal": t.goal, "figure": None}
    if run is None or run.status != "ok":
        row["status"] = (
            run.status
            if run and run.status.startswith("not")
            else f"not run ({run.status})"
            if run
            else "not run"
        )
        return row
    try:
        row["figure"] = t.read(cfg.raw(t.source))
    except (OSError, KeyError, ValueError, TypeError) as e:  # a renamed field or missing file: say so
        row["status"] = f"unreadable ({type(e).__name__}: {e})"
        return row
    if row["figure"] is None:
        row["status"] = "n/a on cpu" if t.cuda_only and cfg.device != "cuda" else "no figure in the output"
    else:
        row["status"] = "met" if row["figure"] >= t.goal else "not met"
    return row


def summary_text(lines: list[dict], runs: dict[str, StepRun], device: str) -> str:
    out = [f"genrec GPU check on {device}"]
    out += [f"  step {r.name:16s} {r.status:20s} {r.seconds:6.1f} s" for r in runs.values()]
    for row in lines:
        fig = "-" if row["figure"] is None else f"{row['figure']:.3g}"
        out.append(f"  {row['status']:24s} {fig:>8s}  {row['target']}")
    return "\n".join(out) + "\n"


def write_outputs(out: Path, cfg: CheckConfig, runs: dict[str, StepRun], device: str) -> str:
    lines = [target_line(t, runs, cfg) for t in targets()]
    text = summary_text(lines, runs, device)
    atomic_write_text(out / "summary.txt", text)
    record = {"device": device, "steps": [asdict(r) for r in runs.values()], "targets": lines}
    atomic_write_text(out / "gpu_check.json", json.dumps(record, indent=1))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(cfg.work / "raw", arcname="raw")
    atomic_write(out / "raw.tar.gz", lambda tmp: tmp.write_bytes(buf.getvalue()))
    return text


def device_name(device: str) -> str:
    import torch  # noqa: PLC0415 - only once the steps are planned

    if device == "cuda":
        if not torch.cuda.is_available():
            raise UserInputError(
                "--device cuda: no CUDA device here; pass --device cpu --dry-run for a dry run"
            )
        return f"cuda:{torch.cuda.get_device_name(0)}"
    return f"{device} (dry run)" if device == "cpu" else device


def execute(cfg: CheckConfig, out: Path, budget_s: float, only: set[str] | None) -> dict[str, StepRun]:
    device = device_name(cfg.device)
    (cfg.work / "raw").mkdir(parents=True, exist_ok=True)
    start, runs = time.monotonic(), {}
    for step in plan(cfg):
        left = budget_s - (time.monotonic() - start)
        missing = [n for n in step.needs if runs.get(n) is None or runs[n].status != "ok"]
        if only is not None and step.name not in only:
            continue
        if not step.built:
            runs[step.name] = StepRun(step.name, "not built")
        elif missing:
            runs[step.name] = StepRun(step.name, f"not run (needs {', '.join(missing)})")
        elif left < step.estimate_s:
            runs[step.name] = StepRun(step.name, "not run (budget)")
        else:
            runs[step.name] = run_step(step, cfg, left, cfg.raw(step.name).with_suffix(".log"))
        run = runs[step.name]
        print(
            f"[{time.monotonic() - start:5.0f} s] {step.name}: {run.status} ({run.seconds:.1f} s)", flush=True
        )
        write_outputs(out, cfg, runs, device)
    print(write_outputs(out, cfg, runs, device), flush=True)
    return runs


def with_needs(cfg: CheckConfig, only: list[str] | None) -> set[str] | None:
    """The steps `--only` names plus the steps they need; unknown names are refused."""
    if only is None:
        return None
    steps = {s.name: s for s in plan(cfg)}
    unknown = sorted(set(only) - set(steps))
    if unknown:
        raise UserInputError(f"--only: unknown steps {unknown}; choose from {list(steps)}")
    return set(only) | {n for name in only for n in steps[name].needs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="the three result files go here ($OUT)")
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temporary one)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dry-run", action="store_true", help="tiny shapes, Triton under its interpreter")
    p.add_argument("--budget-s", type=float, default=480.0, help="steps start only while this holds them")
    p.add_argument("--only", nargs="+", default=None, help="run just these steps (with what they need)")
    a = p.parse_args(argv)
    if a.device == "cpu" and not a.dry_run:
        raise UserInputError("--device cpu measures nothing the GPU targets mean: add --dry-run")
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.work or Path(tempfile.mkdtemp(prefix="genrec_gpu_check_"))
    cfg = CheckConfig(work=work, device=a.device, dry=a.dry_run)
    runs = execute(cfg, a.out, a.budget_s, with_needs(cfg, a.only))
    return 0 if all(r.status == "ok" or r.status.startswith("not") for r in runs.values()) else 1


if __name__ == "__main__":
    run_main(main)
