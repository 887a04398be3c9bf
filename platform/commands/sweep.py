"""`genrec sweep EXPERIMENT.yaml` (Ray Tune) and `genrec runs` (query the Parquet result rows).

Ray, MLflow and pandas are imported inside the commands so `genrec --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from genrec.workloads.errors import UserInputError

DEFAULT_COLUMNS = (
    "run_id",
    "decoder",
    "param_*",
    "seed",
    "hr@*",
    "ndcg@*",
    "recall@*",
    "invalid_rate",
    "missing_rate",
    "latency_p50_ms",
    "latency_p99_ms",
    "throughput_users_per_s",
    "*speedup",  # benchmark experiments (e.g. MaRI's time and FLOPs speedups)
    "trial_wall_s",
)


def sweep_command(
    experiment: Annotated[Path, typer.Argument(help="Experiment file, e.g. experiments/beam_width.yaml.")],
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Finish an interrupted sweep: finished trials are kept, not re-run."),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Delete the experiment's earlier rows, MLflow runs and Tune state."),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate and print the trials without running them.")
    ] = False,
    results_dir: Annotated[
        Path | None, typer.Option(help="Results folder (overrides tracking.results_dir).")
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(help="Ray cluster to run on (default: experiment's ray.address, RAY_ADDRESS, local)."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No per-trial lines.")] = False,
    max_trials: Annotated[
        int, typer.Option(help="Refuse an experiment that makes more trials than this.", min=1)
    ] = 10_000,
) -> None:
    """Run a parameter sweep of a decoder with Ray Tune; rows go to Parquet and MLflow."""
    from genrec.platform.experiment_loading import load_experiment, resolve_paths

    if resume and overwrite:
        raise UserInputError("--resume and --overwrite exclude each other: pick one")
    cfg = load_experiment(experiment, max_trials=max_trials)
    if results_dir is not None:
        cfg.tracking.results_dir = results_dir
        resolve_paths(cfg, Path.cwd())
    if dry_run:
        print_dry_run(cfg, ray_address)
        return
    from genrec.platform.sweep import run_sweep
    from genrec.platform.sweep.interrupt import StopSignals, SweepInterrupted
    from genrec.platform.sweep.ray_start import kill_started_ray, ray_is_up, shutdown_started_ray

    hint = resume_command(experiment, results_dir, ray_address)
    stopped = f"\nsweep interrupted; finished trials are kept. Resume it with: {hint}"
    ours = not ray_is_up()  # a Ray the caller had up (tests, a notebook) is not this command's to stop

    def give_up() -> None:  # the clean stop hung (the signal also ended Ray's GCS): exit all the same
        typer.echo(stopped, err=True)
        if ours:
            kill_started_ray()

    with StopSignals(give_up) as stop:  # SIGTERM and SIGHUP stop the sweep as Ctrl-C does
        try:
            summary = run_sweep(
                cfg,
                resume=resume,
                overwrite=overwrite,
                progress=not quiet,
                ray_address=ray_address,
                resume_hint=hint,
            )
        except (KeyboardInterrupt, SweepInterrupted):
            typer.echo(stopped, err=True)
            if ours:
                shutdown_started_ray()  # now, not at exit: no Ray process or listener outlives the command
            raise typer.Exit(stop.exit_code()) from None  # 128 + the signal, as a shell reports it
    for line in summary.lines():
        typer.echo(line)
    if summary.trials_failed:
        raise typer.Exit(1)


def resume_command(experiment: Path, results_dir: Path | None, ray_address: str | None) -> str:
    """The genrec command that finishes this sweep (what Ctrl-C and a busy lock point to)."""
    import shlex

    argv = ["genrec", "sweep", str(experiment), "--resume"]
    if results_dir is not None:
        argv += ["--results-dir", str(results_dir)]
    if ray_address:
        argv += ["--ray-address", ray_address]
    return shlex.join(argv)


def print_dry_run(cfg, ray_address: str | None = None) -> None:
    """The plan, then the per-trial resources checked against the Ray instance the real run would start
    (exit 2 as the real run would, without Ray's start-up); a remote cluster is not contacted."""
    from genrec.platform.sweep.ray_start import (
        check_trial_resources,
        local_cluster,
        resolve_ray_address,
        trial_gpu,
    )

    trials = cfg.trial_grid()
    what = f"benchmark {cfg.benchmark}" if cfg.benchmark else f"decoder {cfg.decoder}"
    typer.echo(f"experiment {cfg.name}: {what}, {len(trials)} trials, {cfg.metric} ({cfg.mode})")
    if cfg.benchmark is None:  # a model-free benchmark has neither
        t = cfg.model.train
        model = f"checkpoint {cfg.model.checkpoint}" if cfg.model.checkpoint else f"train -> {t.out}"
        typer.echo(f"dataset  {cfg.dataset.path}")
        typer.echo(f"model    {model}")
        if cfg.draft is not None:
            typer.echo(f"draft    {cfg.draft}")
    typer.echo(f"fixed    {cfg.params or '{}'}; eval {cfg.eval.model_dump()}")
    typer.echo(
        f"per trial {cfg.resources.cpu} CPU / {cfg.resources.gpu} GPU; max_failures {cfg.max_failures}"
    )
    typer.echo(f"results  {cfg.results_dir} (mlflow: {cfg.mlflow_uri if cfg.tracking.mlflow else 'off'})")
    address = resolve_ray_address(cfg, ray_address)
    cluster = local_cluster(cfg) if address == "local" else None
    if cluster is None:
        typer.echo(f"cluster  {address}: resources not checked (a dry run only checks that it answers)")
    else:
        gpu = trial_gpu(cfg.resources.gpu, cluster[1])
        fits = min(cluster[0] // cfg.resources.cpu, cluster[1] // gpu if gpu else len(trials) or 1)
        typer.echo(
            f"cluster  local Ray: {cluster[0]:g} CPU / {cluster[1]:g} GPU (ray.num_cpus, else this "
            f"machine's); a trial asks for {cfg.resources.cpu:g} CPU / {gpu:g} GPU: "
            f"{f'up to {int(fits)} at once' if fits >= 1 else 'does not fit'}"
        )
    if trials:
        cols = list(dict.fromkeys(c for t in trials for c in t))  # arms differ in their parameters
        widths = [max(len(c), *(len(str(t.get(c, "-"))) for t in trials)) for c in cols]
        fmt = "  ".join(f"{{:>{w}}}" for w in [5, *widths])
        typer.echo(fmt.format("trial", *cols))
        for i, t in enumerate(trials):
            typer.echo(fmt.format(i, *(str(t.get(c, "-")) for c in cols)))
    # what the real run checks before it starts, one line each (the first failure exits 2)
    from genrec.platform.sweep import preflight
    from genrec.platform.sweep.reachability import sweep_destinations

    for line in sweep_destinations(cfg, address):
        typer.echo(line)
    if cfg.benchmark is None and cfg.model.train is None:  # a model still to train cannot be loaded yet
        preflight(cfg, ray_address)
        typer.echo("ok inputs: checkpoint, dataset and every trial's parameters load and fit the device")
    if cluster is not None:  # last, so the error is the last line: exit 2, as the real run would
        check_trial_resources(cfg.resources.cpu, gpu, *cluster)


def select_columns(columns: list[str], wanted: list[str], strict: bool = True) -> list[str]:
    """Column names matching the patterns (fnmatch, e.g. 'param_*'), in the order asked. strict: a
    plain name that matches nothing is an error (asked for by the user); else it is skipped (defaults
    that a kind of row, e.g. a benchmark's, does not have)."""
    from fnmatch import fnmatchcase

    out: list[str] = []
    for pattern in wanted:
        hits = [c for c in columns if fnmatchcase(c, pattern)]
        if strict and not hits and not any(ch in pattern for ch in "*?["):
            raise UserInputError(f"--columns: no column {pattern!r}; columns: {columns}")
        out += [c for c in hits if c not in out]
    return out


def compact_columns(df, all_params: bool = False):
    """The default table: parameter columns that take one value on every row shown are left out
    (unless all_params), and so are columns empty on every row."""
    from genrec.dashboards.analysis import param_columns, varying_param_columns

    varying = set(varying_param_columns(df))
    drop = [c for c in param_columns(df) if c not in varying and not all_params]
    drop += [c for c in df.columns if c not in drop and df[c].isna().all()]
    return df.drop(columns=drop)


def runs_command(
    experiment: Annotated[str | None, typer.Option(help="Only this experiment's rows.")] = None,
    decoder: Annotated[str | None, typer.Option(help="Only rows of this decoder.")] = None,
    where: Annotated[
        str | None,
        typer.Option(
            help="Column comparisons joined by and/or/not, e.g. "
            '"param_beam_width >= 20 and `recall@10` > 0.5" (backquote names with @; `col in [a, b]` too).'
        ),
    ] = None,
    columns: Annotated[
        str | None,
        typer.Option(help="Comma-separated columns or patterns (param_*, hr@*); 'all' for every column."),
    ] = None,
    sort: Annotated[str | None, typer.Option(help="Sort by this column (prefix '-' for descending).")] = None,
    results_dir: Annotated[Path, typer.Option(help="Results folder.")] = Path("runs/results"),
    fmt: Annotated[str, typer.Option("--format", help="table, csv or json (one object per line).")] = "table",
    all_params: Annotated[
        bool, typer.Option("--all-params", help="Every param_* column, not only those that vary.")
    ] = False,
) -> None:
    """List result rows from the Parquet store, filtered with pandas (by default: the parameters that
    vary, quality, latency; --columns all for every column)."""
    from genrec.platform.commands.common import check_folder
    from genrec.workloads.results_store import list_experiments, read_results

    if fmt not in ("table", "csv", "json"):
        raise UserInputError(f"--format must be table, csv or json, got {fmt!r}")
    # a mistyped folder is an error, not "no rows" with exit 0
    check_folder(
        "--results-dir",
        results_dir,
        "pass the results folder a sweep wrote (the experiment's tracking.results_dir, "
        "default runs/results in the directory the sweep ran from)",
    )
    if experiment is not None and experiment not in list_experiments(results_dir):
        raise UserInputError(
            f"no rows of experiment {experiment!r} in {results_dir.resolve()}; "
            f"experiments there: {list_experiments(results_dir)}"
        )
    df = read_results(results_dir, experiment)
    if df.empty:
        typer.echo(f"no result rows in {results_dir.resolve()}", err=True)
        return
    if decoder is not None:
        df = df[df["decoder"] == decoder]
    if where:
        from genrec.platform.commands.where import filter_rows

        df = filter_rows(df, where)  # column comparisons only: no eval, no @names, no attributes
    if sort:
        key = sort.lstrip("-")
        if key not in df.columns:
            raise UserInputError(f"--sort: no column {key!r}; columns: {list(df.columns)}")
        df = df.sort_values(key, ascending=not sort.startswith("-"), kind="stable")
    wanted = [c.strip() for c in columns.split(",")] if columns else list(DEFAULT_COLUMNS)
    if wanted != ["all"]:
        df = df[select_columns(list(df.columns), wanted, strict=columns is not None)]
    if columns is None:
        df = compact_columns(df, all_params)
    if fmt == "csv":
        typer.echo(df.to_csv(index=False), nl=False)
    elif fmt == "json":
        for record in json.loads(df.to_json(orient="records")):
            typer.echo(json.dumps(record))
    else:
        typer.echo(df.to_string(index=False, float_format=lambda x: f"{x:.4g}"))


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep_command)
    app.command("runs")(runs_command)
