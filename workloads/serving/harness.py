"""In-process open-loop serving harness: a batching policy + a decoder, Poisson arrivals, no Ray.

    python -m genrec.platform.serve.harness --model DIR --decoder xgr --beam-width 32 \\
        --policy slo fixed --max-batch-size 4 16 --rates 5 10 20 40 --duration-s 20 --repeats 3 \\
        --out results.json
    python -m genrec.platform.serve.harness --model DIR --beam-width 32 \\
        --arm xgr/fixed-4 xgr/slo-w0.05-b0.2 hf_beam/fixed-1 hf_beam/slo-w0.3-b0.35 \\
        --rates 200 250 300 --decoder-rates hf_beam=2,4,8 --repeats 3 --out results.json

The same policy object the Serve app drives (workloads/serving/xschedule.py: `slo` = xSchedule's
token-capacity batching with SLO quotas and admission control, `fixed` = `@serve.batch` with the
replica's bounded queue) and the same decoder `decode` call, in one thread: arrivals are drawn up front
(Poisson, seeded), every request is admitted at its arrival time or, when it arrives during a decode,
right after that decode with its true arrival time (the latency clock starts at arrival either way),
and a free worker runs `next_batch()` or sleeps until the next arrival or due time. No HTTP, no event
loop: this is the policy and the decoder alone, which is what the lent GPU machine (no Ray) can run.

Per request: answered (latency = answer time - arrival), rejected (admission: 503 in the app) or
timed out (still queued after `request_timeout_s`, dropped before decoding as the app does). A rate
meets the SLO when the P99 latency of answered requests is within it and at most `max_unanswered`
(1 %) of the requests were rejected or timed out (`meets_slo` in workloads/serving/slo.py, the load
generator's rule too), so a policy cannot pass by turning half the load away. Per arm (decoder x
policy x batch size), rates are tried in ascending order until one fails, then bisected `--refine`
times; the result is the highest rate that met the SLO with every lower one meeting it too.
`--repeats` alternates the arms (rotated order) so drift on a shared machine hits them alike; medians
and min-max are reported.

The `slo` arm's token budget, unless given, is calibrated per decoder before the runs: batches of
1, 2, 4, ... requests are timed, a service model (overhead + per-token cost) is fitted, and the budget
is the token count predicted to take `budget_share` of the SLO. The same fit seeds the policy's
service model, which keeps learning from every batch.

This module is the harness's command line (`main`, `parse_args`, `arms_of`, `rates_of`,
`format_table`). The code lives in:

- workloads/serving/open_loop.py: one load test: `LoadSpec`, `Record`, `poisson_arrivals`,
  `OpenLoop`, `run_open_loop`, `summarize`.
- workloads/serving/rate_search.py: the rate search: `Search`, `interleaved_search`, `aggregate`.
- workloads/serving/slo.py: the SLO rule `meets_slo`, the rate rounding `nice_rate` and
  `DEFAULT_MAX_UNANSWERED`, shared with the load generator
  (platform/loadgen/).
- workloads/serving/arms.py: the arms and running them on a model: `Arm`, `Options`, `Calibration`,
  `calibrate`, `arm_budget`, `make_policy`, `load_test`, `format_point`, `request_pool`,
  `decode_batch_fn`, `run_arms`, `open_replicas`.
- workloads/serving/replicas.py: arms served by several decoder processes (`--replicas 2`, or an arm
  label ending in `-r2`), each with its own policy, arrivals routed round robin: `ReplicaSetup`,
  `ReplicaPool`, `ReplicaError`, `route_round_robin`.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict

from genrec.workloads.serving.arms import (
    Arm,
    Options,
    open_replicas,
    run_arms,
)
from genrec.workloads.serving.replicas import ReplicaError, ReplicaSetup
from genrec.workloads.serving.xschedule import POLICIES

__all__ = ["arms_of", "format_table", "main", "parse_args", "rates_of"]


def parse_args(argv: list[str] | None, prog: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint folder (genrec train --out)")
    p.add_argument("--data", default=None, help="dataset folder (default: the checkpoint's)")
    p.add_argument("--decoder", nargs="+", default=["xgr"], help="one or more decoders (arms)")
    p.add_argument("--policy", nargs="+", default=["slo"], choices=POLICIES)
    p.add_argument("--max-batch-size", type=int, nargs="+", default=[16], help="fixed: one arm each")
    p.add_argument("--token-budget", type=int, nargs="+", default=[0], help="slo: 0 = calibrated")
    p.add_argument("--wait-share", type=float, nargs="+", default=[0.3], help="slo: quota / SLO")
    p.add_argument("--budget-share", type=float, nargs="+", default=[0.35], help="slo: batch time / SLO")
    p.add_argument(
        "--replicas",
        type=int,
        nargs="+",
        default=[1],
        help="decoder processes per arm, each with its own policy (one arm each; arrivals round robin)",
    )
    p.add_argument(
        "--arm",
        nargs="+",
        default=None,
        help="explicit arms instead of the decoder x policy product: DECODER/fixed-N, "
        "DECODER/slo-wSHARE-bSHARE or DECODER/slo-wSHARE-tTOKENS, each optionally ending in -rREPLICAS "
        "(e.g. xgr/fixed-4 hf_beam/slo-w0.3-b0.35 xgr/fixed-8-r2)",
    )
    p.add_argument("--rates", type=float, nargs="+", default=[5, 10, 20, 40, 80])
    p.add_argument(
        "--decoder-rates",
        nargs="+",
        default=[],
        metavar="DECODER=R1,R2,...",
        help="rates for one decoder's arms instead of --rates (e.g. hf_beam=2,4,8 xgr=100,200,300)",
    )
    p.add_argument("--refine", type=int, default=2, help="bisection steps after the first failing rate")
    p.add_argument("--repeats", type=int, default=1, help="alternate the arms this many times")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: leave as is)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    for name, default in asdict(Options()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def arms_of(a: argparse.Namespace) -> list[Arm]:
    """--arm as given, else decoder x policy x replicas: each fixed arm once per --max-batch-size, each
    slo arm once per budget and share (a given --token-budget makes --budget-share moot)."""
    if a.arm:
        return list(dict.fromkeys(Arm.parse(label) for label in a.arm))
    if min(a.replicas) < 1:
        raise ValueError(f"--replicas must be >= 1, got {min(a.replicas)}")
    arms = []
    for decoder, replicas in itertools.product(a.decoder, a.replicas):
        if "fixed" in a.policy:
            arms += [Arm(decoder, "fixed", max_batch_size=n, replicas=replicas) for n in a.max_batch_size]
        if "slo" in a.policy:
            for budget in a.token_budget:
                shares = a.budget_share if not budget else [Arm.budget_share]
                arms += [
                    Arm(decoder, "slo", token_budget=budget, wait_share=w, budget_share=b, replicas=replicas)
                    for w in a.wait_share
                    for b in shares
                ]
    return list(dict.fromkeys(arms))


def rates_of(a: argparse.Namespace, arms: Sequence[Arm]) -> Sequence[float] | dict[str, list[float]]:
    """--rates, or {decoder: rates} when --decoder-rates gives some decoders their own."""
    if not a.decoder_rates:
        return a.rates
    own = {}
    for spec in a.decoder_rates:
        decoder, _, values = spec.partition("=")
        try:
            own[decoder] = [float(v) for v in values.split(",") if v]
        except ValueError:
            own[decoder] = []
        if not own[decoder] or min(own[decoder]) <= 0:
            raise ValueError(f"--decoder-rates {spec!r}: write DECODER=R1,R2,... with positive rates")
    return {arm.decoder: own.get(arm.decoder, a.rates) for arm in arms}


def format_table(result: dict) -> str:
    lines = [f"{'arm':>24}  {'best rate (median)':>18}  {'min-max':>13}  {'p99 at best':>11}  budget"]
    for label, r in result["arms"].items():
        more = "+" if r["hit_limit"] else ""
        lines.append(
            f"{label:>24}  {r['best_rate_median']:>17g}{more:1}  "
            f"{r['best_rate_min']:>6g}-{r['best_rate_max']:<6g}  {r['p99_ms_at_best_median']:>8.1f} ms  "
            f"{r['token_budget'] or '-'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "python -m genrec.workloads.serving.harness") -> int:
    import json

    import torch

    from genrec.workloads.errors import UserInputError
    from genrec.workloads.evaluation import load_context
    from genrec.workloads.io import atomic_write_text
    from genrec.workloads.results import current_environment

    a = parse_args(argv, prog)
    if a.threads:
        torch.set_num_threads(a.threads)
    opts = Options(**{name: getattr(a, name) for name in asdict(Options())})
    try:
        ctx, ds, _ = load_context(a.model, a.data, a.device)
        histories = [ex.history for ex in ds.eval_examples("test")]
        load_before = os.getloadavg()
        arms = arms_of(a)
        setup = ReplicaSetup(
            str(a.model), tuple(dict.fromkeys(x.decoder for x in arms)), opts.beam_width, opts.k,
            a.data, a.device, a.threads,
        )  # fmt: skip
        with open_replicas(arms, setup) as replicas:
            result = run_arms(
                ctx, histories, arms, opts, rates_of(a, arms), a.refine, a.repeats,
                lambda m: print(m, flush=True), replicas,
            )  # fmt: skip
    except (UserInputError, ValueError, ReplicaError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result.update(
        command=f"{prog} " + " ".join(sys.argv[1:] if argv is None else argv),
        options=asdict(opts),
        model=str(a.model),
        dataset=str(ds.root),
        env=asdict(current_environment(ctx.device)),
        load_avg_before=list(load_before),
        load_avg_after=list(os.getloadavg()),
    )
    print(format_table(result))
    if a.out:
        atomic_write_text(a.out, json.dumps(result, indent=2, default=float) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
