"""The Tune trial of a `benchmark:` experiment: call one registered benchmark and report its result row.

Same conventions as `sweep.run_trial`, so the driver's Parquet and MLflow callbacks store the row
unchanged: run id `<experiment>-<Tune trial id>`, the flat row as JSON under ROW_KEY beside its
numeric columns, and a row already in Parquet (a trial Tune re-runs after a driver restart) reported
back without running again. The row has the shared columns (experiment, run_id, decoder =
"benchmark:<name>", decoder_params JSON, param_*, seed, environment, trial timings) plus a `benchmark`
column and every scalar the benchmark returned (with `eval.repeats` > 1: the median of the repeated
runs, with the smallest and largest beside it, as `genrec eval` does for latency).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime

from genrec.platform.experiment import TrialSpec
from genrec.workloads.results import RESULT_SCHEMA_VERSION, current_environment, median_over_repeats


def benchmark_kwargs(spec: TrialSpec, params: dict, seed: int) -> dict:
    """The benchmark's keyword arguments: the experiment's params, plus seed / threads / device filled
    from the trial where the function takes them and the experiment does not fix them."""
    from genrec.platform.benchmarks import get_benchmark

    accepted = get_benchmark(spec.benchmark).parameters()
    kwargs = dict(params)
    filled = {"seed": seed, "threads": spec.torch_threads, "device": spec.device}
    for name, value in filled.items():
        if name in accepted and name not in kwargs:
            kwargs[name] = value
    return kwargs


def benchmark_row(spec: TrialSpec, run_id: str, params: dict, seed: int, metrics: dict, device: str) -> dict:
    import torch

    name = spec.benchmark
    flat: dict = {
        "experiment": spec.experiment,
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
    from genrec.platform.benchmarks import get_benchmark
    from genrec.platform.sweep.trial import begin_trial

    trial = begin_trial(config)
    if trial is None:
        return
    spec = trial.spec

    import torch

    params = spec.values(config.get("params", {}))
    seed = int(config.get("seed", 0))
    kwargs = benchmark_kwargs(spec, params, seed)
    torch.set_num_threads(int(kwargs.get("threads") or spec.torch_threads))
    bench = get_benchmark(spec.benchmark)
    # eval.repeats: the whole benchmark again; its numbers become medians with their range beside them
    metrics = median_over_repeats([bench.run(**kwargs) for _ in range(spec.repeats)])
    flat = benchmark_row(spec, trial.run_id, params, seed, metrics, str(kwargs.get("device", spec.device)))
    trial.report(flat)
