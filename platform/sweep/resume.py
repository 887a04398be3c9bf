"""A fresh sweep or a resumed one: the decision, and the bookkeeping on disk that it rests on.

`plan_storage` decides (without side effects) whether Tune's saved state is restored: a fresh sweep
over an experiment that already has rows or Tune state needs --overwrite, --resume needs Tune state and
an unchanged experiment, judged by the fingerprint (`ExperimentConfig.fingerprint`) that
`stamp_fingerprint` writes beside Tune's state when a fresh sweep starts. `clear_experiment` removes a
fresh sweep's leftovers (Tune state and Parquet rows; MLflow runs are the parent run's business, see
genrec.platform.sweep.parent_run).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ray import tune

from genrec.platform.experiment import ExperimentConfig
from genrec.platform.tracking import delete_rows
from genrec.workloads.errors import UserInputError
from genrec.workloads.results_store import read_rows

FINGERPRINT_FILE = "genrec_experiment.json"


def tune_state_dir(cfg: ExperimentConfig) -> Path:
    """Where Tune keeps the experiment's state (what --resume restores)."""
    return cfg.storage_path / cfg.name


def plan_storage(cfg: ExperimentConfig, resume: bool, overwrite: bool) -> bool:
    """Decide between a fresh sweep and a resumed one (no side effects); True = restore Tune's state.

    A fresh sweep over an experiment that already has rows or Tune state needs --overwrite (which
    removes them) so two sweeps never mix; --resume needs Tune state and an unchanged experiment.
    """
    exp_dir = tune_state_dir(cfg)
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
    exp_dir = tune_state_dir(cfg)
    if exp_dir.exists():
        shutil.rmtree(exp_dir)
    delete_rows(cfg.results_dir, cfg.name)


def stamp_fingerprint(cfg: ExperimentConfig) -> None:
    """A fresh sweep records what --resume must find unchanged (checked by `plan_storage`)."""
    exp_dir = tune_state_dir(cfg)
    exp_dir.mkdir(parents=True, exist_ok=True)
    (exp_dir / FINGERPRINT_FILE).write_text(cfg.fingerprint())


def stored_run_ids(cfg: ExperimentConfig) -> set[str]:
    """Run ids of the rows already written (before this invocation's trials run)."""
    return {r["run_id"] for r in read_rows(cfg.results_dir, cfg.name)}
