"""Ray Tune sweeps over decoder parameters: `genrec sweep EXPERIMENT.yaml`.

One trial = one (decoder params, seed) point. It loads the checkpoint, the dataset and an optional
draft model (AtSpeed's `draft:`) once (cached per worker process, so a reused actor does not load them
again), evaluates the decoder with `genrec.workloads.evaluation.evaluate`, and reports the flat result
row of DESIGN.md: numbers as Tune metrics plus the whole row as JSON under `genrec_row`.

This package's `__init__` is the driver: `run_sweep` holds the experiment's lock and
`_run_sweep_locked` runs the steps in order, each a named function. The steps are called through this
module's names (tests replace plan_storage, ensure_model, preflight, init_ray, ray and tune here), so
keep those calls in this module. The rest lives in the package:

    trial.py       the trial in a Ray worker (`run_trial`) and the config it gets (`param_space`)
    callbacks.py   the driver's Tune callbacks: each row to Parquet (progress line) and MLflow
    resume.py      fresh sweep or --resume (`plan_storage`), Tune state dir, fingerprint stamp
    ray_start.py   which Ray, starting it, per-trial resources, concurrent slots
    parent_run.py  the sweep's MLflow parent run: opened, KILLED on Ctrl-C, finished
    interrupt.py   noticing the Ctrl-C that Tune swallows (`SweepInterrupted`); SIGTERM / SIGHUP alike
    results.py     `SweepSummary`, counting the stored rows, best configuration, report

Each name is imported from the module that defines it. Tune's saved
state (`tuner.pkl`) pickles the callbacks by their module path (`genrec.platform.sweep.callbacks`):
moving them breaks `--resume` of a sweep started before the move, so the path they had before this
package existed (`genrec.platform.sweep_callbacks`) is kept as an alias. The trainable is saved only
by its name (`run_trial`, checked when `make_tuner` restores it), so that name must stay.

Exactly once, also across a killed driver and `--resume`:

* The run id of a trial's row is `<experiment>-<Tune trial id>`. Tune keeps trial ids when it
  restores an experiment (`resume_unfinished` / `resume_errored` both RESUME, never RESTART, which
  would mint new ids), so a trial that runs again writes the same run id.
* Rows are written by the driver, in Tune callbacks, when the trial's result arrives: Parquet via
  `write_result_row` (atomic, one file per run id, a rewrite replaces it), then MLflow via
  `MlflowStore.log_row` (looks the run id up by tag; keeps an identical FINISHED run, deletes
  stale, duplicate or half-written ones). A trial that Tune re-runs after a restore (the driver
  died after the row was written but before Tune's experiment state recorded the trial as
  finished) finds its row in Parquet and reports it back without evaluating again.
* Parquet is the source of truth: before a resumed sweep starts and after every sweep the driver
  reconciles MLflow from it (`MlflowStore.sync_from_parquet`), which repairs a driver killed
  between the two writes.

Why not Ray's `MLflowLoggerCallback` as is: it opens an MLflow run when a trial starts and keeps the
trial -> run map in driver memory, so a driver killed mid-sweep leaves RUNNING runs behind and the
resumed driver opens a second run for every re-run trial. `GenrecMLflowCallback` subclasses it (its
`setup` connects to the store and resolves the experiment) but logs one run per finished row,
idempotent by the `genrec.run_id` tag.

Timing: each trial measures its own wall time from entering the trial function to its result
(model loading included) as `trial_wall_s`. The sweep prints the trials' own time ratio

    sum(trial_wall_s of trials evaluated in this invocation) / (sweep wall time x concurrent slots)

where the sweep wall time runs from just before Ray starts (after validation and an optional
training step) until the last row is written, and slots = how many trials the resources let run at
once (capped by the number of trials). 1.0 means every slot was busy inside a trial all the time;
the rest is Ray's start, worker start, scheduling and the driver's writes.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import ray
from ray import tune

from genrec.platform.benchmark_trial import run_benchmark_trial
from genrec.platform.experiment import ExperimentConfig
from genrec.platform.experiment_checks import check_trial_capabilities
from genrec.platform.sweep import callbacks as _callbacks
from genrec.platform.sweep.callbacks import make_callbacks
from genrec.platform.sweep.interrupt import fit_noticing_interrupt
from genrec.platform.sweep.parent_run import (
    killed_when_interrupted,
    log_parent_run,
    open_parent_run,
    open_store,
)
from genrec.platform.sweep.ray_start import (
    TrialResources,
    check_trial_resources,
    concurrent_slots,
    init_ray,
    resolve_ray_address,
    trial_device,
    trial_resources,
)
from genrec.platform.sweep.reachability import sweep_destinations
from genrec.platform.sweep.results import SweepSummary, build_report_hook, collect_results
from genrec.platform.sweep.resume import (
    clear_experiment,
    plan_storage,
    stamp_fingerprint,
    stored_run_ids,
    tune_state_dir,
)
from genrec.platform.sweep.trial import param_space, run_trial
from genrec.platform.tracking import ExperimentLock

# Tune state saved before the package existed names the callbacks' old module (see the docstring)
sys.modules.setdefault("genrec.platform.sweep_callbacks", _callbacks)

__all__ = ["ensure_model", "fresh_tuner", "make_tuner", "preflight", "run_sweep", "start_line", "start_ray"]

log = logging.getLogger(__name__)


def run_sweep(
    cfg: ExperimentConfig,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    ray_address: str | None = None,
    resume_hint: str = "",
) -> SweepSummary:
    """Run (or resume) the sweep holding the experiment's lock, so a second sweep of the same
    experiment exits with a message instead of mixing its rows with this one's."""
    sweep_destinations(cfg, resolve_ray_address(cfg, ray_address))  # one line each, before any write
    lock = ExperimentLock(cfg.results_dir, cfg.name).acquire(resume_hint)  # before anything is written
    try:
        return _run_sweep_locked(cfg, resume, overwrite, progress, ray_address)
    finally:
        lock.release()


