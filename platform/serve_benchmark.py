"""Dynamic batching on vs off, same deployment, same process: the highest rate under a P99 SLO.

    python -m genrec.platform.serve_benchmark --model runs/models/tiny --beam-width 20 --slo-ms 200

Starts the Serve app (local Ray), then for each arm (batching off = max_batch_size 1, batching
on = --max-batch-size) reconfigures the running replica live (same process, same loaded model) and
runs the load generator's rate search (open loop, Poisson, geometric growth then bisection). Arms
alternate `--repeats` times so drift on a shared machine hits both. It also measures Serve's own
overhead at low load (closed loop, one request at a time: end-to-end latency minus the decoder's
time). With several `--ingress` values (Serve's Python proxy, HAProxy), each repeat starts a fresh
local Ray per ingress, since Serve fixes its ingress when Ray starts.

Every load test is a result row of experiment `--experiment` (Parquet + MLflow); the summary
goes to `--out` as JSON and is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

from genrec.platform.loadgen.capacity import find_max_rate, rate_measure
from genrec.platform.loadgen.format import format_sweep
from genrec.platform.loadgen.requests import LoadConfig
from genrec.platform.loadgen.run import Tracking, prepare, run_context, run_one
from genrec.platform.serve.config import ServeConfig
from genrec.platform.serve.ingress import HANDLER_LOOPS, INGRESSES, resolve_ingress
from genrec.platform.serve.server import HttpSettings, reconfigure, start_server, stop_server
from genrec.workloads.errors import UserInputError
from genrec.workloads.io import atomic_write_text
from genrec.workloads.results import command_line, git_commit
from genrec.workloads.serving.slo import DEFAULT_SLO_MS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="runs/models/tiny")
    p.add_argument("--data", default=None, help="dataset folder (default: the checkpoint's)")
    p.add_argument("--decoder", default="beam")
    p.add_argument("--beam-width", type=int, default=20)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--slo-ms", type=float, default=DEFAULT_SLO_MS)
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--batch-wait-ms", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the replica")
    p.add_argument("--duration", type=float, default=15.0, help="seconds per rate (after warm-up)")
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--start-rate", type=float, default=20.0)
    p.add_argument("--max-rate", type=float, default=2000.0)
    p.add_argument("--refine-steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1, help="alternate the arms this many times")
    p.add_argument(
        "--floors-only",
        action="store_true",
        help="only the floors: decoder alone (batch 1 vs max), plain uvicorn and Serve no-op latency",
    )
    p.add_argument("--overhead-requests", type=int, default=200, help="low-load requests per arm")
    p.add_argument(
        "--cpu-split-rates",
        type=float,
        nargs="*",
        default=[],
        help="after each arm's rate search, one load test per rate (up to the arm's max) that records CPU "
        "ms per request of the client, the ingress, the replica and the rest of the machine (Linux)",
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--ingress",
        nargs="+",
        default=["auto"],
        choices=INGRESSES,
        help="what receives HTTP (several: each is measured, alternating; e.g. --ingress proxy haproxy)",
    )
    p.add_argument(
        "--handler-loop",
        nargs="+",
        default=["thread"],
        choices=HANDLER_LOOPS,
        help="where replicas run the app's handlers: thread (Serve's default) or replica (its main loop); "
        "several are measured like several ingresses",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--experiment", default="serve_batching")
    p.add_argument("--results-dir", default="runs/results")
    p.add_argument("--no-mlflow", action="store_true")
    p.add_argument("--out", default="docs/results/serve_batching.json")
    return p.parse_args(argv)


def decoder_capacity(a: argparse.Namespace, batch: int, reps: int = 20) -> dict:
    """Requests per second of the decoder alone (in this process, no HTTP) at batch 1 and `batch`:
    the most batching can give before Serve's per-request costs."""
    import torch

    from genrec.platform.actors import DecoderHost, HostConfig

    torch.set_num_threads(a.threads)
    host = DecoderHost(
        HostConfig(
            model=a.model,
            data=a.data,
            threads=a.threads,
            decoders=(a.decoder,),
            defaults={a.decoder: {"beam_width": a.beam_width, "k": a.k}},
        )
    )
    out = {}
    for name, b in (("batch_1_rps", 1), ("batch_max_rps", batch)):
        histories = host.sample_histories(b, seed=a.seed)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            host.decode(histories)
            times.append(time.perf_counter() - t0)
        out[name] = b / statistics.median(times)
    out["ratio"] = out["batch_max_rps"] / out["batch_1_rps"]
    return out


