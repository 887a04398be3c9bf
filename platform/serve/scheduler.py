"""The Serve replica's driver for a batching policy (`batching.policy: slo`): xSchedule on an event loop.

`@serve.batch` forms batches by request count; with the `slo` policy the replica forms them with
genrec.workloads.serving.xschedule.SLOBatchPolicy instead (token capacity, SLO wait quotas, admission
control). `submit` runs in the request's handler: it asks the policy to admit the request and returns
either the rejection (the app answers 503 + Retry-After) or a future for the answer. One background
task on the same event loop dispatches: whenever no batch is running it takes `next_batch()` and awaits
`run_batch` (the replica's decoder thread), or sleeps until the oldest request falls due or a new
one arrives. The policy is only touched from the event loop, so it needs no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from genrec.workloads.serving.xschedule import Admission, BatchPolicy

RunBatch = Callable[[list[Any]], Awaitable[list[Any]]]  # items -> one answer per item, in order


class PolicyScheduler:
    """Admits requests into `policy` and dispatches its batches to `run_batch`, one at a time."""

    def __init__(self, policy: BatchPolicy, run_batch: RunBatch) -> None:
        self.policy, self.run_batch = policy, run_batch
        self.batches = 0  # dispatched so far
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    def submit(self, item: Any, tokens: int) -> tuple[Admission, asyncio.Future | None]:
        """(admission, future of the item's answer); the future is None when the policy rejected it."""
        loop = asyncio.get_running_loop()
        self._ensure_running(loop)
        future = loop.create_future()
        admission = self.policy.admit((future, item), tokens)
        if not admission.admitted:
            return admission, None
        self._wake.set()
        return admission, future

    def _ensure_running(self, loop: asyncio.AbstractEventLoop) -> None:
        # started on the first request, on the loop that runs the handlers (Serve may run them on a
        # loop of their own, not the one the replica was built on)
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._dispatch_loop())

    async def _dispatch_loop(self) -> None:
        while True:
            self._wake.clear()
            batch = self.policy.next_batch()
            if batch:
                await self._dispatch(batch)
                continue
            due = self.policy.due_in()  # None: nothing queued, sleep until an arrival
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), due)

    async def _dispatch(self, batch: list) -> None:
        futures = [q.key[0] for q in batch]
        started = time.perf_counter()
        try:
            answers = await self.run_batch([q.key[1] for q in batch])
        except Exception as e:  # a failed batch fails its requests, never the dispatcher
            answers, error = None, e
        self.policy.record(batch, time.perf_counter() - started)
        self.batches += 1
        for i, future in enumerate(futures):
            if future.done():  # its client already had a 504 (the wait was cancelled)
                continue
            if answers is None:
                future.set_exception(error)
            else:
                future.set_result(answers[i])

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
