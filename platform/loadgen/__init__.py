"""Load generator for the Serve app: open-loop (Poisson or bursty) and closed-loop HTTP load.

Open loop: request arrival times are drawn up front (`arrival_schedule`) and every request is sent at
its scheduled time whether or not earlier ones have answered, so an overloaded server sees its queue
grow instead of the client politely slowing down. Each request runs as its own asyncio task and the
connection pool is unbounded, so nothing waits on the client side; the gap between the scheduled and
the actual send time is recorded per request (`send_lag_ms`) so a client that falls behind is visible
in the summary instead of silently turning the test into a closed loop.

Closed loop: N workers, each sends its next request when its previous one has finished (fixed
concurrency; the offered rate is whatever the server sustains).

Requests are users' test histories from a dataset folder, drawn with a seeded RNG. Warm-up requests
(the first seconds and/or the first requests) are sent and recorded with `warmup=True` but left out of
the statistics. Every sent request ends in exactly one outcome (answered / rejected / error / timeout)
and the summary checks that the counts add up.

Outputs: per-request rows in `<results>/loadtest/<run_id>.parquet`, and one summary result row
(`kind = "loadtest"`) in the shared Parquet results (+ MLflow), keyed like `ResultRow.to_flat()`.
A rate sweep runs one load test per rate (each its own row in one experiment) and reports the highest
rate whose P99 latency meets the SLO with few unanswered requests, as in xGR's SLO-bounded throughput.

This package is the load generator (`genrec loadtest`, platform/commands/loadtest.py and
platform/serve_benchmark.py use it). The code lives in one module per concept, each of which imports only
those above it in this list; callers import each name from its module:

- platform/loadgen/requests.py: what is sent and when: `LoadConfig`, `arrival_schedule`,
  `inter_arrival_cv`, `open_loop_horizon`, `RequestSource`.
- platform/loadgen/client.py: the async HTTP client: `RequestRecord`, `OUTCOMES`, `classify_status`,
  `send_request`, `run_load` (open and closed loop), and the checks sent before any load
  (`fetch_health`, `preflight`).
- platform/loadgen/stats.py: `summarize` -> `LoadSummary`.
- platform/loadgen/rows.py: what a test leaves behind: `write_requests` (per-request Parquet),
  `RunContext`, `decoder_params`, `summary_row` (the result row).
- platform/loadgen/run.py: one recorded test: `prepare` (server and dataset checks), `run_context`,
  `run_one`, `Tracking`, `LoadTestResult`.
- platform/loadgen/capacity.py: the rate sweep and max-rate search: `RatePoint`, `RateSearch`,
  `sweep_rates`, `find_max_rate`, `best_of`, `rate_measure`.
- platform/loadgen/format.py: the text the CLI prints: `format_summary`, `format_sweep`.

The SLO rule `meets_slo`, the rate rounding `nice_rate` and `DEFAULT_MAX_UNANSWERED` are defined once,
in workloads/serving/slo.py, for this load generator and the in-process serving harness alike.
"""
