"""One serving arm as a registry benchmark (`benchmark: xgr_serving`): the in-process harness's rate
search for a decoder x batching policy x replica count at one beam width, so a sweep over policy, beam
width, replicas and decoder is an experiment file (studies/xgr/experiments/xgr_serving.yaml) and each
trial is one load-test series.

`serving_point` loads the checkpoint, runs the harness (workloads/serving/harness.py: Poisson arrivals,
the batching policy, the decoder's decode, no Ray) over `rates` ("5,10,20": ascending until the first
failure, then `refine` bisections) and returns the highest rate meeting P99 <= `slo_ms` with at most
1 % unanswered, plus the figures at that rate. No Ray, MLflow or pydantic: also runs on the lent GPU machine.
"""

from __future__ import annotations

import math

from genrec.workloads.errors import UserInputError
from genrec.workloads.serving.slo import DEFAULT_SLO_MS

METRICS = (
    "best_rate",
    "p50_ms_at_best",
    "p99_ms_at_best",
    "goodput_at_best",
    "batch_size_at_best",
    "token_budget",
    "service_overhead_ms",
    "service_us_per_token",
)


def parse_rates(rates: str) -> list[float]:
    try:
        values = [float(r) for r in rates.replace(" ", "").split(",") if r]
    except ValueError:
        values = []
    if not values or any(not v > 0 for v in values):
        raise UserInputError(
            f"rates must be positive requests/s separated by commas, e.g. '5,10,20'; got {rates!r}"
        )
    return values


def serving_point(
    model: str,
    data: str = "",
    decoder: str = "xgr",
    beam_width: int = 32,
    k: int = 10,
    policy: str = "slo",
    max_batch_size: int = 16,
    token_budget: int = 0,
    wait_share: float = 0.3,
    budget_share: float = 0.35,
    slo_ms: float = DEFAULT_SLO_MS,
    rates: str = "5,10,20,40,80",
    refine: int = 2,
    duration_s: float = 15.0,
    warmup_s: float = 2.0,
    seed: int = 0,
    threads: int = 1,
    device: str = "cpu",
    replicas: int = 1,
) -> dict:
    """The highest open-loop rate meeting the SLO for one decoder x policy x replica count, and its
    figures. With `replicas` > 1 that many decoder processes (each `threads` torch threads, its own
    policy) share the arrivals round robin (workloads/serving/replicas.py)."""
    import torch

    from genrec.workloads.evaluation import load_context
    from genrec.workloads.serving.arms import Arm, Options, open_replicas, run_arms
    from genrec.workloads.serving.replicas import ReplicaSetup

    if threads:
        torch.set_num_threads(threads)
    ctx, ds, _ = load_context(model, data or None, device)
    arm = Arm(decoder, policy, max_batch_size, token_budget, wait_share, budget_share, replicas)
    opts = Options(
        beam_width=beam_width, k=k, slo_ms=slo_ms, duration_s=duration_s, warmup_s=warmup_s, seed=seed
    )
    histories = [ex.history for ex in ds.eval_examples("test")]
    setup = ReplicaSetup(model, (decoder,), beam_width, k, data or None, device, threads)
    with open_replicas([arm], setup) as pool:
        result = run_arms(ctx, histories, [arm], opts, parse_rates(rates), refine, 1, replicas=pool)
    return point_metrics(result, arm, model, ds.root.name)


def point_metrics(result: dict, arm, model: str, dataset_name: str) -> dict:
    """The flat row a sweep stores: the best rate, the figures at it, the calibrated service model."""
    r = result["arms"][arm.label]
    run = r["repeats"][0]
    at_best = next((p for p in run["points"] if p["rate"] == run["best_rate"]), {})
    cal = result["calibration"].get(arm.decoder, {})
    return {
        "best_rate": run["best_rate"] or 0.0,
        "hit_limit": run["hit_limit"],
        "p50_ms_at_best": at_best.get("p50_ms", math.nan),
        "p99_ms_at_best": at_best.get("p99_ms", math.nan),
        "goodput_at_best": at_best.get("goodput_rps", math.nan),
        "batch_size_at_best": at_best.get("batch_size_mean", math.nan),
        "token_budget": r["token_budget"],
        "service_overhead_ms": cal.get("overhead_s", math.nan) * 1e3,
        "service_us_per_token": cal.get("s_per_token", math.nan) * 1e6,
        "rate_points": len(run["points"]),
        "replicas": arm.replicas,
        "model": model,
        "dataset_name": dataset_name,
    }
