"""The Ray Serve app: a FastAPI ingress whose replicas each own a DecoderHost.

    POST /recommend        {history, decoder?, k?, beam_width?, constraint?, params?} -> items + timings
    POST /rank             {user: {profile, seq}, items, cross, mode?} -> per-task scores of B candidates
                           (only with a ranking checkpoint, `ranking: DIR`; see platform/serve/ranking.py)
    GET  /health           model, draft (AtSpeed's draft model, or null), dataset, decoders, batching settings
    GET  /decoders         names, parameters (type, default), the deployment's defaults and the draft
    GET  /constraint-sets  the sets requests can name with `constraint` (any beam-based decoder)

Admission comes first: each replica admits at most `max_queued_requests + max_batch_size` requests
(reading their body, queued or decoding) and answers 503 or 429 with Retry-After beyond that, before
it reads a byte of the body (Serve's own `max_queued_requests` guards the proxies' queues when every
replica is full). An admitted request must send its whole body within `body_timeout_s` (408) and at
most MAX_BODY_BYTES (413). The body is then checked (`parse_recommend`: the decoder's parameters go
through genrec.platform.params, as in YAML experiments and `genrec eval --param`, and the
deployment's resource `limits` bound the request's beam width, history and tokens: 422 naming the
limit), then queued with its frozen Params for the batching policy (`batching.policy`):
- `fixed`: Serve's `@serve.batch`, up to `max_batch_size` requests per batch;
- `slo`: xSchedule (platform/serve/scheduler.py driving genrec.workloads.serving.xschedule): batches of
  at most `token_budget` tokens (prompt tokens x beams), dispatched when the budget fills or the oldest
  request has waited its quota; a request predicted to miss `slo_ms` gets 503 + Retry-After at once,
  one that alone exceeds the budget a 422.
Either way a batch is split into groups with the same decoder and Params (equal Params hash equal),
each group into decoder calls of at most `limits.max_batch_tokens`.

Decoder calls run in the replica's one decoder thread (`decode_in_thread`, the default), so the event
loop keeps answering /health, turning requests away and timing them out while a batch decodes. A
request still waiting when its `request_timeout_s` runs out gets a 504 (counted in /health as
`timed_out`); one whose deadline has passed when its batch starts is dropped before decoding.

Every non-2xx answer of the app is JSON `{"detail": "..."}`, unexpected errors (500) included; the
HAProxy ingress turns its own and Serve's plain-text errors into the same shape (haproxy_guard.py).

`build_app(args)` is the application builder that `serve build` / `serve deploy` and
`genrec serve` use (APP_IMPORT_PATH, `genrec.platform.serve.app:build_app`, names it).

This module is the deployment class (`Recommender`: its endpoints, admission and the batching policies)
and its builder. Beside it:

    http_io.py             reading a body within its bounds; the JSON error and overload (Retry-After) answers
    batch_decoder.py       one batch: groups by decoder and Params, token-bounded calls, expired requests
    replica_setup.py       a replica's DecoderHost config, its constraint sets (built once) and its Limits
    deployment_options.py  the deployment's Serve options (resources, queue bounds, user_config, shutdown)

Each name has one home, the module that defines it.
"""

# no `from __future__ import annotations`: FastAPI reads the endpoints' annotations at runtime

import asyncio
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from starlette.requests import ClientDisconnect

from genrec.platform.actors import DecoderHost, actor_resources
from genrec.platform.params import describe_parameters
from genrec.platform.serve.batch_decoder import (
    EXPIRED,
    BatchDecoder,
    GroupFailure,
    QueuedJob,
)
from genrec.platform.serve.config import (
    DEPLOYMENT_NAME,
    BatchingConfig,
    check_model_dir,
    parse_serve_config,
    resolve_hf_models,
)
from genrec.platform.serve.deployment_options import deployment_options
from genrec.platform.serve.front_door import FrontDoorOnly, front_door_state
from genrec.platform.serve.http_io import CLIENT_CLOSED, error_response, overloaded, read_body
from genrec.platform.serve.ingress import active_handler_loop, active_ingress
from genrec.platform.serve.ranking import NO_RANKING_MODEL, RankingService
from genrec.platform.serve.replica_setup import check_constraint_sets, host_config, request_limits
from genrec.platform.serve.requests import MAX_BODY_BYTES, RecommendJob, RequestError, parse_recommend
from genrec.platform.serve.scheduler import PolicyScheduler
from genrec.workloads.errors import UserInputError
from genrec.workloads.serving.xschedule import SLOBatchPolicy

