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

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import tune

from genrec.platform.actors import cached_host
from genrec.platform.benchmark_trial import run_benchmark_trial
from genrec.platform.experiment import ExperimentConfig, TrialSpec
from genrec.platform.mlflow_store import MlflowStore, best_trial_row
from genrec.platform.sweep_callbacks import ROW_KEY, make_callbacks, run_naming
from genrec.platform.tracking import (
    ExperimentLock,
    delete_rows,
    parquet_root,
    read_row,
    read_rows,
)
from genrec.workloads.errors import UserInputError

log = logging.getLogger(__name__)

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
    mlflow_experiment_id: str | None = None
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
            from genrec.platform.commands.common import command_hint, results_dir_args

            # parquet_dir is RESULTS/parquet/experiment=NAME; a results dir that `genrec runs` would not
            # read by default (from this directory) goes into the hint, so it works as printed
            follow = results_dir_args(self.parquet_dir.parent.parent)
            hint = command_hint("genrec", "runs", "--experiment", self.experiment, *follow)
            out.append(f"result rows: {self.parquet_dir}  ({hint})")
        if self.mlflow_uri:
            # MLflow 3.17's UI opens an experiment on its GenAI overview unless asked for the runs table
            runs = f"#/experiments/{self.mlflow_experiment_id}/runs?workflowType=machine_learning"
            if self.mlflow_uri.startswith("sqlite:"):
                out.append(f"mlflow: mlflow ui --backend-store-uri {self.mlflow_uri}")
                if self.mlflow_experiment_id:
                    out.append(f"        then open http://127.0.0.1:5000/{runs}  (the runs table)")
            else:
                page = runs if self.mlflow_experiment_id else ""
                out.append(f"mlflow: {self.mlflow_uri.rstrip('/')}/{page}")
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


# ---- the driver ---------------------------------------------------------------------------------
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


def resolve_ray_address(cfg: ExperimentConfig, override: str | None = None) -> str:
    """--ray-address, then the experiment's ray.address, then RAY_ADDRESS, else a new local instance
    (never silently joining some other local cluster found in /tmp/ray)."""
    return override or cfg.ray.address or os.environ.get("RAY_ADDRESS") or "local"


def local_cluster(cfg: ExperimentConfig) -> tuple[float, float]:
    """(CPUs, GPUs) a new local Ray instance of this experiment gets: `ray.num_cpus` or the machine's
    CPU count, and the GPUs torch sees. For `--dry-run`, which starts no Ray."""
    cpus = cfg.ray.num_cpus or os.cpu_count() or 1
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:
        gpus = 0
    return float(cpus), float(gpus)


def trial_gpu(requested: float | str, cluster_gpu: float) -> float:
    """resources.gpu as a number: `auto` is a share of a GPU when the cluster has any, else none."""
    if requested == "auto":  # GPUs up when the sweep starts (an autoscaling cluster: set resources.gpu)
        return AUTO_GPU_FRACTION if cluster_gpu > 0 else 0.0
    return float(requested)


def check_trial_resources(cpu: float, gpu: float, cluster_cpu: float, cluster_gpu: float) -> None:
    """A trial that asks for more than a fixed local instance has can never run: exit 2 now. One
    source for the real run (Ray's own numbers) and `--dry-run` (`local_cluster`)."""
    if cluster_cpu < cpu or (gpu and cluster_gpu < gpu):
        raise UserInputError(
            f"`resources`: a trial asks for {cpu:g} CPU / {gpu:g} GPU but this machine's Ray has "
            f"{cluster_cpu:g} CPU / {cluster_gpu:g} GPU; lower resources.cpu or resources.gpu"
        )


