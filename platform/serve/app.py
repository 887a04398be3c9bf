"""The Ray Serve app: a FastAPI ingress whose replicas each own a DecoderHost.

    POST /recommend        {history, decoder?, k?, beam_width?, constraint?, params?} -> items + timings
    POST /rank             {user: {profile, seq}, items, cross, mode?} -> per-task scores of B candidates
                           (only with a ranking checkpoint, `ranking: DIR`; see platform/serve/ranking.py)
    GET  /health           model, draft (AtSpeed's draft model, or null), dataset, decoders, batching settings
    GET  /decoders         names, parameters (type, default), the deployment's defaults and the draft
    GET  /constraint-sets  the sets requests can name with `constraint` (any beam-based decoder)

Requests are checked in the replica's event loop (`parse_recommend`: the decoder's parameters go
through genrec.platform.params, as in YAML experiments and `genrec eval --param`), then queued with
their frozen Params for `@serve.batch`: a batch is split into groups with the same decoder and
Params (equal Params hash equal) and each group is
one decoder call, run on the replica's event loop: requests that arrive meanwhile wait in the socket
and the proxy and join the next batch (a worker thread would keep accepting them, but on a small CPU
its fight with the event loop over the GIL made both slower: see docs/serving.md).

Overload: each replica admits at most `max_queued_requests + max_batch_size`
requests (queued or decoding) and answers 503 or 429 with Retry-After beyond that (Serve's own
`max_queued_requests` guards the proxies' queues when every replica is full); the app answers 504
when a request waits longer than `request_timeout_s`.

`build_app(args)` is the application builder that `serve build` / `serve deploy` and
`genrec serve` use.
"""

# no `from __future__ import annotations`: FastAPI reads the endpoints' annotations at runtime

import asyncio
import json
import math
import os
import sys
import time
from collections import defaultdict
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve.config import BackpressureConfig
from starlette.requests import ClientDisconnect

from genrec.platform.actors import DecoderHost, HostConfig, actor_resources
from genrec.platform.params import describe_parameters
from genrec.platform.serve.config import (
    DEPLOYMENT_NAME,
    BatchingConfig,
    ConstraintFields,
    ServeConfig,
    check_model_dir,
    parse_serve_config,
)
from genrec.platform.serve.ingress import active_handler_loop, active_ingress
from genrec.platform.serve.ranking import NO_RANKING_MODEL, RankingService
from genrec.platform.serve.requests import Limits, RecommendJob, RequestError, parse_recommend
from genrec.workloads.errors import UserInputError

api = FastAPI(title="genrec-lab recommender", version="1")
CLIENT_CLOSED = 499  # nginx's "client closed request": logged as a client event, not a server error

# Everything the deployment class uses is defined above it: Serve serialises the class when the
# decorator runs, so a helper defined further down would be missing in the replica.


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


def check_constraint_sets(
    host: DecoderHost, cfg: ServeConfig
) -> tuple[dict[str, ConstraintFields], dict[str, str]]:
    """Build every configured set once, for every served decoder that takes a constraint, by decoding a
    history with it (so requests never pay for a build); sets that cannot be built are reported."""
    takers = [name for name, p in host.defaults.items() if hasattr(p, "constraint")]
    history = host.sample_histories(1)
    ok, unavailable = {}, {}
    for set_name, spec in cfg.constraint_sets.items():
        fields = spec.constraint_fields()
        if not takers:
            unavailable[set_name] = f"no served decoder takes a constraint ({list(cfg.decoders)})"
            continue
        try:
            for decoder in takers:
                host.decode(history, decoder, host.resolve(decoder, fields.values())[1])
            ok[set_name] = fields
        except UserInputError as e:
            unavailable[set_name] = f"{decoder}: {e}"
    return ok, unavailable


def response_body(job: RecommendJob, row, out, queue_ms: float, batch: int) -> dict[str, Any]:
    items = [
        {"item_id": int(i), "sid": [int(c) for c in sid], "score": float(s)}
        for i, sid, s, ok in zip(row.item_ids, row.sids, row.scores, row.valid)
        if ok
    ][: job.k]
    return {
        "items": items,
        "decoder": out.decoder,
        "k": job.k,
        "params": asdict(out.params),
        "invalid_dropped": int(sum(not v for v in row.valid[: job.k])),
        "history_truncated": bool(job.truncated_from),
        "notes": list(job.notes),
        "batch_size": batch,
        # decoder_call is the whole call; the decoder's own phases (prefill, decode, ...) sit beside it
        "timings_ms": {"queue": queue_ms, "decoder_call": out.decode_ms, **out.timings_ms},
    }