api = FastAPI(title="genrec-lab recommender", version="1")
# with the HAProxy ingress, what did not come through HAProxy gets a 403 before its body is read
# (front_door.py: a replica's own port and Serve's fallback proxy skip HAProxy's timeouts)
api.add_middleware(FrontDoorOnly)


@api.exception_handler(Exception)
async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # the documented error shape for a bug too (FastAPI's own 404/405/422 are JSON already)
    return JSONResponse(
        {"detail": f"internal error: {type(exc).__name__}; see the replica's log"}, status_code=500
    )


# Everything the deployment class uses is imported or defined above it: Serve serialises the class when
# the decorator runs, so a helper defined further down would be missing in the replica.


@serve.deployment(name=DEPLOYMENT_NAME)
@serve.ingress(api)
class Recommender:
    def __init__(self, config: dict[str, Any]) -> None:
        self.cfg = parse_serve_config(config)
        if self.cfg.gil_switch_interval_s:
            sys.setswitchinterval(self.cfg.gil_switch_interval_s)
        self.host = DecoderHost(host_config(self.cfg))
        sets, unavailable = check_constraint_sets(self.host, self.cfg)
        self.limits = request_limits(self.cfg, self.host, sets, unavailable)
        # what a batch of either policy runs on; it counts the requests it drops as `expired` (of those
        # timed out, the ones dropped before decoding: their deadline passed in the queue)
        self.batch_decoder = BatchDecoder(self.host, self.limits)
        self.batching = self.cfg.batching
        self.request_timeout_s = self.cfg.request_timeout_s
        # the `slo` policy's batcher (used while batching.policy is slo; kept so a live switch back
        # and forth keeps what it learned about service times)
        self.scheduler = PolicyScheduler(
            SLOBatchPolicy(self.batching.schedule_config()), self._run_scheduled_batch
        )
        self._apply_batching(self.batching)
        self.answered = 0
        self.rejected = 0  # turned away by admission (503/429)
        self.slo_rejected = 0  # of those, by the slo policy's admission control
        self.timed_out = 0  # answered 504: no answer within request_timeout_s
        self.body_timeouts = 0  # answered 408: the body did not arrive within body_timeout_s
        self.inflight = 0  # admitted requests not yet answered (reading the body, queued or decoding)
        # one thread: decoder calls run one at a time, as on the event loop, but off it
        self.decoder_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="genrec-decoder")
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
        self.scheduler.policy.reconfigure(b.schedule_config())

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
            "batching": {**self.batching.model_dump(), **self._slo_state()},
            "max_queued_requests": self.cfg.max_queued_requests,
            "replicas": self.cfg.num_replicas if not self.cfg.autoscaling else "autoscaling",
            "request_timeout_s": self.request_timeout_s,
            "answered": self.answered,
            "rejected": self.rejected,
            "slo_rejected": self.slo_rejected,
            "timed_out": self.timed_out,
            "expired": self.batch_decoder.expired,
            "body_timeouts": self.body_timeouts,
            "inflight": self.inflight,
            "limits": {"max_k": self.cfg.max_k, **self.cfg.limits.model_dump()},
            "body_timeout_s": self.cfg.body_timeout_s,
            "decode_in_thread": self.cfg.decode_in_thread,
            "pid": os.getpid(),
            "niceness": os.nice(0),  # Ray's default for workers is 15; `genrec serve` starts them at 0
            "ingress": active_ingress(),
            "front_door": front_door_state(),  # key required (HAProxy ingress) and side-door 403s
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
        bound = self.cfg.max_queued_requests + self.batching.max_batch_size
        if self.inflight >= bound:  # the replica's bounded queue: turn away now, before the body is read
            self.rejected += 1
            return overloaded(
                self.cfg.overload_status,
                f"overloaded: {self.inflight} requests queued or decoding (bound {bound}); retry later",
                self.cfg.retry_after_s,
            )
        self.inflight += 1
        try:
            return await self._recommend_admitted(request, arrived)
        finally:
            self.inflight -= 1

    async def _recommend_admitted(self, request: Request, arrived: float) -> JSONResponse:
        try:
            body = await read_body(request, MAX_BODY_BYTES, self.cfg.body_timeout_s)
            job = parse_recommend(body, self.limits)
        except RequestError as e:
            self.body_timeouts += e.status == 408
            return error_response(e.status, e.message)
        except ClientDisconnect:  # the client hung up before sending its body: nobody reads an answer
            return error_response(CLIENT_CLOSED, "client closed the connection")
        deadline = arrived + self.request_timeout_s
        predicted_s = 0.0  # the slo policy's prediction at admission
        if self.batching.policy == "slo":
            submitted = self._submit_slo(job, arrived, deadline)
            if isinstance(submitted, JSONResponse):
                return submitted
            pending, predicted_s = submitted
        else:
            pending = self._decode_batch((job, arrived, deadline))
        try:
            out = await asyncio.wait_for(pending, max(0.0, deadline - time.perf_counter()))
        except TimeoutError:
            out = EXPIRED
        if out == EXPIRED:
            self.timed_out += 1
            return error_response(
                504,
                f"no answer within request_timeout_s={self.request_timeout_s} s; the server is "
                "overloaded: retry later or raise request_timeout_s",
            )
        if isinstance(out, GroupFailure):  # decoding this request's group failed (422 or 500)
            return error_response(out.status, out.message)
        server_s = time.perf_counter() - arrived
        out["timings_ms"]["server"] = server_s * 1e3
        if predicted_s:  # how late answers come against the policy's predictions calibrates admission
            self.scheduler.policy.answered(predicted_s, server_s)
        self.answered += 1
        return JSONResponse(out)

    # ---- ranking (no batching: each request carries its B candidates) ------------------------------
    @api.post("/rank")
    async def rank(self, request: Request) -> JSONResponse:
        arrived = time.perf_counter()
        if self.ranking is None:
            return error_response(404, NO_RANKING_MODEL)
        try:
            body = await read_body(request, self.ranking.limits.max_body_bytes, self.cfg.body_timeout_s)
            return JSONResponse(self.ranking.answer(body, arrived))
        except RequestError as e:
            return error_response(e.status, e.message)
        except ClientDisconnect:
            return error_response(CLIENT_CLOSED, "client closed the connection")

    # ---- batching --------------------------------------------------------------------------------
    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)  # replaced by user_config at start
    async def _decode_batch(self, requests: list[QueuedJob]) -> list[Any]:
        return await self._run_scheduled_batch(requests)

    async def _run_scheduled_batch(self, requests: list[QueuedJob]) -> list[Any]:
        """One batch of either policy, in the decoder thread (or on the loop: decode_in_thread false)."""
        started = time.perf_counter()
        decode = self.batch_decoder.decode
        if self.cfg.decode_in_thread:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.decoder_thread, decode, requests, started)
        return decode(requests, started)

    def _submit_slo(self, job: RecommendJob, arrived: float, deadline: float) -> Any:
        """The `slo` policy's admission: (a future of the answer, its predicted latency), or the
        rejection to send (422 for a request no batch can hold, else 503/429 + Retry-After: it would
        miss the SLO if queued)."""
        b = self.batching
        if job.tokens > b.token_budget:
            return error_response(
                422,
                f"this request needs {job.tokens} tokens (beams x prompt tokens), above this deployment's "
                f"batching.token_budget={b.token_budget}; send a narrower beam or a shorter history",
            )
        admission, pending = self.scheduler.submit((job, arrived, deadline), job.tokens)
        if pending is not None:
            return pending, admission.predicted_s
        self.rejected += 1
        self.slo_rejected += 1
        detail = f"overloaded: cannot answer within the {b.slo_ms:g} ms SLO ({admission.reason}); retry later"
        return overloaded(self.cfg.overload_status, detail, admission.retry_after_s)

    def _slo_state(self) -> dict[str, Any]:
        """What the slo policy has queued and learned (GET /health, under `batching`)."""
        policy = self.scheduler.policy
        return {
            "queued": len(policy.queue),
            "queued_tokens": policy.queued_tokens,
            "token_budget_in_force": policy.budget(),  # capped by the SLO at the learned service time
            "batches": self.scheduler.batches,
            "service_overhead_ms": policy.service.overhead_s * 1e3,
            "service_us_per_token": policy.service.s_per_token * 1e6,
            "lateness_factor": policy.calibration.factor(),  # recent observed / predicted latency
        }


def build_app(args: dict[str, Any]):
    """Application builder (`serve deploy` passes the config file's `args`)."""
    import ray

    cfg = parse_serve_config(resolve_hf_models(dict(args))).resolved()
    check_model_dir(cfg)
    cluster = ray.cluster_resources() if ray.is_initialized() else {}
    if cfg.device == "auto" and actor_resources(cluster, cfg.threads, cfg.num_gpus)["num_gpus"] > 0:
        cfg = cfg.model_copy(update={"device": "cuda"})
    return Recommender.options(**deployment_options(cfg, cluster)).bind(json.loads(cfg.model_dump_json()))
