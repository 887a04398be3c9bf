"""`genrec loadtest`: open/closed-loop HTTP load against the Serve app, one run or a rate sweep.

aiohttp, torch and the dataset code are imported inside the command so `genrec --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from genrec.workloads.errors import UserInputError
from genrec.workloads.serving.slo import DEFAULT_MAX_UNANSWERED, DEFAULT_SLO_MS

DEFAULT_RESULTS_DIR = "runs/results"  # same default as genrec.platform.tracking


def parse_rates(values: list[str] | None) -> list[float]:
    """['10,20', '40'] -> [10.0, 20.0, 40.0]: comma-separated and/or repeated values."""
    rates: list[float] = []
    for value in values or []:
        for part in value.split(","):
            if not part.strip():
                continue
            try:
                rate = float(part)
            except ValueError:
                raise UserInputError(
                    f"--sweep-rates {value!r}: expected requests/s numbers, e.g. --sweep-rates 10,20,40"
                ) from None
            if rate <= 0:
                raise UserInputError(f"--sweep-rates {value!r}: rates must be > 0 requests/s")
            rates.append(rate)
    return sorted(set(rates))


def loadtest_command(
    url: Annotated[str, typer.Option(help="Base URL of the Serve app.")] = "http://127.0.0.1:8000",
    rate: Annotated[float, typer.Option(help="Open loop: target requests per second.")] = 10.0,
    duration: Annotated[
        float, typer.Option(help="Measured seconds (per rate in a sweep), after warm-up.")
    ] = 30.0,
    slo_ms: Annotated[
        float, typer.Option(help="Latency SLO in ms: goodput counts answers within it; P99 must meet it.")
    ] = DEFAULT_SLO_MS,
    data: Annotated[
        Path | None,
        typer.Option(
            help="Dataset folder whose test histories are sent (default: the one GET /health names)."
        ),
    ] = None,
    mode: Annotated[
        str, typer.Option(help="open (arrivals at --rate, never waiting) or closed (--concurrency workers).")
    ] = "open",
    concurrency: Annotated[int, typer.Option(help="Closed loop: requests outstanding at once.")] = 8,
    burstiness: Annotated[
        float,
        typer.Option(help="Open loop: CV of inter-arrival gaps (gamma); 1 = Poisson, > 1 = bursty."),
    ] = 1.0,
    warmup_s: Annotated[float, typer.Option(help="Warm-up seconds: sent, recorded, not counted.")] = 2.0,
    warmup_requests: Annotated[int, typer.Option(help="Also treat the first N requests as warm-up.")] = 0,
    k: Annotated[int, typer.Option("--k", help="Items per recommendation.")] = 10,
    decoder: Annotated[
        str | None, typer.Option(help="Decoder to ask for (default: the app's default decoder).")
    ] = None,
    beam_width: Annotated[
        int | None, typer.Option(help="Beam width to ask for (default: the app's).")
    ] = None,
    constraint: Annotated[
        str | None,
        typer.Option(help="Constraint to ask for: a set of the deployment (GET /constraint-sets) or a rule."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the arrival times and of the histories drawn.")] = 0,
    timeout_s: Annotated[float, typer.Option(help="Client timeout per request (counts as timeout).")] = 10.0,
    max_rejection: Annotated[
        float,
        typer.Option(help="SLO also needs rejected + failed + timed-out requests at most this fraction."),
    ] = DEFAULT_MAX_UNANSWERED,
    experiment: Annotated[str, typer.Option(help="Experiment name of the result rows.")] = "loadtest",
    label: Annotated[
        str, typer.Option(help="Free text stored in the rows to tell setups apart, e.g. batching=on.")
    ] = "",
    results_dir: Annotated[
        Path, typer.Option(help="Results folder (rows under parquet/, requests under loadtest/).")
    ] = Path(DEFAULT_RESULTS_DIR),
    no_mlflow: Annotated[bool, typer.Option("--no-mlflow", help="Write Parquet only, not MLflow.")] = False,
    mlflow_uri: Annotated[
        str | None, typer.Option(help="MLflow tracking URI (default: sqlite under --results-dir).")
    ] = None,
    sweep_rates: Annotated[
        list[str] | None,
        typer.Option(help="Run each of these rates (comma-separated, e.g. 10,20,40) and find the best."),
    ] = None,
    find_max_rate: Annotated[
        bool,
        typer.Option("--find-max-rate", help="Search the highest rate meeting the SLO (grow, then bisect)."),
    ] = False,
    start_rate: Annotated[float, typer.Option(help="--find-max-rate: first rate.")] = 5.0,
    max_rate: Annotated[float, typer.Option(help="--find-max-rate: never go above this rate.")] = 1000.0,
    growth: Annotated[
        float, typer.Option(help="--find-max-rate: rate multiplier while the SLO holds.")
    ] = 2.0,
    refine_steps: Annotated[int, typer.Option(help="--find-max-rate: bisection steps after a failure.")] = 3,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress lines.")] = False,
) -> None:
    """Send recommendation requests to a running `genrec serve` app and report latency percentiles,
    throughput, goodput under an SLO, rejections and Serve overhead; optionally sweep the rate."""
    # find_max_rate / sweep_rates are this command's options here; run_rate_search calls the searches
    from genrec.platform.loadgen.capacity import rate_measure
    from genrec.platform.loadgen.format import format_summary
    from genrec.platform.loadgen.requests import LoadConfig
    from genrec.platform.loadgen.run import Tracking, prepare, run_context, run_one

    rates = parse_rates(sweep_rates)
    check_loadtest_options(rates, find_max_rate, start_rate, max_rate, growth, refine_steps, data, mode)
    cfg = LoadConfig(
        url=url,
        mode=mode,
        rate=rates[0] if rates else start_rate if find_max_rate else rate,
        concurrency=concurrency,
        burstiness=burstiness,
        duration_s=duration,
        warmup_s=warmup_s,
        warmup_requests=warmup_requests,
        k=k,
        decoder=decoder,
        beam_width=beam_width,
        constraint=constraint,
        seed=seed,
        timeout_s=timeout_s,
        slo_ms=slo_ms,
        max_unanswered_rate=max_rejection,
    ).validate()
    health, dataset, histories = prepare(cfg, data)
    ctx = run_context(experiment, label, dataset, health)
    tracking = Tracking(results_dir, mlflow=not no_mlflow, mlflow_uri=mlflow_uri)
    progress = None if quiet else (lambda line: typer.echo(line, err=True))

    if rates or find_max_rate:
        measure = rate_measure(cfg, histories, ctx, tracking, progress)
        search = run_rate_search(measure, rates, start_rate, max_rate, growth, refine_steps)
        print_rate_search(search, url, duration, experiment, slo_ms, max_rejection)
        last = search.points[-1].result
    else:
        last = run_one(cfg, histories, ctx, tracking, progress=progress)
        typer.echo(format_summary(last))
    print_where_results_went(last, experiment, results_dir, tracking, mlflow_uri)


def check_loadtest_options(
    rates: list[float],
    find_max_rate: bool,
    start_rate: float,
    max_rate: float,
    growth: float,
    refine_steps: int,
    data: Path | None,
    mode: str,
) -> None:
    """Option combinations and the --find-max-rate settings, checked before the app is contacted."""
    from genrec.platform.commands.common import check_folder

    if find_max_rate:
        check_search_settings(start_rate, max_rate, growth, refine_steps)
    if data is not None:
        check_folder("--data", data, "pass a dataset folder, or leave --data out to use the app's")
    if rates and find_max_rate:
        raise UserInputError("use either --sweep-rates or --find-max-rate, not both")
    if (rates or find_max_rate) and mode != "open":
        raise UserInputError(
            "rate sweeps are open-loop: drop --mode closed (or run single closed-loop tests)"
        )


def check_search_settings(start_rate: float, max_rate: float, growth: float, refine_steps: int) -> None:
    """--start-rate, --max-rate, --growth and --refine-steps of --find-max-rate."""
    from genrec.platform.commands.common import check_range

    if not start_rate > 0:
        raise UserInputError(f"--start-rate {start_rate}: must be > 0 requests/s")
    check_range("--max-rate", max_rate, start_rate, note="at least --start-rate")
    if not growth > 1:
        raise UserInputError(f"--growth {growth}: must be > 1 (the rate multiplier while the SLO holds)")
    check_range("--refine-steps", refine_steps, 0)


def run_rate_search(
    measure, rates: list[float], start_rate: float, max_rate: float, growth: float, refine_steps: int
):
    """--sweep-rates: each of the rates; --find-max-rate: grow from --start-rate, then bisect."""
    from genrec.platform.loadgen.capacity import find_max_rate, sweep_rates

    if rates:
        return sweep_rates(measure, rates)
    return find_max_rate(measure, start_rate, max_rate, growth, refine_steps)


def print_rate_search(
    search, url: str, duration: float, experiment: str, slo_ms: float, max_rejection: float
) -> None:
    from genrec.platform.loadgen.format import format_sweep

    typer.echo(
        f"rate sweep against {url} ({len(search.points)} rates, {duration:g} s each, experiment "
        f"{experiment}):"
    )
    typer.echo(format_sweep(search, slo_ms, max_rejection))


def print_where_results_went(
    last, experiment: str, results_dir: Path, tracking, mlflow_uri: str | None
) -> None:
    """The requests file, the result rows (with the commands that read them) and the MLflow store."""
    from genrec.platform.commands.common import command_hint, results_dir_args

    typer.echo(f"requests -> {last.requests_file.parent}")
    follow = ["--experiment", experiment, *results_dir_args(results_dir)]  # as run: same rows
    typer.echo(
        f"result rows -> {last.row_file.parent}  ({command_hint('genrec', 'runs', *follow)}; "
        f"{command_hint('genrec', 'report', *follow)})"
    )
    if tracking.mlflow:
        from genrec.platform.mlflow_store import sqlite_uri

        uri = mlflow_uri or sqlite_uri(results_dir)
        typer.echo(
            f"mlflow: mlflow ui --backend-store-uri {uri}" if uri.startswith("sqlite") else f"mlflow: {uri}"
        )


def register(app: typer.Typer) -> None:
    app.command("loadtest")(loadtest_command)
