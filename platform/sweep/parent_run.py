"""The sweep's MLflow parent run, from opening to its end: the run every trial's run nests under.

Its lifecycle, in the order the driver (genrec.platform.sweep) goes through it:

1. `open_store`: the MLflow store and experiment, before any trial starts (None without MLflow).
2. `open_parent_run`: --overwrite deletes the experiment's runs; the parent run is opened RUNNING (a
   resumed sweep reopens the same run) and MLflow is reconciled from the Parquet rows.
3. `killed_when_interrupted`: a Ctrl-C from here on ends the run KILLED instead of leaving it RUNNING.
4. `log_parent_run`: after the last row, the sweep's metrics, params, best trial and artifacts
   finish it.

The trials' own runs are logged by the callbacks (genrec.platform.sweep.callbacks), one per row.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from genrec.platform.experiment import ExperimentConfig
from genrec.platform.mlflow_rows import best_trial_row
from genrec.platform.mlflow_store import DECISION_TAG, MlflowStore
from genrec.platform.sweep.callbacks import run_naming
from genrec.platform.sweep.interrupt import SweepInterrupted
from genrec.platform.sweep.ray_start import TrialResources
from genrec.platform.sweep.results import SweepSummary, standalone_report


def open_store(cfg: ExperimentConfig) -> MlflowStore | None:
    """The experiment's MLflow store (its experiment created if new); None when MLflow is off."""
    if not cfg.tracking.mlflow:
        return None
    return MlflowStore(cfg.mlflow_uri, cfg.name, cfg.artifact_location, description=cfg.description)


def open_parent_run(
    store: MlflowStore, cfg: ExperimentConfig, restore: bool, overwrite: bool, summary: SweepSummary
) -> None:
    """Open the sweep's run RUNNING (--resume: the same run) after --overwrite's deletions, reconcile
    MLflow from Parquet, and note where the runs are in the summary."""
    if overwrite:
        store.delete_all()
    file_tag = {"genrec.experiment_file": str(cfg.source or "")}
    store.open_sweep(run_naming(cfg), resume=restore, tags=file_tag)  # --resume: the same run
    store.sync_from_parquet(cfg.results_dir)
    summary.mlflow_uri, summary.mlflow_experiment_id = cfg.mlflow_uri, store.experiment_id


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


def parent_run_metrics(summary: SweepSummary) -> dict[str, float]:
    return {
        "trials_done": summary.trials_done,
        "trials_failed": summary.trials_failed,
        "wall_s": summary.wall_s,
        "trial_s_sum": summary.trial_s_sum,
        "own_time_ratio": summary.own_time_ratio,
    }


def parent_run_params(
    cfg: ExperimentConfig, summary: SweepSummary, resources: TrialResources
) -> dict[str, Any]:
    return {
        "decoder": cfg.decoder,
        "trials": summary.trials_total,
        "metric": cfg.metric,
        "mode": cfg.mode,
        "cpu_per_trial": resources.cpu,
        "gpu_per_trial": resources.gpu,
    }


def log_parent_run(
    store: MlflowStore,
    cfg: ExperimentConfig,
    summary: SweepSummary,
    resources: TrialResources,
    rows: dict[str, dict],
) -> None:
    """Finish the sweep's run: its metrics and params, the best trial's row, the experiment file and
    (when built) the self-contained report."""
    report = summary.report
    verdict_keys = ("latency_p50_ms", "significant", "tie", "tied_with", "decision")
    chosen = {k: v for k, v in summary.best.items() if k not in verdict_keys}  # the configuration only
    decision = str(summary.best.get("decision") or "")
    store.log_sweep(
        metrics=parent_run_metrics(summary),
        params=parent_run_params(cfg, summary, resources),
        artifacts=[p for p in (cfg.source, report and standalone_report(cfg)) if p is not None],
        tags={DECISION_TAG: decision} if decision else None,
        best=best_trial_row(list(rows.values()), cfg.metric, cfg.mode, chosen),
        metric=cfg.metric,
    )
