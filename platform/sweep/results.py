"""What a finished sweep hands back: the `SweepSummary` the CLI prints, filled from the stored rows
(`collect_results`), the best configuration by the reports' rule (`best_configuration`) and the Plotly
report (`build_report_hook`, with a self-contained copy for MLflow at `standalone_report`).

The trials' own time ratio in the summary is

    sum(trial_wall_s of trials evaluated in this invocation) / (sweep wall time x concurrent slots)

(see genrec.platform.sweep for what the wall time and the slots cover).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genrec.platform.experiment import ExperimentConfig
from genrec.workloads.results_store import parquet_root, read_rows

if TYPE_CHECKING:
    from ray.tune import ResultGrid


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
            out.append(f"best: { {k: v for k, v in self.best.items() if k != 'decision'} }")
            if self.best.get("decision"):
                out.append(f"decision: {self.best['decision']}")
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


def evaluated_now(run_id: str, row: dict, rows_before: set[str], wall_clock_start: float) -> bool:
    """A row of a trial evaluated in this invocation, not one stored (or started) before it."""
    return not (run_id in rows_before or row.get("trial_started_at", 0) < wall_clock_start)


def collect_results(
    summary: SweepSummary,
    cfg: ExperimentConfig,
    results: ResultGrid,
    rows_before: set[str],
    wall_clock_start: float,
) -> dict[str, dict]:
    """Fill the summary's counts, trial time and best configuration from the rows stored after `fit`
    and Tune's results (its failed trials); returns the rows by run id."""
    rows = {r["run_id"]: r for r in read_rows(cfg.results_dir, cfg.name)}
    for result in results:
        if result.error is not None:
            summary.trials_failed += 1
    summary.trials_done = len(rows)
    for run_id, row in rows.items():
        if evaluated_now(run_id, row, rows_before, wall_clock_start):
            summary.trials_ran += 1
            summary.trial_s_sum += float(row.get("trial_wall_s", 0.0))
        else:
            summary.trials_reused += 1
    if rows:
        summary.best = best_configuration(list(rows.values()), cfg.metric, cfg.mode, cfg.results_dir)
    summary.parquet_dir = parquet_root(cfg.results_dir) / f"experiment={cfg.name}"
    return rows


def best_configuration(
    rows: list[dict], metric: str, mode: str, results_dir: Path | None = None
) -> dict[str, Any]:
    """The sweep's best configuration by the reports' rule. On a quality metric with latencies, the
    deployment decision of the report (genrec.dashboards.decision, paired on the per-user outcomes in
    `results_dir`): the cheapest configuration not significantly below the best, marked `tie` when
    it is not the best itself, with `decision`, the report's sentence. Otherwise the best median,
    crowned only when it beats the runner-up by more than their combined uncertainty."""
    import pandas as pd

    from genrec.dashboards.analysis import QUALITY_RE

    df = pd.DataFrame(rows)
    if QUALITY_RE.match(metric) and mode == "max" and "latency_p50_ms" in df and "decoder" in df:
        found = decided_best(df, metric, results_dir)
        if found:
            return found
    return verdict_best(df, metric, mode)


def config_fields(df, label: str, labels) -> dict[str, Any]:
    """decoder, the parameters that set the configuration apart, and its first seed."""
    import pandas as pd

    from genrec.dashboards.headline import varying_params

    row = df[labels == label].iloc[0]
    out: dict[str, Any] = {}
    if df["decoder"].nunique() > 1:
        out["decoder"] = row["decoder"]
    shown = varying_params(df[df["decoder"] == row["decoder"]])  # what sets it apart, not every default
    params = json.loads(row.get("decoder_params") or "{}")
    out.update({c.removeprefix("param_"): params.get(c.removeprefix("param_")) for c in shown})
    out["seed"] = None if pd.isna(row.get("seed")) else int(row["seed"])
    return out


def decided_best(df, metric: str, results_dir: Path | None) -> dict[str, Any]:
    from genrec.dashboards.decision import choice_sentence, decide
    from genrec.dashboards.headline import Axis, config_label_series
    from genrec.dashboards.page_headlines import compared_rows

    compared = compared_rows(df)[0]
    latency = Axis("latency_p50_ms", False, "timing", "latency p50", "ms")
    dec = decide(compared, Axis(metric, True, "rate", metric), latency, results_dir)
    if dec is None or dec.best is None:
        return {}
    c = dec.best
    best: dict[str, Any] = {metric: round(c.quality, 4), "latency_p50_ms": round(c.latency.value, 3)}
    best.update(config_fields(compared, c.deploy, config_label_series(compared)))
    best["significant"] = not c.tie and len(dec.choices) > 0
    if c.tie:
        best["tie"] = f"cheapest of those not significantly below {c.best}"
    best["decision"] = choice_sentence(dec, c)
    return best


def verdict_best(df, metric: str, mode: str) -> dict[str, Any]:
    from genrec.dashboards.analysis import QUALITY_RE
    from genrec.dashboards.headline import Axis, config_label_series, verdict

    rate = bool(QUALITY_RE.match(metric)) or metric.endswith("_rate")
    found = verdict(df, Axis(metric, mode == "max", "rate" if rate else "timing"))
    if found is None:
        return {}
    label, est = found.ranked[0]
    best: dict[str, Any] = {metric: round(est.value, 4)}
    best.update(config_fields(df, label, config_label_series(df)))
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
    from genrec.platform.benchmarks import load_report_pages

    load_report_pages()  # the studies' pages (NEZHA, AtSpeed, MaRI) register themselves

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
