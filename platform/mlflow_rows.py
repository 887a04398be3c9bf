"""A flat result row as MLflow sees it: params, metrics and tags, the row's identity, its trial times.

The same flat row that goes to Parquet goes to MLflow, split into params (what was run), metrics (what
was measured) and tags (where and with what it ran); docs/mlflow.md lists the mapping. Column names are
kept, except that MLflow forbids '@' in names: 'recall@10' is logged as 'recall_at_10'. A run carries
the row's run id in the tag `genrec.run_id` and its identity (`row_identity`) in `genrec.created_at`;
genrec.platform.mlflow_store writes the runs. Nothing here talks to MLflow.
"""

from __future__ import annotations

import json
import math
import re

from genrec.workloads.errors import UserInputError

KIND_TAG = "genrec.kind"  # "trial" (one per result row) or "sweep" (one per experiment)
RUN_ID_TAG = "genrec.run_id"
CREATED_TAG = "genrec.created_at"  # with trial_started_at: tells a re-evaluated row from the same one
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
    "load_1m",  # the machine's state, not a result: a metric here was what MLflow's compare view opened on
    "schema_version",
    "ray_trial_id",
    "trial_started_at",
)
_BAD_NAME_CHARS = re.compile(r"[^\w./\- ]")


def mlflow_name(column: str) -> str:
    return _BAD_NAME_CHARS.sub("_", column.replace("@", "_at_"))


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def value_text(value: object) -> str:
    """A value as run names and notes show it: floats to 6 significant digits."""
    return format(value, ".6g") if isinstance(value, float) else str(value)


def benchmark_arguments(flat: dict) -> set[str]:
    """The keyword arguments of the benchmark that made a row (none for other rows): a benchmark
    returns them beside its measurements (mari_matmul's `b`, `d_user`, `d_cross`, ...)."""
    if not flat.get("benchmark"):
        return set()
    from genrec.platform.benchmarks import get_benchmark

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
        elif is_number(value):
            metrics[mlflow_name(key)] = float(value)
        else:
            tags[key] = str(value)
    tags[RUN_ID_TAG] = str(flat["run_id"])
    tags[CREATED_TAG] = row_identity(flat)
    return params, quality_first(metrics), finish_tags(tags, flat)


def metric_rank(name: str) -> tuple[int, str]:
    """Quality first (recall, hr, ndcg at each K, then the invalid and missing shares), latency next,
    throughput, then the rest by name: MLflow's tables and compare view open on the first ones."""
    order = ("recall_at_", "hr_at_", "ndcg_at_", "invalid_rate", "missing_rate", "latency_p50", "latency_p99")
    order += ("throughput", "latency_", "time_", "count_")
    rank = next((i for i, lead in enumerate(order) if name.startswith(lead)), len(order))
    return rank, name


def quality_first(metrics: dict[str, float]) -> dict[str, float]:
    return {k: metrics[k] for k in sorted(metrics, key=metric_rank)}


def finish_tags(tags: dict[str, str], flat: dict) -> dict[str, str]:
    tags[KIND_TAG] = "trial"
    if flat.get("git_commit"):
        tags["mlflow.source.git.commit"] = str(flat["git_commit"]).removesuffix("+dirty")
    return tags


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
    if not is_number(started):
        return None, None
    start = round(float(started) * 1000)
    return start, start + round(float(wall) * 1000) if is_number(wall) else None


def best_trial_row(rows: list[dict], metric: str, mode: str, chosen: dict | None = None) -> dict | None:
    """The trial the sweep's parent run names as its best: the best `metric` among the trials of the
    configuration the sweep's summary chose (`chosen`: param values and seed; keys a row lacks and
    None values are ignored), or among all trials when it chose none or none match."""
    sign = 1.0 if mode == "max" else -1.0
    scored = [r for r in rows if is_number(r.get(metric)) and not math.isnan(float(r[metric]))]

    def matches(row: dict) -> bool:
        params = row_params(row)
        for key, want in (chosen or {}).items():
            have = params.get(key, row.get(key))
            if key != metric and want is not None and have is not None and have != want:
                return False
        return True

    candidates = [r for r in scored if matches(r)] or scored
    return max(candidates, key=lambda r: sign * float(r[metric]), default=None)
