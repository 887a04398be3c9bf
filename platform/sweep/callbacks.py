"""The sweep driver's Tune callbacks: each finished trial's row to Parquet (with a `[k/N]` progress
line and an ETA) and to MLflow, exactly once (see genrec.platform.sweep for the whole protocol)."""

from __future__ import annotations

import json
import math
import time

from ray import tune
from ray.air.integrations.mlflow import MLflowLoggerCallback

from genrec.platform.experiment import ExperimentConfig
from genrec.platform.mlflow_naming import RunNaming
from genrec.platform.mlflow_store import MlflowStore
from genrec.platform.tracking import write_result_row

ROW_KEY = "genrec_row"  # the result row as JSON in a trial's Tune result


# ---- callbacks ----------------------------------------------------------------------
def clock(seconds: float) -> str:
    """0:12, 3:05, 1:02:03: elapsed and ETA in the progress lines."""
    m, s = divmod(int(round(max(0.0, seconds))), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def eta_s(
    remaining: int,
    done_now: int,
    elapsed_s: float,
    trial_s_mean: float,
    slots: int,
    round_s: float | None = None,
) -> float | None:
    """Seconds until the sweep's last trial ends, from the trials finished in this invocation (rows
    reused from an earlier one took no time and do not count); None before the first one finishes.

    Until the first round of `slots` side-by-side trials is over: whole rounds of the mean trial time.
    After it (`round_s`: the elapsed seconds when it was): the pace since then, which holds the
    parallelism and the per-trial overheads (scheduling, writes) but not the one-off worker start-up
    that the first round paid, and which would make the whole-sweep pace overshoot for long."""
    if remaining <= 0:
        return 0.0
    if done_now <= 0:
        return None
    slots = max(1, slots)
    if round_s is None or done_now <= slots:
        return math.ceil(remaining / slots) * trial_s_mean
    return remaining * (elapsed_s - round_s) / (done_now - slots)


def point_text(config: dict, flat: dict) -> str:
    """The parameters that make a trial what it is: its search-space point (with an arm's fixed
    params), not every default the decoder filled in; the whole set when the config has no point."""
    arm = config.get("arm") if isinstance(config, dict) else None
    point = arm["params"] if arm else (config.get("params") if isinstance(config, dict) else None)
    if not point:
        point = json.loads(flat.get("decoder_params", "{}"))
    return " ".join(f"{k}={v}" for k, v in point.items())


class ParquetRowCallback(tune.Callback):
    """Writes each trial's row to Parquet as soon as it arrives; prints a line per finished trial:
    `[k/N] beam beam_width=16 seed=0 recall@10=0.6965 (4.1 s) elapsed 0:12 eta 0:36`.

    Counters start in `setup` (each `fit`), not `__init__`: a resumed sweep unpickles this object
    from Tune's saved state, with the first invocation's values."""

    def __init__(self, results_dir: str, metric: str, progress: bool) -> None:
        self.results_dir, self.metric, self.progress = results_dir, metric, progress
        self.setup()

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        self.total = total_num_samples or 0  # trials of the whole sweep (grid x num_samples)
        self.t0 = time.perf_counter()  # Ray is up by now: elapsed and ETA leave its start-up out
        self.done_before: int | None = None  # finished in an earlier invocation (Tune restored them)
        self.seen = 0  # rows and failures that arrived in this invocation
        self.ran, self.trial_s_sum, self.slots = 0, 0.0, 1
        self.round_s: float | None = None  # elapsed when the first round of `slots` trials was done

    def _finished(self, trials) -> tuple[str, str]:
        """`[k/N] ... elapsed ... eta ...` parts for one more finished trial."""
        if self.done_before is None:  # the first event of this invocation: earlier ones are TERMINATED
            self.done_before = sum(t.status == "TERMINATED" for t in trials)
        self.seen += 1
        # concurrent slots as observed: the trials running side by side (resources, max_concurrent)
        self.slots = max(self.slots, sum(t.status == "RUNNING" for t in trials))
        k, n = self.done_before + self.seen, self.total or len(trials)
        elapsed = time.perf_counter() - self.t0
        if self.round_s is None and self.ran >= self.slots:
            self.round_s = elapsed
        mean = self.trial_s_sum / self.ran if self.ran else 0.0
        eta = eta_s(n - k, self.ran, elapsed, mean, self.slots, self.round_s)
        return f"[{k}/{n}]", f"elapsed {clock(elapsed)} eta {'?' if eta is None else clock(eta)}"

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if ROW_KEY not in result:
            return
        flat = json.loads(result[ROW_KEY])
        write_result_row(self.results_dir, flat)
        reused = bool(result.get("genrec_reused"))
        if not reused:
            self.ran += 1
            self.trial_s_sum += float(flat.get("trial_wall_s", 0.0))
        count, timing = self._finished(trials)
        if self.progress:
            shown = " ".join([str(flat.get("decoder") or ""), point_text(getattr(trial, "config", {}), flat)])
            how = "stored row" if reused else f"{flat.get('trial_wall_s', 0):.1f} s"
            print(
                f"{count} {shown.strip()} seed={flat.get('seed')} "
                f"{self.metric}={flat.get(self.metric, float('nan')):.4f} ({how}) {timing}",
                flush=True,
            )

    def on_trial_error(self, iteration, trials, trial, **info):
        count, timing = self._finished(trials)
        if self.progress:
            print(f"{count} trial {trial.trial_id} failed: see {trial.path}/error.txt {timing}", flush=True)


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
        # the driver opened the sweep's run before `fit`: trials nest under it, named by its naming
        self.store.find_sweep()

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


def run_naming(cfg: ExperimentConfig) -> RunNaming:
    """How the sweep's MLflow runs are named: each decoder's searched params (`beam_width=100`), the
    decoder when several run side by side (`beam(beam_width=100)`), the seed when there are several."""
    keys: dict[str, tuple[str, ...]] = {}
    for sub in cfg.arm_configs():  # an experiment without arms is its own only arm
        keys[sub.decoder] = tuple(dict.fromkeys([*keys.get(sub.decoder, ()), *sub.search_space]))
    return RunNaming(keys, decoder=len(keys) > 1, seed=len(cfg.seeds) > 1)
