"""Decoding one batch of admitted `POST /recommend` requests in a replica, for either batching policy.

A batch is split into groups with the same decoder and Params (equal Params hash equal), each group into
decoder calls of at most `limits.max_batch_tokens` tokens (`token_chunks`). Just before each call, the
requests whose deadline has passed (their client already had its 504) are dropped and counted as
`expired`. The answers come one per request, in order, as `@serve.batch` wants: the response body
(`response_body`), EXPIRED, or a GroupFailure: any exception raised while decoding the request's group
(422 for a UserInputError, 500 naming any other error), handed back, not raised, so one bad group
never fails the other requests of the batch. A group whose call raises anything but a UserInputError
is decoded again one request at a time, so a fault tied to one history fails that request alone.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from genrec.platform.actors import DecoderHost
from genrec.platform.serve.requests import Limits, RecommendJob, clip, request_tokens
from genrec.workloads.errors import UserInputError

EXPIRED = "expired"  # a batch's answer for a request whose deadline passed before it was decoded
log = logging.getLogger(__name__)
QueuedJob = tuple[RecommendJob, float, float]  # (job, arrived, deadline), times from time.perf_counter()


@dataclass(frozen=True)
class GroupFailure:
    """A request's answer when decoding its group failed: 422 (input this deployment cannot decode)
    or 500 (a fault, named); handed back to `@serve.batch`, never raised into it."""

    status: int
    message: str


def token_chunks(members: list[int], tokens: list[int], budget: int) -> list[list[int]]:
    """Split one group's requests into decoder calls of at most `budget` tokens each (a request alone
    always fits: admission refused larger ones)."""
    chunks: list[list[int]] = [[]]
    used = 0
    for i in members:
        if chunks[-1] and used + tokens[i] > budget:
            chunks.append([])
            used = 0
        chunks[-1].append(i)
        used += tokens[i]
    return chunks


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


class BatchDecoder:
    """A replica's batches on its DecoderHost, one at a time; counts the requests it drops unanswered."""

    def __init__(self, host: DecoderHost, limits: Limits) -> None:
        self.host, self.limits = host, limits
        self.expired = 0  # dropped before decoding: their deadline passed in the queue

    def decode(self, requests: list[QueuedJob], started: float) -> list[Any]:
        """One answer per request, in order (`started`: when the batch left the queue)."""
        answers: list[Any] = [EXPIRED] * len(requests)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, (job, _, _) in enumerate(requests):
            groups[job.group].append(i)
        tokens = [
            job.tokens or request_tokens(job.params, len(job.history), self.limits.levels)
            for job, _, _ in requests
        ]
        for (decoder, params), members in groups.items():
            for chunk in token_chunks(members, tokens, self.limits.max_batch_tokens):
                # checked per call, just before it: a request whose client has already had its 504 is
                # not decoded (a long earlier call in this batch may have used up its time)
                now = time.perf_counter()
                live = [i for i in chunk if requests[i][2] > now]
                self.expired += len(chunk) - len(live)
                if live:
                    self._decode_call(requests, live, decoder, params, started, answers)
        # serve.batch wants one result per request; an exception object is handed back, not raised,
        # so one bad group does not fail the other requests of the batch
        return answers

    def _decode_call(
        self,
        requests: list[QueuedJob],
        members: list[int],
        decoder: str,
        params: Any,
        started: float,
        answers: list[Any],
    ) -> None:
        """Decode `members` in one call; on a fault, each alone (so a history that trips it fails only
        its own request). Whatever is raised becomes the answer of the requests it concerns."""
        try:  # the job's frozen Params as parsed: no re-validation, no dict round trip
            out = self.host.decode([list(requests[i][0].history) for i in members], decoder, params)
        except Exception as e:  # noqa: BLE001 - any fault is this group's answer, never the batch's
            if isinstance(e, UserInputError) or len(members) == 1:
                for i in members:
                    answers[i] = group_failure(e, decoder)
                return
            for i in members:
                self._decode_call(requests, [i], decoder, params, started, answers)
            return
        for row, i in zip(out.items, members):
            job, arrived, _ = requests[i]
            answers[i] = response_body(job, row, out, queue_ms=(started - arrived) * 1e3, batch=len(requests))


def group_failure(error: Exception, decoder: str) -> GroupFailure:
    """422 for what the decoder refused as input; 500 naming any other error (logged with its trace)."""
    if isinstance(error, UserInputError):
        return GroupFailure(422, str(error))
    log.error("decoder %r failed on a request group", decoder, exc_info=error)
    detail = clip(f"{type(error).__name__}: {error}", 300)
    return GroupFailure(
        500,
        f"decoding failed ({detail}); only this request was affected; the replica's log has the trace",
    )
