"""Decoding one batch of admitted `POST /recommend` requests in a replica, for either batching policy.

A batch is split into groups with the same decoder and Params (equal Params hash equal), each group into
decoder calls of at most `limits.max_batch_tokens` tokens (`token_chunks`). Just before each call, the
requests whose deadline has passed (their client already had its 504) are dropped and counted as
`expired`. The answers come one per request, in order, as `@serve.batch` wants: the response body
(`response_body`), EXPIRED, or the UserInputError the decoder raised for the request's group (handed
back, not raised, so one bad group does not fail the other requests of the batch).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import asdict
from typing import Any

from genrec.platform.actors import DecoderHost
from genrec.platform.serve.requests import Limits, RecommendJob, request_tokens
from genrec.workloads.errors import UserInputError

EXPIRED = "expired"  # a batch's answer for a request whose deadline passed before it was decoded
QueuedJob = tuple[RecommendJob, float, float]  # (job, arrived, deadline), times from time.perf_counter()


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
        try:  # the job's frozen Params as parsed: no re-validation, no dict round trip
            out = self.host.decode([list(requests[i][0].history) for i in members], decoder, params)
        except UserInputError as e:
            for i in members:
                answers[i] = e
            return
        for row, i in zip(out.items, members):
            job, arrived, _ = requests[i]
            answers[i] = response_body(job, row, out, queue_ms=(started - arrived) * 1e3, batch=len(requests))
