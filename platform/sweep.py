"""Ray Tune sweeps over decoder parameters: `genrec sweep EXPERIMENT.yaml`.

One trial = one (decoder params, seed) point. It loads the checkpoint, the dataset and an optional
draft model (AtSpeed's `draft:`) once (cached per worker process, so a reused actor does not load them
again), evaluates the decoder with `genrec.workloads.evaluation.evaluate`, and reports the flat result
row of DESIGN.md: numbers as Tune metrics plus the whole row as JSON under `genrec_row`.

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

import inspect
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.air.integrations.mlflow import MLflowLoggerCallback

from genrec.platform.actors import cached_host
from genrec.platform.benchmark_trial import run_benchmark_trial
from genrec.platform.experiment import ExperimentConfig, TrialSpec
from genrec.platform.tracking import (
    ExperimentLock,
    MlflowStore,
    delete_rows,
    parquet_root,
    read_row,
    read_rows,
    write_result_row,
)
from genrec.workloads.errors import UserInputError

log = logging.getLogger(__name__)

ROW_KEY = "genrec_row"  # the result row as JSON in a trial's Tune result
SPEC_KEY = "genrec"  # the constant part of the param space: the experiment's TrialSpec
FINGERPRINT_FILE = "genrec_experiment.json"
AUTO_GPU_FRACTION = 0.25  # resources.gpu: auto -> this share of a GPU per trial when GPUs exist


@dataclass
class SweepSummary:
    experiment: str
    trials_total: int = 0
    trials_done: int = 0  # with a result row (this invocation or before)
    trials_failed: int = 0
    trials_ran: int = 0  # evaluated in this invocation
    trials_reused: int = 0  # finished before this invocation (resume)
    wall_s: float = 0.0
    trial_s_sum: float = 0.0
    slots: int = 1
    parquet_dir: Path | None = None
    mlflow_uri: str | None = None
    report: Path | None = None
    best: dict[str, Any] = field(default_factory=dict)
    resumed: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def own_time_ratio(self) -> float:
        return self.trial_s_sum / (self.wall_s * self.slots) if self.wall_s > 0 else 0.0

    def lines(self) -> list[str]:
        out = [
            f"sweep {self.experiment}{' (resumed)' if self.resumed else ''}: "
            f"{self.trials_done}/{self.trials_total} trials done, {self.trials_failed} failed "
            f"({self.trials_ran} evaluated now, {self.trials_reused} finished earlier)",
            f"wall time {self.wall_s:.1f} s; trials' own time {self.trial_s_sum:.1f} s over {self.slots} "
            f"concurrent slot(s)",
            f"trials' own time ratio {self.own_time_ratio:.2f} "
            "(sum of trial wall times / (sweep wall time x concurrent slots))",
        ]
        if self.best:
            out.append(f"best: {self.best}")
        if self.parquet_dir:
            out.append(f"result rows: {self.parquet_dir}  (genrec runs --experiment {self.experiment})")
        if self.mlflow_uri:
            if self.mlflow_uri.startswith("sqlite:"):
                out.append(f"mlflow: mlflow ui --backend-store-uri {self.mlflow_uri}")
            else:
                out.append(f"mlflow: {self.mlflow_uri}")
        if self.report:
            out.append(f"report: {self.report}")
        return out + self.notes


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

    params = spec.decoder_params(config.get("params", {}))  # typed like `genrec eval --param`
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
    )
    draft_name = model_label(spec.draft) if spec.draft else ""
    row = evaluate(
        host.context, host.ds, cfg, model_label(spec.model), progress=False, draft_name=draft_name
    ).row
    row.run_id = run_id
    flat = row.to_flat()
    flat["trial_load_s"] = load_s
    report_trial_row(flat, trial_id, started, t0)


# ---- driver-side callbacks ----------------------------------------------------------------------
class ParquetRowCallback(tune.Callback):
    """Writes each trial's row to Parquet as soon as it arrives; prints a line per trial."""

    def __init__(self, results_dir: str, metric: str, progress: bool) -> None:
        self.results_dir, self.metric, self.progress = results_dir, metric, progress
        self.seen = 0

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if ROW_KEY not in result:
            return
        flat = json.loads(result[ROW_KEY])
        write_result_row(self.results_dir, flat)
        self.seen += 1
        if self.progress:
            params = json.loads(flat.get("decoder_params", "{}"))
            shown = ", ".join(f"{k}={v}" for k, v in params.items())
            how = "stored row" if result.get("genrec_reused") else f"{flat.get('trial_wall_s', 0):.1f} s"
            print(
                f"[{self.seen}] {trial.trial_id}: {shown} seed={flat.get('seed')} "
                f"{self.metric}={flat.get(self.metric, float('nan')):.4f} ({how})",
                flush=True,
            )

    def on_trial_error(self, iteration, trials, trial, **info):
        if self.progress:
            print(f"trial {trial.trial_id} failed: see {trial.path}/error.txt", flush=True)


