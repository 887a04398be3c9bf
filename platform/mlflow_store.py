"""Result rows as MLflow runs: one parent run per sweep, one child run per Parquet row.

The same flat row that goes to Parquet (genrec.platform.tracking, the source of truth) goes to MLflow,
idempotent by the row's run id: every write first looks runs up by the `genrec.run_id` tag, so writing
a row again never adds a second run (see MlflowStore.log_row). Parquet is the source of truth:
`sync_from_parquet` repairs MLflow from it (a driver killed between the two writes, runs left RUNNING,
runs logged before trials were nested or named). How a row maps to params, metrics and tags is
genrec.platform.mlflow_rows (docs/mlflow.md lists it); how a run is named, genrec.platform.mlflow_naming.
mlflow is imported only when used.

A sweep is one parent run (kind 'sweep') with one child run per trial (MLflow's own
`mlflow.parentRunId` tag, which the UI shows as an expandable row). The parent is opened when the
sweep starts, so trials logged while it runs are nested at once, and finished with the sweep's
summary, its best trial and its artifacts. An interrupted sweep (Ctrl-C) ends it KILLED; `--resume`
reopens the same run RUNNING.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from genrec.platform.mlflow_naming import RunNaming
from genrec.platform.mlflow_rows import (
    CREATED_TAG,
    KIND_TAG,
    RUN_ID_TAG,
    mlflow_name,
    row_identity,
    row_params,
    split_row_for_mlflow,
    trial_times_ms,
    value_text,
)
from genrec.workloads.results_store import read_rows

__all__ = [
    "EXPERIMENT_KIND",
    "EXPERIMENT_KIND_TAG",
    "NAMING_TAG",
    "NOTE_TAG",
    "PARENT_TAG",
    "MlflowStore",
    "prepare_mlflow",
    "sqlite_uri",
]

NAMING_TAG = "genrec.run_naming"  # on the sweep run: which values name its trials (RunNaming as JSON)
PARENT_TAG = "mlflow.parentRunId"  # MLflow's nesting: the UI lists a trial under its sweep run
NOTE_TAG = "mlflow.note.content"  # MLflow's description (markdown) of an experiment or a run
DECISION_TAG = "genrec.decision"  # the report's deployment decision, opening the sweep run's description
# MLflow 3 UIs that read it open an experiment of this kind on its runs table, not on the GenAI
# "Overview"; 3.17's UI follows its per-browser GenAI / Model training switch instead (docs/mlflow.md)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def sqlite_uri(results_dir: str | os.PathLike) -> str:
    """The embedded MLflow store: an absolute sqlite path under the results folder."""
    return f"sqlite:///{Path(results_dir).resolve() / 'mlflow.db'}"


def prepare_mlflow(
    tracking_uri: str,
    experiment: str,
    artifact_location: str | None = None,
    description: str | None = None,
) -> str:
    """Create the store (sqlite schema migrations run here, once) and the experiment, in the driver,
    before any trial starts; its description is the experiment file's `description`. Returns the
    experiment id."""
    from mlflow.tracking import MlflowClient

    if tracking_uri.startswith("sqlite:///"):
        Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=tracking_uri)
    exp_id, tags = _create_or_restore_experiment(client, experiment, artifact_location)
    if description and tags.get(NOTE_TAG) != description:
        client.set_experiment_tag(exp_id, NOTE_TAG, description)
    return exp_id


def _create_or_restore_experiment(
    client, experiment: str, artifact_location: str | None
) -> tuple[str, dict[str, str]]:
    """(id, tags) of the experiment, created (tagged with its kind) if new, restored if deleted; an
    existing experiment without a kind tag gets one (a kind the user chose in the UI stays)."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        exp_id = client.create_experiment(
            experiment, artifact_location=artifact_location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
        )
        return exp_id, {}
    exp_id, tags = exp.experiment_id, exp.tags
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp_id)
    if EXPERIMENT_KIND_TAG not in tags:
        client.set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp_id, tags


