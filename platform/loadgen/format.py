"""The text `genrec loadtest` prints: one load test's summary (`format_summary`) and the table of a rate
sweep with its verdict (`format_sweep`)."""

from __future__ import annotations

import math

from genrec.platform.loadgen.capacity import RateSearch
from genrec.platform.loadgen.run import LoadTestResult


def _ms(v: float) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _pc(v: float) -> str:
    return "-" if math.isnan(v) else f"{100 * v:.1f}%"


def format_summary(res: LoadTestResult) -> str:
    cfg, s = res.config, res.summary
    lat = s.latency_ms
    if cfg.mode == "open":
        shape = "Poisson" if cfg.burstiness == 1 else f"gamma CV {cfg.burstiness:g}"
        load = f"open loop, {cfg.rate:g} req/s offered ({shape})"
    else:
        load = f"closed loop, concurrency {cfg.concurrency}"
    warm = f"{cfg.warmup_s:g} s" + (f" / {cfg.warmup_requests} requests" if cfg.warmup_requests else "")
    lines = [
        f"loadtest {res.row['run_id']}: {cfg.url}, {load}, {cfg.duration_s:g} s after {warm} warm-up, "
        f"k={cfg.k}, decoder {res.row['decoder']}"
        + (f", beam_width={cfg.beam_width}" if cfg.beam_width else ""),
        f"sent {s.sent} = answered {s.answered} + rejected {s.rejected} + errors {s.errors} "
        f"+ timeouts {s.timeouts}   (warm-up: {s.warmup} more, not counted)",
        f"latency ms (answered): p50 {_ms(lat['p50'])}  p90 {_ms(lat['p90'])}  p95 {_ms(lat['p95'])}  "
        f"p99 {_ms(lat['p99'])}  mean {_ms(lat['mean'])} ± {_ms(lat['std'])}",
        f"throughput {s.throughput_rps:.1f} req/s (offered {s.offered_rate_rps:.1f}); goodput "
        f"{s.goodput_rps:.1f} req/s within {cfg.slo_ms:g} ms ({_pc(s.slo_attainment)} of sent)",
        f"error rate {_pc(s.error_rate)}  rejection rate {_pc(s.rejection_rate)}  "
        f"timeout rate {_pc(s.timeout_rate)}",
        f"serve overhead (latency - decoder call) p50 {_ms(s.overhead_p50_ms)} ms  "
        f"p99 {_ms(s.overhead_p99_ms)} ms; "
        f"decoder call p50 {_ms(s.decoder_p50_ms)} ms; mean batch size "
        + ("-" if math.isnan(s.batch_size_mean) else f"{s.batch_size_mean:.2f}"),
        f"client send lag p50 {_ms(s.send_lag_p50_ms)} ms  p99 {_ms(s.send_lag_p99_ms)} ms  "
        f"max {_ms(s.send_lag_max_ms)} ms; max in flight {s.max_inflight}",
        f"SLO (P99 <= {cfg.slo_ms:g} ms, unanswered <= {_pc(cfg.max_unanswered_rate)}): "
        + ("met" if s.slo_met else "NOT met"),
    ]
    if (
        cfg.mode == "open"
        and not math.isnan(s.send_lag_p99_ms)
        and s.send_lag_p99_ms > max(5.0, cfg.slo_ms / 20)
    ):
        lines.append(
            f"warning: the client sent requests late (send lag p99 {_ms(s.send_lag_p99_ms)} ms), so the "
            "server saw smoother or slower arrivals than scheduled: run the client on another machine "
            "or split the rate over several clients"
        )
    return "\n".join(lines)


def format_sweep(search: RateSearch, slo_ms: float, max_unanswered: float) -> str:
    headers = ["rate", "sent", "answered", "p50 ms", "p99 ms", "unanswered", "throughput", "goodput", "SLO"]
    rows = []
    for p in sorted(search.points, key=lambda p: p.rate):
        s = p.result.summary if isinstance(p.result, LoadTestResult) else None
        rows.append(
            [
                f"{p.rate:g}",
                str(s.sent) if s else "-",
                str(s.answered) if s else "-",
                _ms(s.latency_ms["p50"]) if s else "-",
                _ms(p.p99_ms),
                _pc(p.unanswered_rate),
                f"{s.throughput_rps:.1f}" if s else "-",
                f"{s.goodput_rps:.1f}" if s else "-",
                "ok" if p.meets else "fail",
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*r).rstrip() for r in [headers, ["-" * w for w in widths], *rows]]
    what = f"P99 <= {slo_ms:g} ms and unanswered <= {_pc(max_unanswered)}"
    if search.best_rate is None:
        out.append(f"no tried rate meets {what}")
    else:
        more = " (the highest rate tried: the limit may be higher)" if search.hit_limit else ""
        out.append(f"highest rate meeting {what}: {search.best_rate:g} req/s{more}")
    return "\n".join(out)