class GenrecMLflowCallback(MLflowLoggerCallback):
    """Ray's MLflow logger callback, made exactly-once: no run is opened when a trial starts; a
    finished trial's row is logged by `MlflowStore.log_row`, idempotent by the row's run id."""

    def __init__(self, tracking_uri: str, experiment_name: str, artifact_location: str | None) -> None:
        super().__init__(tracking_uri=tracking_uri, experiment_name=experiment_name)
        self.artifact_location = artifact_location
        self.store: MlflowStore | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["store"] = None  # a live client does not belong in Tune's pickled state
        return state

    def setup(self, *args, **kwargs):
        super().setup(*args, **kwargs)
        self.store = MlflowStore(self.tracking_uri, self.experiment_name, self.artifact_location)

    def log_trial_start(self, trial):
        pass  # the parent opens a run here; a driver killed later would leave it RUNNING

    def log_trial_result(self, iteration, trial, result):
        if ROW_KEY in result and self.store is not None:
            self.store.log_row(json.loads(result[ROW_KEY]))

    def log_trial_end(self, trial, failed=False):
        pass  # runs are complete when logged; failed trials have no row (and no run)


def make_callbacks(cfg: ExperimentConfig, progress: bool) -> list:
    callbacks: list = [ParquetRowCallback(str(cfg.results_dir), cfg.metric, progress)]
    if cfg.tracking.mlflow:
        callbacks.append(GenrecMLflowCallback(cfg.mlflow_uri, cfg.name, cfg.artifact_location))
    return callbacks


# ---- the driver ---------------------------------------------------------------------------------
def param_space(cfg: ExperimentConfig, cpu: float, device: str) -> dict:
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
    return {"params": space, "seed": tune.grid_search(list(cfg.seeds)), SPEC_KEY: cfg.trial_spec(cpu, device)}


def resolve_ray_address(cfg: ExperimentConfig, override: str | None = None) -> str:
    """--ray-address, then the experiment's ray.address, then RAY_ADDRESS, else a new local instance
    (never silently joining some other local cluster found in /tmp/ray)."""
    return override or cfg.ray.address or os.environ.get("RAY_ADDRESS") or "local"


def init_ray(cfg: ExperimentConfig, address: str) -> bool:
    """Start or join Ray unless this process already did; True if this call started it."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if address == "local":
        kwargs["num_cpus"] = cfg.ray.num_cpus
        # trial output stays in Ray's logs (a failed trial's traceback is in its error.txt); the
        # driver prints one line per trial instead of workers' shutdown noise
        kwargs["log_to_driver"] = False
    ray.init(address=address, **kwargs)
    return True


def ensure_model(cfg: ExperimentConfig, progress: bool) -> None:
    """Train the checkpoint of a `model: {train: ...}` experiment unless it already exists."""
    t = cfg.model.train
    if t is None or ((t.out / "config.json").is_file() and (t.out / "model.safetensors").is_file()):
        return
    from genrec.workloads.training.trainer import train

    if progress:
        print(f"training {t.size} on {cfg.dataset.path} -> {t.out}", flush=True)
    train(cfg.dataset.path, t.out, t.to_train_config(), progress=progress)


def plan_storage(cfg: ExperimentConfig, resume: bool, overwrite: bool) -> bool:
    """Decide between a fresh sweep and a resumed one (no side effects); True = restore Tune's state.

    A fresh sweep over an experiment that already has rows or Tune state needs --overwrite (which
    removes them) so two sweeps never mix; --resume needs Tune state and an unchanged experiment.
    """
    exp_dir = cfg.storage_path / cfg.name
    restorable = tune.Tuner.can_restore(str(exp_dir))
    rows = read_rows(cfg.results_dir, cfg.name)
    if resume and not overwrite:
        if restorable:
            stamp = exp_dir / FINGERPRINT_FILE
            if stamp.is_file() and stamp.read_text() != cfg.fingerprint():
                raise UserInputError(
                    f"experiment {cfg.name!r} changed since its sweep started (search space, seeds, decoder "
                    f"or eval settings); Tune cannot resume a changed sweep: restore the file, or start "
                    "over with --overwrite"
                )
            return True
        if rows:
            raise UserInputError(
                f"--resume: no Tune state at {exp_dir} to resume, but {len(rows)} result rows of "
                f"{cfg.name!r} exist; start over with --overwrite"
            )
        return False  # nothing to resume: a fresh sweep
    if (restorable or rows) and not overwrite:
        raise UserInputError(
            f"experiment {cfg.name!r} already has a sweep ({len(rows)} result rows, Tune state at "
            f"{exp_dir}); "
            "pass --resume to finish it, or --overwrite to delete its rows and runs and start over"
        )
    return False


def clear_experiment(cfg: ExperimentConfig) -> None:
    """Remove an experiment's Tune state and Parquet rows (a fresh sweep; MLflow runs separately)."""
    exp_dir = cfg.storage_path / cfg.name
    if exp_dir.exists():
        shutil.rmtree(exp_dir)
    delete_rows(cfg.results_dir, cfg.name)


