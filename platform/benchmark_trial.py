"""The Tune trial of a `benchmark:` experiment: call one registered benchmark and report its result row.

Same conventions as `sweep.run_trial`, so the driver's Parquet and MLflow callbacks store the row
unchanged: run id `<experiment>-<Tune trial id>`, the flat row as JSON under ROW_KEY beside its
numeric columns, and a row already in Parquet (a trial Tune re-runs after a driver restart) reported
back without running again. The row has the shared columns (experiment, run_id, decoder =
"benchmark:<name>", decoder_params JSON, param_*, seed, environment, trial timings) plus a `benchmark`
column and every scalar the benchmark returned.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from datetime import UTC, datetime

from genrec.workloads.results import RESULT_SCHEMA_VERSION, current_environment


def benchmark_kwargs(job: dict, params: dict, seed: int) -> dict:
    """The benchmark's keyword arguments: the experiment's params, plus seed / threads / device filled
    from the trial where the function takes them and the experiment does not fix them."""
    from genrec.workloads.benchmarks.registry import get_benchmark

    accepted = get_benchmark(job["benchmark"]).parameters()
    kwargs = dict(params)
    filled = {"seed": seed, "threads": job["threads"] or max(1, int(job["cpu"])), "device": job["device"]}
    for name, value in filled.items():
        if name in accepted and name not in kwargs:
            kwargs[name] = value
    return kwargs


def benchmark_row(job: dict, run_id: str, params: dict, seed: int, metrics: dict, device: str) -> dict:
    import torch

    name = job["benchmark"]
    flat: dict = {
        "experiment": job["experiment"],
        "run_id": run_id,
        "benchmark": name,
        "decoder": f"benchmark:{name}",
        "decoder_params": json.dumps(params, sort_keys=True),
        **{f"param_{k}": v for k, v in params.items()},
        # benchmarks that read a dataset or checkpoint name it in their metrics (e.g. nezha_arm)
        "dataset": str(metrics.get("dataset_name", "")),
        "model": str(metrics.get("model", "")),
        "split": "",
        "seed": seed,
        **asdict(current_environment(torch.device(device))),
    }
    for key, value in metrics.items():  # scalars only: one Parquet column each
        if isinstance(value, bool | int | float | str) and key not in flat:
            flat[key] = value
    flat["created_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    flat["schema_version"] = RESULT_SCHEMA_VERSION
    return flat


def run_benchmark_trial(config: dict) -> None:
    """Tune function trainable for `benchmark:` experiments (chosen by run_sweep)."""
    from genrec.platform.sweep import JOB_KEY, begin_trial, report_trial_row
    from genrec.workloads.benchmarks.registry import get_benchmark

    t0 = time.perf_counter()
    started = time.time()
    job = config[JOB_KEY]
    trial_id, run_id, reused = begin_trial(job)
    if reused:
        return

    import torch

    params = {**job["params"], **config.get("params", {})}
    seed = int(config.get("seed", 0))
    kwargs = benchmark_kwargs(job, params, seed)
    torch.set_num_threads(int(kwargs.get("threads") or job["threads"] or max(1, int(job["cpu"]))))
    metrics = get_benchmark(job["benchmark"]).run(**kwargs)
    flat = benchmark_row(job, run_id, params, seed, metrics, str(kwargs.get("device", job["device"])))
    report_trial_row(flat, trial_id, started, t0)