@serve.deployment(name=DEPLOYMENT_NAME)
@serve.ingress(api)
class Recommender:
    def __init__(self, config: dict[str, Any]) -> None:
        self.cfg = parse_serve_config(config)
        if self.cfg.gil_switch_interval_s:
            sys.setswitchinterval(self.cfg.gil_switch_interval_s)
        host_cfg = HostConfig(
            model=str(self.cfg.model),
            data=str(self.cfg.data) if self.cfg.data else None,
            draft=str(self.cfg.draft) if self.cfg.draft else None,
            device=self.cfg.device,
            threads=self.cfg.threads,
            decoders=tuple(self.cfg.decoders),
            defaults=self.cfg.defaults,
            warmup_batches=self.cfg.warmup_batches,
        )
        self.host = DecoderHost(host_cfg)
        sets, unavailable = check_constraint_sets(self.host, self.cfg)
        self.limits = Limits(
            num_items=self.host.num_items,
            max_history=self.host.max_history,
            max_k=self.cfg.max_k,
            history_policy=self.cfg.history_policy,
            decoders=tuple(self.cfg.decoders),
            default_decoder=self.cfg.decoders[0],
            defaults=dict(self.host.defaults),
            constraint_sets=sets,
            unavailable_sets=unavailable,
        )
        self.batching = self.cfg.batching
        self.request_timeout_s = self.cfg.request_timeout_s
        self._apply_batching(self.batching)
        self.answered = 0
        self.rejected = 0
        self.inflight = 0  # admitted requests not yet answered (waiting for a batch or decoding)
        self.started_at = time.time()
        # POST /rank: a ranking model on the decoder host's device (MaRI graph built here, once)
        self.ranking = (
            RankingService(self.cfg.ranking, self.host.context.device, self.cfg.ranking_max_candidates)
            if self.cfg.ranking is not None
            else None
        )

    # ---- live configuration (the deployment's user_config) -------------------------------------
    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve calls this at start and on every redeploy with a changed user_config (no restart)."""
        user_config = dict(user_config or {})
        timeout = user_config.pop("request_timeout_s", None)
        if timeout is not None:
            if not float(timeout) > 0:
                raise UserInputError(f"user_config.request_timeout_s must be > 0, got {timeout}")
            self.request_timeout_s = float(timeout)
        self.batching = BatchingConfig.model_validate({**self.batching.model_dump(), **user_config})
        self._apply_batching(self.batching)

    def _apply_batching(self, b: BatchingConfig) -> None:
        self._decode_batch.set_max_batch_size(b.max_batch_size)
        self._decode_batch.set_batch_wait_timeout_s(b.batch_wait_timeout_s)

    # ---- endpoints -------------------------------------------------------------------------------
    @api.get("/health")
    def health(self) -> dict[str, Any]:
        info = self.host.describe()
        return {
            "status": "ok",
            "model": info["model"],
            "draft": info["draft"],  # AtSpeed's draft model folder; None: no draft loaded
            "dataset": info["dataset"],
            "device": info["device"],
            "threads": info["threads"],
            "decoders": list(self.cfg.decoders),
            "num_items": info["num_items"],
            "max_history": info["max_history"],
            "history_policy": self.cfg.history_policy,
            "max_batch_size": self.batching.max_batch_size,
            "batch_wait_timeout_s": self.batching.batch_wait_timeout_s,
            "max_queued_requests": self.cfg.max_queued_requests,
            "replicas": self.cfg.num_replicas if not self.cfg.autoscaling else "autoscaling",
            "request_timeout_s": self.request_timeout_s,
            "answered": self.answered,
            "rejected": self.rejected,
            "inflight": self.inflight,
            "pid": os.getpid(),
            "ingress": active_ingress(),
            "handler_loop": active_handler_loop(),
            "started_at": self.started_at,
            "ranking": self.ranking.describe() if self.ranking is not None else None,
        }

    @api.get("/decoders")
    def decoders(self) -> dict[str, Any]:
        return {
            "default": self.limits.default_decoder,
            "draft": self.host.describe()["draft"],  # what atspeed_* decoders draft with (None: none)
            "decoders": {
                name: {
                    "parameters": {
                        p.name: {"type": p.type, "default": p.default} for p in describe_parameters(name)
                    },
                    "defaults": asdict(params),
                }
                for name, params in self.host.defaults.items()
            },
        }

    @api.get("/constraint-sets")
    def constraint_sets(self) -> dict[str, Any]:
        return {
            "decoders": [name for name, p in self.host.defaults.items() if hasattr(p, "constraint")],
            "sets": [
                {
                    "name": n,
                    **self.cfg.constraint_sets[n].model_dump(),
                    "available": n in self.limits.constraint_sets,
                    "reason": self.limits.unavailable_sets.get(n, ""),
                }
                for n in sorted(self.cfg.constraint_sets)
            ],
        }

    @api.post("/recommend")
    async def recommend(self, request: Request) -> JSONResponse:
        arrived = time.perf_counter()
        try:
            job = parse_recommend(await request.body(), self.limits)
        except RequestError as e:
            return _error(e.status, e.message)
        except ClientDisconnect:  # the client hung up before sending its body: nobody reads an answer
            return _error(CLIENT_CLOSED, "client closed the connection")
        bound = self.cfg.max_queued_requests + self.batching.max_batch_size
        if self.inflight >= bound:  # the replica's bounded queue: turn away now, never drop later
            self.rejected += 1
            return JSONResponse(
                {
                    "detail": f"overloaded: {self.inflight} requests queued or decoding (bound {bound}); "
                    "retry later"
                },
                status_code=self.cfg.overload_status,
                headers={"Retry-After": str(max(1, math.ceil(self.cfg.retry_after_s)))},
            )
        self.inflight += 1
        try:
            out = await asyncio.wait_for(self._decode_batch((job, arrived)), self.request_timeout_s)
        except TimeoutError:
            return _error(
                504,
                f"no answer within request_timeout_s={self.request_timeout_s} s; the server is "
                "overloaded: retry later or raise request_timeout_s",
            )
        finally:
            self.inflight -= 1
        if isinstance(out, UserInputError):  # the decoder rejected this request's group
            return _error(422, str(out))
        out["timings_ms"]["server"] = (time.perf_counter() - arrived) * 1e3
        self.answered += 1
        return JSONResponse(out)

    # ---- ranking (no batching: each request carries its B candidates) ------------------------------
    @api.post("/rank")
    async def rank(self, request: Request) -> JSONResponse:
        arrived = time.perf_counter()
        if self.ranking is None:
            return _error(404, NO_RANKING_MODEL)
        try:
            return JSONResponse(self.ranking.answer(await request.body(), arrived))
        except RequestError as e:
            return _error(e.status, e.message)
        except ClientDisconnect:
            return _error(CLIENT_CLOSED, "client closed the connection")

    # ---- batching --------------------------------------------------------------------------------
    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)  # replaced by user_config at start
    async def _decode_batch(self, requests: list[tuple[RecommendJob, float]]) -> list[dict[str, Any]]:
        started = time.perf_counter()
        if self.cfg.decode_in_thread:
            return await asyncio.to_thread(self._decode_groups, requests, started)
        return self._decode_groups(requests, started)

    def _decode_groups(self, requests: list[tuple[RecommendJob, float]], started: float) -> list[Any]:
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, (job, _) in enumerate(requests):
            groups[job.group].append(i)
        answers: list[Any] = [None] * len(requests)
        for (decoder, params), members in groups.items():
            try:  # the job's frozen Params as parsed: no re-validation, no dict round trip
                out = self.host.decode([list(requests[i][0].history) for i in members], decoder, params)
            except UserInputError as e:
                for i in members:
                    answers[i] = e
                continue
            for row, i in zip(out.items, members):
                job, arrived = requests[i]
                answers[i] = response_body(
                    job, row, out, queue_ms=(started - arrived) * 1e3, batch=len(requests)
                )
        # serve.batch wants one result per request; an exception object is handed back, not raised,
        # so one bad group does not fail the other requests of the batch
        return answers


def deployment_options(cfg: ServeConfig, cluster: dict[str, float] | None = None) -> dict[str, Any]:
    res = actor_resources(cluster or {}, cfg.threads, cfg.num_gpus)
    if cfg.num_cpus is not None:
        res["num_cpus"] = cfg.num_cpus
    opts: dict[str, Any] = {
        "ray_actor_options": res,
        # Admit every request the replica's own bounded queue may hold: when the replica is full,
        # Serve's router backs off (up to 0.5 s) and re-probes, which collapses throughput under
        # overload; the replica rejects beyond its bound instead (see `recommend`).
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


def build_app(args: dict[str, Any]):
    """Application builder (`serve deploy` passes the config file's `args`)."""
    import ray

    cfg = parse_serve_config(dict(args)).resolved()
    check_model_dir(cfg)
    cluster = ray.cluster_resources() if ray.is_initialized() else {}
    if cfg.device == "auto" and actor_resources(cluster, cfg.threads, cfg.num_gpus)["num_gpus"] > 0:
        cfg = cfg.model_copy(update={"device": "cuda"})
    return Recommender.options(**deployment_options(cfg, cluster)).bind(json.loads(cfg.model_dump_json()))