class SweepInterrupted(Exception):
    """Ctrl-C (SIGINT) stopped the sweep; the rows written so far are kept for `--resume`."""


class _TuneInterruptWatch(logging.Filter):
    """Tune catches the first SIGINT itself, saves its state and returns from `fit()` as if done,
    logging a `Tuner.restore(...)` hint. This filter notices that record (so the sweep can say it was
    interrupted and exit 130) and drops it: genrec's own resume command is printed instead."""

    MARKERS = ("Stop signal received", "has been interrupted", "Tuner.restore(")

    def __init__(self) -> None:
        super().__init__()
        self.interrupted = False

    def filter(self, record: logging.LogRecord) -> bool:
        if any(m in record.getMessage() for m in self.MARKERS):
            self.interrupted = True
            return False
        return True


def preflight(cfg: ExperimentConfig, ray_address: str | None = None) -> None:
    """Load the checkpoint, the dataset and the draft once in the driver, on the CPU, before Ray
    starts: a corrupt or mismatched file fails here with one message naming it, not in every trial."""
    if cfg.benchmark is not None:
        return
    from genrec.platform.commands.common import check_device
    from genrec.workloads.evaluation import load_context

    if resolve_ray_address(cfg, ray_address) == "local":  # a cluster's GPUs are not this machine's
        check_device(cfg.eval.device, "`eval.device`")
    load_context(cfg.model.path, cfg.dataset.path, "cpu", draft_dir=cfg.draft)


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
    lock = ExperimentLock(cfg.results_dir, cfg.name).acquire(resume_hint)  # before anything is written
    try:
        return _run_sweep_locked(cfg, resume, overwrite, progress, ray_address)
    finally:
        lock.release()