def init_ray(cfg: ExperimentConfig, address: str, progress: bool = False) -> bool:
    """Start or join Ray unless this process already did; True if this call started it."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if progress:  # Ray's start takes seconds to tens of seconds: say what the wait is
        where = f"local, {local_cluster(cfg)[0]:g} CPUs" if address == "local" else f"joining {address}"
        print(f"starting Ray ({where})...", flush=True)
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


@contextmanager
def killed_when_interrupted(store: MlflowStore | None) -> Iterator[None]:
    """Ctrl-C (Tune's caught SIGINT, or a KeyboardInterrupt) ends the sweep's MLflow parent run
    KILLED instead of leaving it RUNNING; the exception goes on, so the CLI still exits 130 with the
    resume command. Any other error leaves the run as it was (a crash looks like a killed driver)."""
    try:
        yield
    except (KeyboardInterrupt, SweepInterrupted):
        if store is not None:
            store.kill_sweep()
        raise


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
    init_ray(cfg, address, progress)
    cluster = ray.cluster_resources()
    gpu = trial_gpu(cfg.resources.gpu, cluster.get("GPU", 0))
    cpu = cfg.resources.cpu
    if address == "local":  # a cluster may grow (autoscaler): only a fixed local instance is checked
        check_trial_resources(cpu, gpu, cluster.get("CPU", 0), cluster.get("GPU", 0))

    if not restore:
        clear_experiment(cfg)
    rows_before = {r["run_id"] for r in read_rows(cfg.results_dir, cfg.name)}
    store = None
    if cfg.tracking.mlflow:  # the store, the experiment and the sweep's run exist before any trial starts
        store = MlflowStore(cfg.mlflow_uri, cfg.name, cfg.artifact_location, description=cfg.description)
    # from here a Ctrl-C ends the sweep's MLflow run KILLED (it was opened RUNNING)
    with killed_when_interrupted(store):
        if store is not None:
            if overwrite:
                store.delete_all()
            file_tag = {"genrec.experiment_file": str(cfg.source or "")}
            store.open_sweep(run_naming(cfg), resume=restore, tags=file_tag)  # --resume: the same run
            store.sync_from_parquet(cfg.results_dir)
            summary.mlflow_uri, summary.mlflow_experiment_id = cfg.mlflow_uri, store.experiment_id
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
                f"{cpu:g} CPU / {gpu:g} GPU per trial, up to {summary.slots} at once",
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
            summary.best = best_configuration(list(rows.values()), cfg.metric, cfg.mode)
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
                artifacts=[p for p in (cfg.source, report and standalone_report(cfg)) if p is not None],
                best=best_trial_row(list(rows.values()), cfg.metric, cfg.mode, summary.best),
                metric=cfg.metric,
            )
        return summary


def best_configuration(rows: list[dict], metric: str, mode: str) -> dict[str, Any]:
    """The sweep's best configuration by the reports' rule (genrec.dashboards.headline): the best
    median over seeds and repeats, crowned only when it beats the runner-up by more than their
    combined uncertainty; otherwise `significant` is False and `tied_with` counts the others."""
    import pandas as pd

    from genrec.dashboards.analysis import QUALITY_RE
    from genrec.dashboards.headline import Axis, config_label_series, varying_params, verdict

    df = pd.DataFrame(rows)
    rate = bool(QUALITY_RE.match(metric)) or metric.endswith("_rate")
    found = verdict(df, Axis(metric, mode == "max", "rate" if rate else "timing"))
    if found is None:
        return {}
    label, est = found.ranked[0]
    row = df[config_label_series(df) == label].iloc[0]
    best: dict[str, Any] = {metric: round(est.value, 4)}
    if df["decoder"].nunique() > 1:
        best["decoder"] = row["decoder"]
    shown = varying_params(df[df["decoder"] == row["decoder"]])  # what sets it apart, not every default
    params = json.loads(row.get("decoder_params") or "{}")
    best.update({c.removeprefix("param_"): params.get(c.removeprefix("param_")) for c in shown})
    best["seed"] = None if pd.isna(row.get("seed")) else int(row["seed"])
    best["significant"] = found.significant
    if not found.significant and len(found.ranked) > 1:
        best["tied_with"] = len(found.within_noise) - 1
    return best


def build_report_hook(cfg: ExperimentConfig, summary: SweepSummary) -> Path | None:
    """Build the Plotly report with `genrec.dashboards.report.build_report` (the page loads plotly.js
    from beside it); returns the page. A self-contained copy (plotly.js inside) goes to
    `reports/standalone/`, for the experiment-level MLflow run (kind 'sweep'), whose artifact viewer
    has no `plotly.min.js` beside the page."""
    from genrec.dashboards.report import build_report

    out = cfg.results_dir / "reports" / f"{cfg.name}.html"
    try:
        built = Path(build_report(cfg.results_dir, cfg.name, out, metric=cfg.metric))
        standalone = standalone_report(cfg)
        build_report(cfg.results_dir, cfg.name, standalone, metric=cfg.metric, embed_plotlyjs=True)
    except Exception as e:  # noqa: BLE001 - the rows are written; a report failure must not lose them
        summary.notes.append(f"report not built: {type(e).__name__}: {e}")
        return None
    return built


def standalone_report(cfg: ExperimentConfig) -> Path:
    return cfg.results_dir / "reports" / "standalone" / f"{cfg.name}.html"
