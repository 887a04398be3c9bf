"""Result rows as MLflow runs: one parent run per sweep, one child run per Parquet row.

The same flat row that goes to Parquet (genrec.platform.tracking, the source of truth) goes to MLflow,
idempotent by the row's run id; docs/mlflow.md lists how columns map to params, metrics and tags.
mlflow is imported only when used.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from genrec.workloads.errors import UserInputError
from genrec.workloads.results_store import read_rows

# --- MLflow --------------------------------------------------------------------------------------
# The same flat row goes to MLflow, split into params (what was run), metrics (what was measured)
# and tags (where and with what it ran); docs/mlflow.md lists the mapping. Column names are kept,
# except that MLflow forbids '@' in names: 'recall@10' is logged as 'recall_at_10'. A run carries the
# row's run id in the tag `genrec.run_id`; every write first looks runs up by that tag, so writing a
# row again never adds a second run (see MlflowStore.log_row). Parquet is the source of truth:
# `sync_from_parquet` repairs MLflow from it (a driver killed between the two writes, runs left
# RUNNING, runs logged before trials were nested or named).
#
# A sweep is one parent run (kind 'sweep') with one child run per trial (MLflow's own
# `mlflow.parentRunId` tag, which the UI shows as an expandable row). The parent is opened when the
# sweep starts, so trials logged while it runs are nested at once, and finished with the sweep's
# summary, its best trial and its artifacts. An interrupted sweep (Ctrl-C) ends it KILLED; `--resume`
# reopens the same run RUNNING.

KIND_TAG = "genrec.kind"  # "trial" (one per result row) or "sweep" (one per experiment)
RUN_ID_TAG = "genrec.run_id"
CREATED_TAG = "genrec.created_at"  # with trial_started_at: tells a re-evaluated row from the same one
NAMING_TAG = "genrec.run_naming"  # on the sweep run: which values name its trials (RunNaming as JSON)
PARENT_TAG = "mlflow.parentRunId"  # MLflow's nesting: the UI lists a trial under its sweep run
NOTE_TAG = "mlflow.note.content"  # MLflow's description (markdown) of an experiment or a run
# MLflow 3 UIs that read it open an experiment of this kind on its runs table, not on the GenAI
# "Overview"; 3.17's UI follows its per-browser GenAI / Model training switch instead (docs/mlflow.md)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
PARAM_COLUMNS = (
    "decoder",
    "decoder_params",
    "dataset",
    "model",
    "draft",
    "split",
    "seed",
    "batch_size",
    "users",
    "repeats",
)
TAG_COLUMNS = (
    "experiment",
    "device",
    "threads",
    "torch_version",
    "triton_version",
    "python_version",
    "git_commit",
    "host",
    "schema_version",
    "ray_trial_id",
    "trial_started_at",
)
_BAD_NAME_CHARS = re.compile(r"[^\w./\- ]")


def sqlite_uri(results_dir: str | os.PathLike) -> str:
    """The embedded MLflow store: an absolute sqlite path under the results folder."""
    return f"sqlite:///{Path(results_dir).resolve() / 'mlflow.db'}"


def mlflow_name(column: str) -> str:
    return _BAD_NAME_CHARS.sub("_", column.replace("@", "_at_"))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def benchmark_arguments(flat: dict) -> set[str]:
    """The keyword arguments of the benchmark that made a row (none for other rows): a benchmark
    returns them beside its measurements (mari_matmul's `b`, `d_user`, `d_cross`, ...)."""
    if not flat.get("benchmark"):
        return set()
    from genrec.workloads.benchmarks.registry import get_benchmark

    try:
        return set(get_benchmark(str(flat["benchmark"])).parameters())
    except UserInputError:  # a row of a benchmark this checkout no longer has
        return set()


def split_row_for_mlflow(flat: dict) -> tuple[dict[str, str], dict[str, float], dict[str, str]]:
    """(params, metrics, tags) of one flat result row.

    A value that configures the run is a param and only a param: a benchmark's echoed keyword
    arguments are not metrics. Where the row has them as `param_*` columns already (the experiment
    set them) they are dropped; defaults the experiment left alone (mari_matmul's `d_cross` = 0) are
    params under their own column name. Empty strings (a benchmark's dataset and model, an eval
    without a draft) are left out rather than logged as empty params."""
    arguments = benchmark_arguments(flat)
    params, metrics, tags = {}, {}, {}
    for key, value in flat.items():
        if value is None or value == "" or key in ("run_id", "created_at"):
            continue
        if key in PARAM_COLUMNS or key.startswith("param_"):
            params[mlflow_name(key)] = str(value)
        elif key in TAG_COLUMNS:  # the environment (threads, device) stays a tag in every row
            tags[key] = str(value)
        elif key in arguments:
            if f"param_{key}" not in flat:
                params[mlflow_name(key)] = str(value)
        elif isinstance(value, bool):
            params[mlflow_name(key)] = str(value)
        elif _is_number(value):
            metrics[mlflow_name(key)] = float(value)
        else:
            tags[key] = str(value)
    tags[RUN_ID_TAG] = str(flat["run_id"])
    tags[CREATED_TAG] = row_identity(flat)
    tags[KIND_TAG] = "trial"
    if flat.get("git_commit"):
        tags["mlflow.source.git.commit"] = str(flat["git_commit"]).removesuffix("+dirty")
    return params, metrics, tags


def row_identity(flat: dict) -> str:
    return f"{flat.get('created_at', '')}|{flat.get('trial_started_at', '')}"


def row_params(flat: dict) -> dict[str, object]:
    """A row's decoder (or benchmark) parameters: its `decoder_params` JSON, then `param_*` columns."""
    raw = flat.get("decoder_params")
    params = json.loads(raw) if isinstance(raw, str) and raw else {}
    for key, value in flat.items():
        if key.startswith("param_"):
            params.setdefault(key.removeprefix("param_"), value)
    return params


def trial_times_ms(flat: dict) -> tuple[int | None, int | None]:
    """(start, end) of a trial in epoch milliseconds, as MLflow's create_run / set_terminated take
    them: `trial_started_at` is epoch seconds and `trial_wall_s` the trial's own duration. None where
    the row lacks them (MLflow then uses the time of logging)."""
    started, wall = flat.get("trial_started_at"), flat.get("trial_wall_s")
    if not _is_number(started):
        return None, None
    start = round(float(started) * 1000)
    return start, start + round(float(wall) * 1000) if _is_number(wall) else None


def _show(value: object) -> str:
    return format(value, ".6g") if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class RunNaming:
    """Which configuration values name a trial's run: the swept params of each decoder
    (`beam_width=100`), the decoder when an experiment runs several (`beam(beam_width=100)`), the
    seed when it has several (`beam_width=100 seed=1`). A decoder it does not list shows every
    param. The `genrec.run_id` tag, not the name, identifies a run."""

    keys: dict[str, tuple[str, ...]] = field(default_factory=dict)  # decoder -> params in the name
    decoder: bool = False
    seed: bool = False

    def name(self, flat: dict) -> str:
        params, decoder = row_params(flat), str(flat.get("decoder", ""))
        keys = self.keys.get(decoder, tuple(params))
        pairs = [f"{k}={_show(params[k])}" for k in keys if k in params]
        if self.decoder:
            name = f"{decoder}({', '.join(pairs)})" if pairs else decoder
        else:
            name = " ".join(pairs) or decoder
        if self.seed and flat.get("seed") is not None:
            name = f"{name} seed={flat['seed']}"
        return name.strip() or str(flat.get("run_id", ""))

    @classmethod
    def from_rows(cls, rows: list[dict]) -> RunNaming:
        """The naming rows imply when no sweep recorded one: per decoder, the params whose values
        differ between its rows."""
        by_decoder: dict[str, list[dict]] = {}
        for row in rows:
            by_decoder.setdefault(str(row.get("decoder", "")), []).append(row_params(row))
        keys = {}
        for decoder, params in by_decoder.items():
            names = dict.fromkeys(k for p in params for k in p)
            keys[decoder] = tuple(
                k for k in names if len({json.dumps(p.get(k), sort_keys=True) for p in params}) > 1
            )
        seeds = {row.get("seed") for row in rows}
        return cls(keys, decoder=len(keys) > 1, seed=len(seeds) > 1)

    def to_json(self) -> str:
        return json.dumps({"keys": self.keys, "decoder": self.decoder, "seed": self.seed}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunNaming:
        d = json.loads(text)
        return cls({k: tuple(v) for k, v in d["keys"].items()}, bool(d["decoder"]), bool(d["seed"]))


def best_trial_row(rows: list[dict], metric: str, mode: str, chosen: dict | None = None) -> dict | None:
    """The trial the sweep's parent run names as its best: the best `metric` among the trials of the
    configuration the sweep's summary chose (`chosen`: param values and seed; keys a row lacks and
    None values are ignored), or among all trials when it chose none or none match."""
    sign = 1.0 if mode == "max" else -1.0
    scored = [r for r in rows if _is_number(r.get(metric)) and not math.isnan(float(r[metric]))]

    def matches(row: dict) -> bool:
        params = row_params(row)
        for key, want in (chosen or {}).items():
            have = params.get(key, row.get(key))
            if key != metric and want is not None and have is not None and have != want:
                return False
        return True

    candidates = [r for r in scored if matches(r)] or scored
    return max(candidates, key=lambda r: sign * float(r[metric]), default=None)


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
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        exp_id = client.create_experiment(
            experiment, artifact_location=artifact_location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
        )
        tags: dict[str, str] = {}
    else:
        exp_id, tags = exp.experiment_id, exp.tags
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp_id)
        if EXPERIMENT_KIND_TAG not in tags:  # a kind the user chose in the UI stays
            client.set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    if description and tags.get(NOTE_TAG) != description:
        client.set_experiment_tag(exp_id, NOTE_TAG, description)
    return exp_id


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
        from mlflow.entities import Metric, Param, RunTag

        run_id = str(flat["run_id"])
        existing = self.runs("trial", run_id) if existing is None else existing
        created = row_identity(flat)
        keep = [
            r for r in existing if r.info.status == "FINISHED" and r.data.tags.get(CREATED_TAG) == created
        ]
        for r in existing:
            if not keep or r.info.run_id != keep[0].info.run_id:
                self.client.delete_run(r.info.run_id)
        name = self.run_name(flat)
        if keep:
            self._adopt(keep[0], name)
            return keep[0].info.run_id, False
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
        return run.info.run_id, True

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
        by_id: dict[str, list] = {}
        for r in self.runs("trial"):
            by_id.setdefault(r.data.tags.get(RUN_ID_TAG, ""), []).append(r)
        rows = {str(row["run_id"]): row for row in read_rows(results_dir, self.experiment)}
        if self.parent_run_id is None:
            self.find_sweep()
        if self.naming is None and rows:
            self.naming = RunNaming.from_rows(list(rows.values()))
        if self.parent_run_id is None and rows:
            self._finished_sweep_run(list(rows.values()))
        logged = deleted = 0
        for run_id, row in rows.items():
            logged += self._log_row(row, by_id.get(run_id, []))[1]
        for run_id, runs in by_id.items():
            if run_id not in rows:
                for r in runs:
                    self.client.delete_run(r.info.run_id)
                    deleted += 1
        return {"logged": logged, "deleted": deleted}

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
        all_tags = dict(tags or {})
        all_metrics = {mlflow_name(k): float(v) for k, v in metrics.items()}
        if best is not None and metric:
            all_tags.update(self._best_tags(best, metric))
            all_metrics[f"best_{mlflow_name(metric)}"] = float(best[metric])
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
        tags[NOTE_TAG] = f"Best trial by {metric}: {link}, {metric} = {_show(float(best[metric]))}"
        return tags
