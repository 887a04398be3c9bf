"""The Recommender deployment's Serve options from a ServeConfig: Ray resources per replica, the admission
bounds Serve applies before a replica (and the answer it gives beyond them), the live settings
(`user_config`), logging, graceful shutdown, and a fixed replica count or autoscaling."""

from __future__ import annotations

from typing import Any

from ray.serve.config import BackpressureConfig

from genrec.platform.actors import actor_resources
from genrec.platform.serve.config import ServeConfig


def deployment_options(cfg: ServeConfig, cluster: dict[str, float] | None = None) -> dict[str, Any]:
    res = actor_resources(cluster or {}, cfg.threads, cfg.num_gpus)
    if cfg.num_cpus is not None:
        res["num_cpus"] = cfg.num_cpus
    opts: dict[str, Any] = {
        "ray_actor_options": res,
        # Admit every request the replica's own bounded queue may hold: when the replica is full,
        # Serve's router backs off (up to 0.5 s) and re-probes, which collapses throughput under
        # overload; the replica rejects beyond its bound instead (see `Recommender.recommend`).
        "max_ongoing_requests": cfg.max_ongoing_requests
        or cfg.max_queued_requests + 2 * max(cfg.batching.max_batch_size, 16),
        "max_queued_requests": cfg.max_queued_requests,
        "backpressure_config": BackpressureConfig(
            status_code=cfg.overload_status, retry_after_s=cfg.retry_after_s
        ),
        "user_config": {**cfg.batching.model_dump(), "request_timeout_s": cfg.request_timeout_s},
        # one log line per request costs CPU that the decoder needs; errors are still logged
        "logging_config": {"enable_access_log": False, "log_level": "WARNING"},
        # Ctrl-C or a redeploy after an overload should not wait for a long queue to drain
        "graceful_shutdown_timeout_s": 5.0,
        "graceful_shutdown_wait_loop_s": 0.5,
    }
    if cfg.autoscaling:  # Serve takes either a fixed replica count or an autoscaling config
        opts["autoscaling_config"] = cfg.autoscaling
    else:
        opts["num_replicas"] = cfg.num_replicas
    return opts
