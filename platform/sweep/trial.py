"""One sweep trial, as Tune runs it in a Ray worker: the config a trial receives and the trainable.

`param_space` lays out a trial's Tune config: the trial's own point (`params`, or a multi-decoder
experiment's `arm`), its `seed`, and under `SPEC_KEY` the experiment's `TrialSpec` (what every trial
shares). `run_trial` reads it back, loads the checkpoint, the dataset and an optional draft once per
worker process (`cached_host`), evaluates the decoder and reports the flat result row: numbers as
Tune metrics plus the whole row as JSON under `ROW_KEY` (the driver's callbacks store it).
`begin_trial` / `report_trial_row` are shared with the benchmark trainable
(genrec.platform.benchmark_trial): a trial whose row is already stored reports it again instead of
running (see genrec.platform.sweep for the exactly-once protocol).
"""

from __future__ import annotations

import json
import time
from typing import Any

from ray import tune

from genrec.platform.actors import cached_host
from genrec.platform.experiment import ExperimentConfig, TrialSpec
from genrec.platform.sweep.callbacks import ROW_KEY
from genrec.platform.tracking import read_row

SPEC_KEY = "genrec"  # the constant part of the param space: the experiment's TrialSpec


# ---- the trial's config (built by the driver) ---------------------------------------------------
def param_space(cfg: ExperimentConfig, cpu: float, device: str) -> dict:
    seeds, spec_ = tune.grid_search(list(cfg.seeds)), cfg.trial_spec(cpu, device)
    if cfg.arms:  # one grid dimension over every arm's (decoder, params) points
        return {"arm": tune.grid_search(cfg.arm_points()), "seed": seeds, SPEC_KEY: spec_}
    space: dict[str, Any] = {}
    for name, spec in cfg.search_space.items():
        kind = spec.kind
        if kind in ("grid", "range"):
            space[name] = tune.grid_search(cfg.grid_values()[name])
        elif kind == "choice":
            space[name] = tune.choice(spec.choice)
        elif kind == "uniform":
            space[name] = tune.uniform(spec.uniform.low, spec.uniform.high)
        elif kind == "loguniform":
            space[name] = tune.loguniform(spec.loguniform.low, spec.loguniform.high)
        elif kind == "randint":
            space[name] = tune.randint(int(spec.randint.low), int(spec.randint.high) + 1)
    return {"params": space, "seed": seeds, SPEC_KEY: spec_}


# ---- the trial (runs in a Ray worker) -----------------------------------------------------------
def numeric_metrics(flat: dict) -> dict[str, float]:
    return {
        k: v
        for k, v in flat.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and v is not None
    }


def begin_trial(spec: TrialSpec) -> tuple[str, str, bool]:
    """(trial id, run id, reused). A trial whose row is already stored finished before the driver
    died: its row is reported again (reused=True) and the trial must not run again."""
    trial_id = tune.get_context().get_trial_id()
    run_id = f"{spec.experiment}-{trial_id}"
    stored = read_row(spec.results_dir, spec.experiment, run_id)
    if stored is not None:
        tune.report({**numeric_metrics(stored), ROW_KEY: json.dumps(stored), "genrec_reused": 1})
    return trial_id, run_id, stored is not None


def report_trial_row(flat: dict, trial_id: str, started: float, t0: float) -> None:
    """Add the trial's own columns to its flat row and report it (the driver's callbacks store it)."""
    flat["ray_trial_id"] = trial_id
    flat["trial_started_at"] = started
    flat["trial_wall_s"] = time.perf_counter() - t0
    tune.report({**numeric_metrics(flat), ROW_KEY: json.dumps(flat), "genrec_reused": 0})


def run_trial(config: dict) -> None:
    """Tune function trainable: evaluate one (params, seed) point and report its result row."""
    t0 = time.perf_counter()
    started = time.time()
    spec: TrialSpec = config[SPEC_KEY]
    trial_id, run_id, reused = begin_trial(spec)
    if reused:
        return

    import torch

    from genrec.workloads.evaluation import EvalConfig, evaluate, model_label

    spec, point = spec.for_trial(config)  # a multi-decoder experiment: the trial's arm
    params = spec.decoder_params(point)  # typed like `genrec eval --param`
    threads = spec.torch_threads
    torch.set_num_threads(threads)
    # loaded once per worker, the draft (AtSpeed) beside the model
    host = cached_host(spec.model, spec.data, spec.device, threads, draft=spec.draft or None)
    load_s = time.perf_counter() - t0
    cfg = EvalConfig(
        decoder=spec.decoder,
        params=params,
        split=spec.split,
        ks=spec.ks,
        batch_size=spec.batch_size,
        warmup_batches=spec.warmup_batches,
        max_users=spec.max_users,
        device=spec.device,
        threads=threads,
        seed=int(config.get("seed", 0)),
        experiment=spec.experiment,
        repeats=spec.repeats,
    )
    draft_name = model_label(spec.draft) if spec.draft else ""
    row = evaluate(
        host.context, host.ds, cfg, model_label(spec.model), progress=False, draft_name=draft_name
    ).row
    row.run_id = run_id
    flat = row.to_flat()
    flat["trial_load_s"] = load_s
    report_trial_row(flat, trial_id, started, t0)
