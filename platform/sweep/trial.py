"""One sweep trial, as Tune runs it in a Ray worker: the config a trial receives and the trainable.

`param_space` lays out a trial's Tune config: the trial's own point (`params`, or a multi-decoder
experiment's `arm`), its `seed`, and under `SPEC_KEY` the experiment's `TrialSpec` (what every trial
shares). `run_trial` reads it back, loads the checkpoint, the dataset and an optional draft once per
worker process (`cached_host`), evaluates the decoder and reports the flat result row: numbers as
Tune metrics plus the whole row as JSON under `ROW_KEY` (the driver's callbacks store it).
`begin_trial` (-> `TrialRun`, whose `report` stores the row) is shared with the benchmark trainable
(genrec.platform.benchmark_trial): a trial whose row is already stored reports it again instead of
running (see genrec.platform.sweep for the exactly-once protocol).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from ray import tune

from genrec.platform.actors import cached_host
from genrec.platform.experiment import ExperimentConfig, TrialSpec
from genrec.platform.sweep.callbacks import ROW_KEY
from genrec.workloads.results_store import read_row

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


@dataclass(frozen=True)
class TrialRun:
    """One call of a trainable: the shared spec, its ids, and when it started (wall clock for the row,
    perf counter for its duration)."""

    spec: TrialSpec
    trial_id: str
    run_id: str
    started: float
    t0: float

    def report(self, flat: dict) -> None:
        """Add the trial's own columns to its flat row and report it (the driver's callbacks store it)."""
        flat["ray_trial_id"] = self.trial_id
        flat["trial_started_at"] = self.started
        flat["trial_wall_s"] = time.perf_counter() - self.t0
        tune.report({**numeric_metrics(flat), ROW_KEY: json.dumps(flat), "genrec_reused": 0})


def begin_trial(config: dict) -> TrialRun | None:
    """The trial this trainable call runs, or None when its row is already stored: it finished before
    the driver died, so its row is reported again and the trial must not run again."""
    t0, started = time.perf_counter(), time.time()
    spec: TrialSpec = config[SPEC_KEY]
    trial_id = tune.get_context().get_trial_id()
    run_id = f"{spec.experiment}-{trial_id}"
    stored = read_row(spec.results_dir, spec.experiment, run_id)
    if stored is not None:
        tune.report({**numeric_metrics(stored), ROW_KEY: json.dumps(stored), "genrec_reused": 1})
        return None
    return TrialRun(spec, trial_id, run_id, started, t0)


def run_trial(config: dict) -> None:
    """Tune function trainable: evaluate one (params, seed) point and report its result row."""
    trial = begin_trial(config)
    if trial is None:
        return

    import torch

    from genrec.workloads.evaluation import EvalConfig, evaluate, model_label
    from genrec.workloads.per_user import write_per_user

    spec, point = trial.spec.for_trial(config)  # a multi-decoder experiment: the trial's arm
    params = spec.decoder_params(point)  # typed like `genrec eval --param`
    threads = spec.torch_threads
    torch.set_num_threads(threads)
    # loaded once per worker, the draft (AtSpeed) beside the model
    host = cached_host(spec.model, spec.data, spec.device, threads, draft=spec.draft or None)
    load_s = time.perf_counter() - trial.t0
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
    out = evaluate(host.context, host.ds, cfg, model_label(spec.model), progress=False, draft_name=draft_name)
    row = out.row
    row.run_id = trial.run_id
    # per-user outcomes beside the row (written first: a stored row always has its users), so the
    # report can compare two configurations paired on the same users
    write_per_user(spec.results_dir, spec.experiment, trial.run_id, out.per_user())
    flat = row.to_flat()
    flat["trial_load_s"] = load_s
    trial.report(flat)