def _run_sweep_locked(
    cfg: ExperimentConfig, resume: bool, overwrite: bool, progress: bool, ray_address: str | None
) -> SweepSummary:
    wall_clock_start = time.time()  # rows of trials started before this are from an earlier invocation
    summary = SweepSummary(cfg.name, trials_total=cfg.num_trials())
    restore = plan_storage(cfg, resume, overwrite)  # refuses before anything is written
    summary.resumed = restore
    ensure_model(cfg, progress)
    preflight(cfg, ray_address)
    t_start = time.perf_counter()  # the sweep's wall time: from here (Ray's start included) to the last row
    resources = start_ray(cfg, ray_address, progress)
    if not restore:
        clear_experiment(cfg)
    rows_before = stored_run_ids(cfg)
    store = open_store(cfg)  # the store, the experiment and the sweep's run exist before any trial starts
    # from here a Ctrl-C ends the sweep's MLflow run KILLED (it was opened RUNNING)
    with killed_when_interrupted(store):
        if store is not None:
            open_parent_run(store, cfg, restore, overwrite, summary)
        tuner = make_tuner(cfg, resources, restore, progress)
        to_run = max(1, summary.trials_total - len(rows_before))
        summary.slots = concurrent_slots(resources, cfg.max_concurrent, to_run)
        if progress:
            print(start_line(summary, resources, len(rows_before)), flush=True)
        results = fit_noticing_interrupt(tuner, cfg.name)  # raises SweepInterrupted on Tune's Ctrl-C
        rows = collect_results(summary, cfg, results, rows_before, wall_clock_start)
        if store is not None:
            store.sync_from_parquet(cfg.results_dir)  # repairs anything a callback could not write
        summary.wall_s = time.perf_counter() - t_start
        summary.report = build_report_hook(cfg, summary) if cfg.tracking.report else None
        if store is not None:
            log_parent_run(store, cfg, summary, resources, rows)
        return summary