def noop_latency(url: str, n: int = 200) -> float:
    """Median latency of GET /health: Serve's own floor for an endpoint that does no work."""
    from genrec.platform.serve.server import get_json

    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        get_json(f"{url}/health")
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[n // 10 :])


def plain_http_floor(n: int = 300) -> float:
    """Median latency of a no-op FastAPI endpoint on plain uvicorn in this process (no Ray): what HTTP
    itself costs on this machine, to set Serve's floor against."""
    import socket
    import threading

    import uvicorn
    from fastapi import FastAPI

    from genrec.platform.serve.server import get_json

    app = FastAPI()

    @app.get("/noop")
    async def noop() -> dict:
        return {"ok": True}

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            get_json(f"http://127.0.0.1:{port}/noop")
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times[n // 10 :])
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc), 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (not idle or waiting on I/O) so far."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def serving_processes(replica_pid: int) -> dict[int, str]:
    """pid -> role of the processes a request passes through: the client (this process), the replica,
    and the ingress (HAProxy or Serve's ProxyActor; HAProxy restarts on redeploys, so look again)."""
    roles = {os.getpid(): "client", replica_pid: "replica"}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                comm = (proc / "comm").read_text().strip()
            except OSError:
                continue
            if comm == "haproxy" or "ProxyActor" in comm:
                roles[int(proc.name)] = "ingress"
    return roles


def cpu_split(base: LoadConfig, histories, ctx, tracking: Tracking, rate: float) -> dict:
    """One open-loop load test at `rate`: CPU milliseconds per request spent by the client, the ingress,
    the replica and everything else on the machine (Ray's own processes, the OS). On a machine shared by
    client and server, this shows which process runs out of CPU first."""
    roles = serving_processes(int(ctx.health["pid"]))
    before, busy0 = {pid: process_cpu_s(pid) for pid in roles}, machine_busy_cpu_s()
    res = run_one(replace(base, rate=rate), histories, ctx, tracking)
    after, busy1 = {pid: process_cpu_s(pid) for pid in roles}, machine_busy_cpu_s()
    requests = max(1, res.summary.sent + res.summary.warmup)
    split = dict.fromkeys(("client", "ingress", "replica"), 0.0)
    for pid, role in roles.items():
        split[role] += (after[pid] - before[pid]) * 1e3 / requests
    split["other"] = (busy1 - busy0) * 1e3 / requests - sum(split.values())
    return {
        "rate": rate,
        "mean_batch": res.summary.batch_size_mean,
        "decoder_call_p50_ms": res.summary.decoder_p50_ms,
        "p99_ms": res.summary.latency_ms["p99"],
        "cpu_ms_per_request": split,
    }


def measure_arm(
    a: argparse.Namespace, base: LoadConfig, histories, ctx, tracking: Tracking, tag: str
) -> dict:
    """One batching arm on the running deployment: low-load overhead, then the rate search."""
    # Serve's own overhead at low load: one request at a time
    low = replace(
        base,
        mode="closed",
        concurrency=1,
        warmup_s=0.0,
        warmup_requests=20,
        duration_s=a.overhead_requests / 50.0,  # about that many requests at ~20 ms each
    )
    res = run_one(low, histories, ctx, tracking)
    print(
        f"[{tag}] low load: e2e p50 {res.summary.latency_ms['p50']:.2f} ms, "
        f"decoder call p50 {res.summary.decoder_p50_ms:.2f} ms, "
        f"overhead p50 {res.summary.overhead_p50_ms:.2f} ms",
        flush=True,
    )
    measure = rate_measure(base, histories, ctx, tracking, progress=None)
    search = find_max_rate(measure, a.start_rate, a.max_rate, refine_steps=a.refine_steps)
    print(f"[{tag}]\n" + format_sweep(search, a.slo_ms, base.max_unanswered_rate), flush=True)
    return {
        "overhead_p50_ms": res.summary.overhead_p50_ms,
        "max_rate": search.best_rate,
        "search": [
            {
                "rate": p.rate,
                "p99_ms": p.p99_ms,
                "unanswered_rate": p.unanswered_rate,
                "meets": p.meets,
                "mean_batch": p.result.summary.batch_size_mean,
                "throughput_rps": p.result.summary.throughput_rps,
            }
            for p in sorted(search.points, key=lambda p: p.rate)
        ],
    }


def ratio_of_medians(num: list, den: list) -> float | None:
    num, den = [r or 0.0 for r in num], [r or 0.0 for r in den]
    return statistics.median(num) / statistics.median(den) if num and den and min(den) > 0 else None


def variant_names(ingresses: list[str], loops: list[str]) -> list[str]:
    """'haproxy' for Serve's default handler loop, 'haproxy+replica-loop' for handlers on the main loop."""
    return list(
        dict.fromkeys(i if loop == "thread" else f"{i}+{loop}-loop" for i in ingresses for loop in loops)
    )


def variant_settings(name: str) -> tuple[str, str]:
    ingress, _, loop = name.partition("+")
    return ingress, loop.removesuffix("-loop") or "thread"


def format_split(split: dict) -> str:
    parts = ", ".join(f"{k} {v:.2f}" for k, v in split["cpu_ms_per_request"].items())
    return (
        f"{split['rate']:g} req/s, mean batch {split['mean_batch']:.1f}, decoder call p50 "
        f"{split['decoder_call_p50_ms']:.2f} ms; CPU ms per request: {parts}"
    )


def batching_on(a: argparse.Namespace) -> dict:
    return {"max_batch_size": a.max_batch_size, "batch_wait_timeout_s": a.batch_wait_ms / 1e3}


def serve_config(a: argparse.Namespace) -> ServeConfig:
    """The deployment both arms share; it starts with batching on."""
    return ServeConfig(
        model=Path(a.model),
        data=Path(a.data) if a.data else None,
        decoders=[a.decoder],
        defaults={a.decoder: {"beam_width": a.beam_width, "k": a.k}},
        constraint_sets={},
        threads=a.threads,
        max_queued_requests=256,
        batching=batching_on(a),
    )


def batching_arms(a: argparse.Namespace) -> dict[str, dict]:
    """Arm name -> the live batching settings it reconfigures the replica to."""
    return {
        "batching=off": {"max_batch_size": 1, "batch_wait_timeout_s": 0.0},
        "batching=on": batching_on(a),
    }


def measure_floors(a: argparse.Namespace) -> tuple[dict, float]:
    """The floors measured without Serve: the decoder alone and plain uvicorn's no-op latency."""
    decoder_alone = decoder_capacity(a, a.max_batch_size)
    print(
        f"decoder alone (no Serve), requests/s: batch 1 {decoder_alone['batch_1_rps']:.0f}, batch "
        f"{a.max_batch_size} {decoder_alone['batch_max_rps']:.0f} ({decoder_alone['ratio']:.2f}x)",
        flush=True,
    )
    plain_floor = plain_http_floor()
    print(f"plain uvicorn floor: no-op GET p50 {plain_floor:.2f} ms", flush=True)
    return decoder_alone, plain_floor


def result_skeleton(
    a: argparse.Namespace,
    argv: list[str] | None,
    variants: list[str],
    arm_names: list[str],
    decoder_alone: dict,
    plain_floor: float,
) -> dict:
    """The JSON summary before any Serve run: the setup, the floors, and empty lists per variant and
    arm that every repeat appends to."""
    return {
        "command": command_line("genrec.platform.serve_benchmark", argv),
        "model": a.model,
        "decoder": a.decoder,
        "beam_width": a.beam_width,
        "slo_ms": a.slo_ms,
        "git_commit": git_commit(),
        "decoder_alone": decoder_alone,
        "plain_uvicorn_noop_p50_ms": plain_floor,
        "ingresses": {
            ing: {
                "noop_endpoint_p50_ms": [],
                "arms": {
                    name: {"max_rates": [], "overhead_p50_ms": [], "searches": [], "cpu_split": []}
                    for name in arm_names
                },
            }
            for ing in variants
        },
    }


def load_config(a: argparse.Namespace, url: str) -> LoadConfig:
    return LoadConfig(
        url=url,
        k=a.k,
        slo_ms=a.slo_ms,
        duration_s=a.duration,
        warmup_s=a.warmup_s,
        seed=a.seed,
        timeout_s=max(10.0, 5 * a.slo_ms / 1e3),
    )


def run_arm(
    a: argparse.Namespace,
    base: LoadConfig,
    histories,
    ctx,
    tracking: Tracking,
    record: dict,
    tag: str,
    rep: int,
) -> None:
    """One arm of one (repeat, variant), appended to its `record`: the rate search, then a CPU split at
    each --cpu-split-rates rate the arm sustained."""
    arm = measure_arm(a, base, histories, ctx, tracking, tag=tag)
    record["overhead_p50_ms"].append(arm["overhead_p50_ms"])
    record["max_rates"].append(arm["max_rate"])
    record["searches"].append(arm["search"])
    for rate in a.cpu_split_rates:
        if arm["max_rate"] and rate <= arm["max_rate"]:
            split = cpu_split(base, histories, ctx, tracking, rate)
            record["cpu_split"].append({"repeat": rep, **split})
            print(f"[{tag}] {format_split(split)}", flush=True)


def run_variant(
    a: argparse.Namespace, cfg: ServeConfig, arms: dict, tracking: Tracking, out: dict, ing: str, rep: int
) -> None:
    """Repeat `rep` of variant `ing`, into `out`: a fresh local Ray serving through its ingress, Serve's
    no-op floor, then each batching arm (none with --floors-only) on the same replica."""
    record = out["ingresses"][ing]
    ingress, loop = variant_settings(ing)
    url = start_server(cfg, HttpSettings(port=a.port, ingress=ingress, handler_loop=loop))
    try:
        base = load_config(a, url)
        health, dataset, histories = prepare(base, a.data)
        floor = noop_latency(url)
        record["noop_endpoint_p50_ms"].append(floor)
        print(f"[{ing} rep {rep}] Serve floor: GET /health p50 {floor:.2f} ms", flush=True)
        out["device"], out["threads"] = health.get("device"), health.get("threads")
        for name, live in [] if a.floors_only else arms.items():
            reconfigure(cfg, **live)
            ctx = run_context(a.experiment, name, dataset, {**health, **live})
            run_arm(a, base, histories, ctx, tracking, record["arms"][name], f"{ing} {name} rep {rep}", rep)
    finally:
        stop_server(shutdown_ray=True)


def add_ratios(out: dict) -> None:
    """Each variant's median max rate with batching on over off (None without both)."""
    for record in out["ingresses"].values():
        record["ratio_on_over_off"] = ratio_of_medians(
            record["arms"]["batching=on"]["max_rates"], record["arms"]["batching=off"]["max_rates"]
        )


def print_summary(out: dict, slo_ms: float) -> None:
    for ing, record in out["ingresses"].items():
        floors = [round(x, 2) for x in record["noop_endpoint_p50_ms"]]
        print(f"ingress {ing}: Serve no-op GET /health p50 {floors} ms")
        for name, arm in record["arms"].items():
            if arm["max_rates"]:
                print(
                    f"  {name}: max rate under P99 <= {slo_ms:g} ms: {arm['max_rates']} req/s; "
                    f"low-load serve overhead p50 {[round(x, 2) for x in arm['overhead_p50_ms']]} ms"
                )
        if record["ratio_on_over_off"] is not None:
            print(f"  ratio (median max rate, on / off): {record['ratio_on_over_off']:.2f}")


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    ingresses = [resolve_ingress(name) for name in a.ingress]  # bad or unavailable ones fail before any work
    if a.cpu_split_rates and not Path("/proc/stat").is_file():
        raise UserInputError("--cpu-split-rates reads CPU times from /proc (Linux only); leave it out here")
    cfg, arms = serve_config(a), batching_arms(a)
    tracking = Tracking(Path(a.results_dir), mlflow=not a.no_mlflow)
    decoder_alone, plain_floor = measure_floors(a)
    variants = variant_names(ingresses, a.handler_loop)
    out = result_skeleton(a, argv, variants, list(arms), decoder_alone, plain_floor)
    t0 = time.time()
    # Serve fixes its ingress when Ray starts, so each (repeat, ingress) is a fresh local Ray; ingresses
    # alternate within a repeat and batching arms within an ingress, so drift hits every arm alike.
    for rep in range(1 if a.floors_only else a.repeats):
        for ing in variants:
            run_variant(a, cfg, arms, tracking, out, ing, rep)
    out["wall_s"] = time.time() - t0
    add_ratios(out)
    print_summary(out, a.slo_ms)
    atomic_write_text(Path(a.out), json.dumps(out, indent=2) + "\n")
    print(f"wrote {a.out}")
    return out


if __name__ == "__main__":
    try:
        main()
    except UserInputError as e:  # bad options: the message, not a traceback
        raise SystemExit(f"error: {e}") from None