def _run_sweep_locked(
    cfg: ExperimentConfig, resume: bool, overwrite: bool, progress: bool, ray_address: str | None
) -> SweepSummary:
    wall_clock_start = time.time()
    summary = SweepSummary(cfg.name, trials_total=cfg.num_trials())
    restore = plan_storage(cfg, resume, overwrite)  # refuses before anything is written
    summary.resumed = restore
    ensure_model(cfg, progress)
    preflight(cfg, ray_address)
    t_start = time.perf_counter()  # the sweep's wall time: from here (Ray's start included) to the last row

    address = resolve_ray_address(cfg, ray_address)
    init_ray(cfg, address)
    cluster = ray.cluster_resources()
    gpu = cfg.resources.gpu
    if gpu == "auto":  # GPUs up when the sweep starts (an autoscaling cluster: set resources.gpu)
        gpu = AUTO_GPU_FRACTION if cluster.get("GPU", 0) > 0 else 0.0
    cpu = cfg.resources.cpu
    if address == "local" and (cluster.get("CPU", 0) < cpu or (gpu and cluster.get("GPU", 0) < gpu)):
        raise UserInputError(  # a fixed local instance can never run such a trial
            f"`resources`: a trial asks for {cpu} CPU / {gpu} GPU but this machine's Ray has "
            f"{cluster.get('CPU', 0)} CPU / {cluster.get('GPU', 0)} GPU; lower resources.cpu or resources.gpu"
        )

    if not restore:
        clear_experiment(cfg)
    rows_before = {r["run_id"] for r in read_rows(cfg.results_dir, cfg.name)}
    store = None
    if cfg.tracking.mlflow:  # the store and experiment exist before any trial starts
        store = MlflowStore(cfg.mlflow_uri, cfg.name, cfg.artifact_location)
        if overwrite:
            store.delete_all()
        store.sync_from_parquet(cfg.results_dir)
        summary.mlflow_uri = cfg.mlflow_uri
    device = cfg.eval.device if cfg.eval.device != "auto" else ("cuda" if gpu else "cpu")
    trial_fn = run_trial if cfg.benchmark is None else run_benchmark_trial  # benchmark: no model or data
    trainable = tune.with_resources(trial_fn, {"cpu": cpu, "gpu": gpu})

    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")  # save Tune's experiment state often
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no Tune tables; we print rows
    exp_dir = cfg.storage_path / cfg.name
    if restore:
        # Tune re-reads per-trial result files it is not configured to keep; its warning is noise
        logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
        tuner = tune.Tuner.restore(
            str(exp_dir), trainable=trainable, resume_unfinished=True, resume_errored=True
        )
    else:
        exp_dir.mkdir(parents=True, exist_ok=True)
        (exp_dir / FINGERPRINT_FILE).write_text(cfg.fingerprint())
        tuner = tune.Tuner(
            trainable,
            param_space=param_space(cfg, cpu, device),
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
    cpu_slots = math.floor(cluster.get("CPU", 0) / cpu + 1e-9)
    gpu_slots = math.floor(cluster.get("GPU", 0) / gpu + 1e-9) if gpu else cpu_slots
    to_run = max(1, summary.trials_total - len(rows_before))
    summary.slots = max(1, min(cpu_slots, gpu_slots, cfg.max_concurrent or cpu_slots, to_run))
    if progress:
        print(
            f"sweep {cfg.name}: {summary.trials_total} trials ({len(rows_before)} already done), "
            f"{cpu} CPU / {gpu} GPU per trial, up to {summary.slots} at once",
            flush=True,
        )

    watch = _TuneInterruptWatch()
    tune_log = logging.getLogger("ray.tune.tune")
    tune_log.addFilter(watch)
    try:
        results = tuner.fit()
    finally:
        tune_log.removeFilter(watch)
    if watch.interrupted:
        raise SweepInterrupted(cfg.name)

    rows = {r["run_id"]: r for r in read_rows(cfg.results_dir, cfg.name)}
    for result in results:
        if result.error is not None:
            summary.trials_failed += 1
    summary.trials_done = len(rows)
    for run_id, row in rows.items():
        if run_id in rows_before or row.get("trial_started_at", 0) < wall_clock_start:
            summary.trials_reused += 1
        else:
            summary.trials_ran += 1
            summary.trial_s_sum += float(row.get("trial_wall_s", 0.0))
    if rows:
        sign = 1 if cfg.mode == "max" else -1
        best = max(rows.values(), key=lambda r: sign * float(r.get(cfg.metric, float("nan")) or 0))
        summary.best = {
            cfg.metric: round(float(best.get(cfg.metric, float("nan"))), 4),
            **json.loads(best.get("decoder_params", "{}")),
            "seed": best.get("seed"),
        }
    summary.parquet_dir = parquet_root(cfg.results_dir) / f"experiment={cfg.name}"
    if store is not None:
        store.sync_from_parquet(cfg.results_dir)  # repairs anything a callback could not write
    summary.wall_s = time.perf_counter() - t_start

    report = build_report_hook(cfg, summary) if cfg.tracking.report else None
    summary.report = report
    if store is not None:
        store.log_sweep(
            metrics={
                "trials_done": summary.trials_done,
                "trials_failed": summary.trials_failed,
                "wall_s": summary.wall_s,
                "trial_s_sum": summary.trial_s_sum,
                "own_time_ratio": summary.own_time_ratio,
            },
            params={
                "decoder": cfg.decoder,
                "trials": summary.trials_total,
                "metric": cfg.metric,
                "mode": cfg.mode,
                "cpu_per_trial": cpu,
                "gpu_per_trial": gpu,
            },
            artifacts=[p for p in (cfg.source, report) if p is not None],
            tags={"genrec.experiment_file": str(cfg.source or "")},
        )
    return summary


def build_report_hook(cfg: ExperimentConfig, summary: SweepSummary) -> Path | None:
    """Build the Plotly report with `genrec.dashboards.report.build_report` when it exists; it is
    logged as an artifact of the experiment-level MLflow run (kind 'sweep'), not of every trial."""
    try:
        from genrec.dashboards.report import build_report
    except ImportError:
        return None
    out = cfg.results_dir / "reports" / f"{cfg.name}.html"
    kwargs = {"metric": cfg.metric} if "metric" in inspect.signature(build_report).parameters else {}
    try:
        built = build_report(cfg.results_dir, cfg.name, out, **kwargs)
    except Exception as e:  # noqa: BLE001 - the rows are written; a report failure must not lose them
        summary.notes.append(f"report not built: {type(e).__name__}: {e}")
        return None
    return Path(built) if built else out