class MlflowStore:
    """Result rows of one experiment as MLflow runs, idempotent by `genrec.run_id`, nested under
    the experiment's sweep run when there is one."""

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        artifact_location: str | None = None,
        description: str | None = None,
    ) -> None:
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.experiment_id = prepare_mlflow(tracking_uri, experiment, artifact_location, description)
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.parent_run_id: str | None = None  # the sweep run trials are nested under
        self.naming: RunNaming | None = None  # None: a row alone names its run (see run_name)

    def runs(self, kind: str = "trial", run_id: str | None = None) -> list:
        """Active runs of this experiment of one kind (optionally one genrec run id), all pages."""
        query = f"tags.`{KIND_TAG}` = '{kind}'"
        if run_id is not None:
            query += f" and tags.`{RUN_ID_TAG}` = '{run_id}'"
        out, token = [], None
        while True:
            page = self.client.search_runs([self.experiment_id], query, max_results=1000, page_token=token)
            out += list(page)
            token = page.token
            if not token:
                return out

    def run_name(self, flat: dict) -> str:
        """A trial's run name: by the sweep's naming, else (a load test's row, logged alone) its
        label or its decoder with every param."""
        if self.naming is not None:
            return self.naming.name(flat)
        return str(flat.get("label") or "") or RunNaming(decoder=True).name(flat)

    # ---- the sweep's parent run -----------------------------------------------------------------
    def find_sweep(self):
        """Attach to the experiment's sweep run (the newest; duplicates a crashed driver may have
        left are deleted) and take its naming. Returns the run, or None."""
        runs = sorted(self.runs("sweep"), key=lambda r: r.info.start_time or 0, reverse=True)
        for extra in runs[1:]:
            self.client.delete_run(extra.info.run_id)
        if not runs:
            return None
        self.parent_run_id = runs[0].info.run_id
        if self.naming is None and runs[0].data.tags.get(NAMING_TAG):
            self.naming = RunNaming.from_json(runs[0].data.tags[NAMING_TAG])
        return runs[0]

    def open_sweep(self, naming: RunNaming, resume: bool = False, tags: dict[str, str] | None = None) -> str:
        """The sweep's parent run, RUNNING, before any trial row is logged: a fresh sweep replaces
        an earlier one, `--resume` reopens it (its trials stay nested under the same run)."""
        self.naming = naming
        tags = {NAMING_TAG: naming.to_json(), **(tags or {})}
        run = self.find_sweep() if resume else None
        if not resume:
            for r in self.runs("sweep"):
                self.client.delete_run(r.info.run_id)
        if run is None:
            return self._new_sweep_run(tags)
        self.client.update_run(run.info.run_id, status="RUNNING")
        for key, value in tags.items():
            self.client.set_tag(run.info.run_id, key, value)
        return run.info.run_id

    def kill_sweep(self) -> str | None:
        """End the sweep's parent run KILLED (Ctrl-C stopped the sweep), so it does not stay RUNNING
        as if a driver still wrote to it; `--resume` reopens it RUNNING (open_sweep). Returns its id,
        or None when no parent run was opened yet."""
        if self.parent_run_id is None:
            return None
        self.client.set_terminated(self.parent_run_id, "KILLED")
        return self.parent_run_id

    def _new_sweep_run(self, tags: dict[str, str], start_ms: int | None = None) -> str:
        run = self.client.create_run(
            self.experiment_id,
            start_time=start_ms,
            tags={KIND_TAG: "sweep", **tags},
            run_name=f"{self.experiment} (sweep)",
        )
        self.parent_run_id = run.info.run_id
        return run.info.run_id

    # ---- trial runs -----------------------------------------------------------------------------
    def log_row(self, flat: dict, existing: list | None = None) -> str:
        """Exactly one FINISHED run per row: an identical run (same run id and created_at) is kept,
        anything else under that run id (stale, duplicate or left RUNNING by a killed driver) is
        deleted and the row logged afresh. Returns the MLflow run id."""
        return self._log_row(flat, existing)[0]

    def _log_row(self, flat: dict, existing: list | None) -> tuple[str, bool]:
        """(MLflow run id, whether a run was created)."""
        run_id = str(flat["run_id"])
        existing = self.runs("trial", run_id) if existing is None else existing
        kept = self._keep_identical_run(existing, row_identity(flat))
        name = self.run_name(flat)
        if kept is not None:
            self._adopt(kept, name)
            return kept.info.run_id, False
        return self._new_trial_run(flat, run_id, name), True

    def _keep_identical_run(self, existing: list, created: str):
        """The FINISHED run among `existing` that holds this very row (same `genrec.created_at`), or
        None; every other run under the row's run id is deleted."""
        keep = [
            r for r in existing if r.info.status == "FINISHED" and r.data.tags.get(CREATED_TAG) == created
        ]
        for r in existing:
            if not keep or r.info.run_id != keep[0].info.run_id:
                self.client.delete_run(r.info.run_id)
        return keep[0] if keep else None

    def _new_trial_run(self, flat: dict, run_id: str, name: str) -> str:
        """Log the row as a new FINISHED run, nested under the sweep run, spanning the trial's own
        start and end; returns the MLflow run id."""
        from mlflow.entities import Metric, Param, RunTag

        params, metrics, tags = split_row_for_mlflow(flat)
        if self.parent_run_id:
            tags[PARENT_TAG] = self.parent_run_id
        start_ms, end_ms = trial_times_ms(flat)
        run = self.client.create_run(
            self.experiment_id,
            start_time=start_ms,
            tags={KIND_TAG: "trial", RUN_ID_TAG: run_id},
            run_name=name,
        )
        ts = end_ms or int(time.time() * 1000)
        self.client.log_batch(
            run.info.run_id,
            metrics=[Metric(k, v, ts, 0) for k, v in metrics.items()],
            params=[Param(k, v[:6000]) for k, v in params.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        self.client.set_terminated(run.info.run_id, "FINISHED", end_time=end_ms)
        return run.info.run_id

    def _adopt(self, run, name: str) -> None:
        """Nest and name a kept run as a new one would be (runs logged before the sweep run existed,
        or by an older genrec that named runs by their run id)."""
        if self.parent_run_id and run.data.tags.get(PARENT_TAG) != self.parent_run_id:
            self.client.set_tag(run.info.run_id, PARENT_TAG, self.parent_run_id)
        if run.info.run_name != name:
            self.client.update_run(run.info.run_id, name=name)

    def sync_from_parquet(self, results_dir: str | os.PathLike) -> dict[str, int]:
        """Make MLflow hold exactly the experiment's Parquet rows: one FINISHED run per row, nested
        under the sweep run and named like the sweep names them, runs whose row is gone deleted.
        Without a sweep run (MLflow lost, or never written) one is created, FINISHED, spanning the
        trials. Idempotent; returns counts of runs logged and deleted."""
        by_id = self._trial_runs_by_run_id()
        rows = {str(row["run_id"]): row for row in read_rows(results_dir, self.experiment)}
        self._attach_sweep_run(list(rows.values()))
        logged = 0
        for run_id, row in rows.items():
            logged += self._log_row(row, by_id.get(run_id, []))[1]
        deleted = self._delete_runs_without_row(by_id, rows)
        return {"logged": logged, "deleted": deleted}

    def _trial_runs_by_run_id(self) -> dict[str, list]:
        """The experiment's trial runs, grouped by their `genrec.run_id` tag."""
        by_id: dict[str, list] = {}
        for r in self.runs("trial"):
            by_id.setdefault(r.data.tags.get(RUN_ID_TAG, ""), []).append(r)
        return by_id

    def _attach_sweep_run(self, rows: list[dict]) -> None:
        """Before the rows are logged: the sweep run they nest under (found, or rebuilt from the rows
        when there is none) and the naming of their runs (the sweep's, else implied by the rows)."""
        if self.parent_run_id is None:
            self.find_sweep()
        if self.naming is None and rows:
            self.naming = RunNaming.from_rows(rows)
        if self.parent_run_id is None and rows:
            self._finished_sweep_run(rows)

    def _delete_runs_without_row(self, by_id: dict[str, list], rows: dict[str, dict]) -> int:
        """Delete the trial runs whose row is no longer in Parquet; returns how many."""
        deleted = 0
        for run_id, runs in by_id.items():
            if run_id not in rows:
                for r in runs:
                    self.client.delete_run(r.info.run_id)
                    deleted += 1
        return deleted

    def _finished_sweep_run(self, rows: list[dict]) -> str:
        """A sweep run rebuilt from Parquet rows alone: from the first trial's start to the last's end."""
        times = [trial_times_ms(r) for r in rows]
        starts = [s for s, _ in times if s is not None]
        ends = [e for _, e in times if e is not None]
        tags = {NAMING_TAG: self.naming.to_json()} if self.naming else {}
        rid = self._new_sweep_run(tags, start_ms=min(starts, default=None))
        self.client.set_terminated(rid, "FINISHED", end_time=max(ends, default=None))
        return rid

    def delete_all(self) -> int:
        """Delete every run of the experiment (trials and sweep summaries), for --overwrite."""
        runs = self.runs("trial") + self.runs("sweep")
        for r in runs:
            self.client.delete_run(r.info.run_id)
        self.parent_run_id = None
        return len(runs)

    def log_sweep(
        self,
        metrics: dict[str, float],
        params: dict[str, object],
        artifacts: list[Path],
        tags: dict[str, str] | None = None,
        best: dict | None = None,
        metric: str | None = None,
    ) -> str:
        """Finish the sweep's parent run: the summary metrics, the sweep's params, its best trial
        (`best`, a result row, judged by `metric`) and the artifacts (experiment file, report)."""
        from mlflow.entities import Metric, RunTag

        rid = self.parent_run_id or self.open_sweep(self.naming or RunNaming())
        now = int(time.time() * 1000)
        all_metrics, all_tags = self._sweep_metrics_and_tags(metrics, tags, best, metric)
        self._log_params_once(rid, {mlflow_name(k): str(v)[:6000] for k, v in params.items()})
        self.client.log_batch(
            rid,
            metrics=[Metric(k, v, now, 0) for k, v in all_metrics.items()],
            tags=[RunTag(k, v) for k, v in all_tags.items()],
        )
        for path in artifacts:
            if Path(path).is_file():
                self.client.log_artifact(rid, str(path))
        self.client.set_terminated(rid, "FINISHED")
        return rid

    def _sweep_metrics_and_tags(
        self, metrics: dict[str, float], tags: dict[str, str] | None, best: dict | None, metric: str | None
    ) -> tuple[dict[str, float], dict[str, str]]:
        """The sweep run's metrics (MLflow names) and tags, with its best trial's when it has one."""
        all_tags = dict(tags or {})
        all_metrics = {mlflow_name(k): float(v) for k, v in metrics.items()}
        if best is not None and metric:
            all_tags.update(self._best_tags(best, metric))
            all_metrics[f"best_{mlflow_name(metric)}"] = float(best[metric])
        if all_tags.get(DECISION_TAG):  # the run's description opens with the report's decision
            all_tags[NOTE_TAG] = all_tags[DECISION_TAG] + "\n\n" + all_tags.get(NOTE_TAG, "")
        return all_metrics, all_tags

    def _log_params_once(self, rid: str, params: dict[str, str]) -> None:
        """MLflow params cannot change: a resumed sweep logs only new ones; a value that differs
        from the first invocation's (e.g. `gpu: auto` on another cluster) goes to a `resumed.` tag."""
        from mlflow.entities import Param

        logged = self.client.get_run(rid).data.params
        new = [Param(k, v) for k, v in params.items() if k not in logged]
        for k, v in params.items():
            if k in logged and logged[k] != v:
                self.client.set_tag(rid, f"resumed.{k}", v)
        if new:
            self.client.log_batch(rid, params=new)

    def _best_tags(self, best: dict, metric: str) -> dict[str, str]:
        """Tags naming the best trial on the sweep run (tags, not params: a resumed sweep that
        re-runs failed trials may find another best) and a run note linking to it."""
        runs = self.runs("trial", str(best["run_id"]))
        name = runs[0].info.run_name if runs else self.run_name(best)
        tags = {
            "best.run_id": str(best["run_id"]),
            "best.run_name": name,
            "best.decoder": str(best.get("decoder", "")),
            "best.params": json.dumps(row_params(best), sort_keys=True),
            "best.seed": str(best.get("seed", "")),
            "best.metric": metric,
        }
        link = name
        if runs:
            tags["best.mlflow_run_id"] = runs[0].info.run_id
            link = f"[{name}](#/experiments/{self.experiment_id}/runs/{runs[0].info.run_id})"
        tags[NOTE_TAG] = f"Best trial by {metric}: {link}, {metric} = {value_text(float(best[metric]))}"
        return tags