# ---- the driver's steps before Tune runs --------------------------------------------------------
def ensure_model(cfg: ExperimentConfig, progress: bool) -> None:
    """Train the checkpoint of a `model: {train: ...}` experiment unless it already exists."""
    t = cfg.model.train
    if t is None or ((t.out / "config.json").is_file() and (t.out / "model.safetensors").is_file()):
        return
    from genrec.workloads.training.trainer import train

    if progress:
        print(f"training {t.size} on {cfg.dataset.path} -> {t.out}", flush=True)
    train(cfg.dataset.path, t.out, t.to_train_config(), progress=progress)


def preflight(cfg: ExperimentConfig, ray_address: str | None = None) -> None:
    """Load the checkpoint, the dataset and the draft once in the driver, on the CPU, before Ray
    starts: a corrupt or mismatched file fails here with one message naming it, not in every trial."""
    if cfg.benchmark is not None:
        return
    from genrec.platform.commands.common import check_device
    from genrec.workloads.evaluation import load_context

    local = resolve_ray_address(cfg, ray_address) == "local"
    if local:  # a cluster's GPUs are not this machine's
        check_device(cfg.eval.device, "`eval.device`")
    ctx, _, _ = load_context(cfg.model.path, cfg.dataset.path, "cpu", draft_dir=cfg.draft)
    # what the trials' device can run (a cluster's is known only when the file says cpu)
    device = cfg.eval.device if local or cfg.eval.device == "cpu" else None
    check_trial_capabilities(cfg, device, ctx.codec.levels)


def start_ray(cfg: ExperimentConfig, ray_address: str | None, progress: bool) -> TrialResources:
    """Start or join Ray and size a trial against it; a trial that cannot fit a fixed local instance
    exits 2 here (a cluster may grow with its autoscaler, so only a local instance is checked)."""
    address = resolve_ray_address(cfg, ray_address)
    init_ray(cfg, address, progress)
    resources = trial_resources(cfg, ray.cluster_resources())
    if address == "local":
        check_trial_resources(resources.cpu, resources.gpu, resources.cluster_cpu, resources.cluster_gpu)
    return resources


# ---- Tune ---------------------------------------------------------------------------------------
def make_tuner(cfg: ExperimentConfig, resources: TrialResources, restore: bool, progress: bool) -> tune.Tuner:
    """Tune's saved state restored (unfinished and errored trials RESUME, keeping their trial ids and so
    their run ids), or a fresh Tuner over the experiment's param space."""
    trial_fn = run_trial if cfg.benchmark is None else run_benchmark_trial  # benchmark: no model or data
    trainable = tune.with_resources(trial_fn, {"cpu": resources.cpu, "gpu": resources.gpu})

    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")  # save Tune's experiment state often
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no Tune tables; we print rows
    if restore:
        # Tune re-reads per-trial result files it is not configured to keep; its warning is noise
        logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
        return tune.Tuner.restore(
            str(tune_state_dir(cfg)), trainable=trainable, resume_unfinished=True, resume_errored=True
        )
    stamp_fingerprint(cfg)  # what --resume must find unchanged
    return fresh_tuner(cfg, trainable, resources, progress)


def fresh_tuner(cfg: ExperimentConfig, trainable, resources: TrialResources, progress: bool) -> tune.Tuner:
    """A new Tuner: the trials' param space, the search settings, and the callbacks that store rows."""
    device = trial_device(cfg.eval.device, resources.gpu)
    return tune.Tuner(
        trainable,
        param_space=param_space(cfg, resources.cpu, device),
        tune_config=tune.TuneConfig(
            metric=cfg.metric,
            mode=cfg.mode,
            num_samples=cfg.num_samples,
            max_concurrent_trials=cfg.max_concurrent or None,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=cfg.name,
            storage_path=str(cfg.storage_path),
            failure_config=tune.FailureConfig(max_failures=cfg.max_failures),
            callbacks=make_callbacks(cfg, progress),
            verbose=0,
        ),
    )


def start_line(summary: SweepSummary, resources: TrialResources, done_before: int) -> str:
    """The line printed before `fit`: trials, how many are done, per-trial resources, slots."""
    return (
        f"sweep {summary.experiment}: {summary.trials_total} trials ({done_before} already done), "
        f"{resources.cpu:g} CPU / {resources.gpu:g} GPU per trial, up to {summary.slots} at once"
    )
