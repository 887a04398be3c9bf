"""Replicas for the in-process serving harness: N decoder processes, each with its own batching policy,
fed one open-loop arrival schedule.

A Serve deployment with `num_replicas: N` runs N replica processes, each with its own bounded queue and
batching policy (`@serve.batch` or the xSchedule scheduler), behind a router. The harness reproduces
that without Ray (the lent GPU machine has none): `ReplicaPool` starts N worker processes once per
harness run (spawned, so each has its own interpreter, torch threads and, on a GPU, its own CUDA
context: threads would share one GIL, and on the 2-core VM two decoder threads at batch 1 ran at 0.8x
of one). Each worker loads the model and decoders once (`load_decoders`) and then serves load tests.

For one load test, the arrival schedule is split round robin (`route_round_robin`: request i goes to
replica i mod N). Serve's router picks the shorter of two sampled queues; over equal replicas, round
robin is the stateless version of that balance and keeps a run reproducible. Every replica runs the
same open loop as a single-replica test (workloads/serving/open_loop.py) on its share, against one
shared start time on the system-wide monotonic clock, so arrival offsets mean the same instant in
every process; the parent merges the records (original request order, each tagged with its replica)
and summarises them like any load test. The parent only waits while the replicas run.

Workers are daemon processes, stopped by `close()` (the pool is a context manager) and killed if they
do not stop within a few seconds, so an interrupted harness leaves no process behind; on Linux each
also asks the kernel for SIGTERM when its parent dies, which covers a harness killed outright.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from genrec.workloads.serving.open_loop import LoadSpec, Record, ServeBatch, run_open_loop

START_LEAD_S = 0.25  # the shared start lies this far ahead, so every replica has received its share
STOP_TIMEOUT_S = 5.0
PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)


@dataclass(frozen=True)
class ReplicaSetup:
    """What each replica process loads: the checkpoint and the decoders the arms use."""

    model: str
    decoders: tuple[str, ...]
    beam_width: int
    k: int
    data: str | None = None
    device: str = "cpu"
    threads: int = 1  # torch threads per replica (a Serve replica's `threads`)


DecoderFactory = Callable[[ReplicaSetup], dict[str, ServeBatch]]


def load_decoders(setup: ReplicaSetup) -> dict[str, ServeBatch]:
    """The default factory: load the checkpoint, build each decoder's batch call and warm it up (the
    allocator, HF's copies and the buffer pools of a few batch shapes), as the parent process does."""
    import torch

    from genrec.workloads.evaluation import load_context
    from genrec.workloads.serving.arms import decode_batch_fn, request_pool, warm_up

    if setup.threads:
        torch.set_num_threads(setup.threads)
    ctx, ds, _ = load_context(setup.model, setup.data, setup.device)
    fns = {d: decode_batch_fn(ctx, d, setup.beam_width, setup.k) for d in setup.decoders}
    warm_up(
        fns.values(),
        request_pool(ctx, [ex.history for ex in ds.eval_examples("test")][:16], setup.beam_width),
    )
    return fns


def route_round_robin(n_requests: int, replicas: int) -> list[list[int]]:
    """Request indices per replica: request i goes to replica i mod `replicas`."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    return [list(range(r, n_requests, replicas)) for r in range(replicas)]


@dataclass(frozen=True)
class ReplicaJob:
    """One replica's part of one load test (picklable: it crosses the process boundary)."""

    arm: Any  # arms.Arm
    opts: Any  # arms.Options
    calibration: Any  # arms.Calibration | None
    requests: list[tuple[float, Any, int]]  # (arrival offset s, payload, tokens), ascending
    spec: LoadSpec
    start_s: float  # time.monotonic() at arrival offset 0, the same instant in every replica


def serve_job(fns: dict[str, ServeBatch], job: ReplicaJob) -> list[Record]:
    """One replica's open loop over its share, on the shared monotonic clock."""
    from genrec.workloads.serving.arms import make_policy

    policy = make_policy(job.arm, job.opts, job.calibration, time.monotonic)
    return run_open_loop(
        policy, fns[job.arm.decoder], job.requests, job.spec, clock=time.monotonic, start_s=job.start_s
    )


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel send this process SIGTERM when its parent dies (Linux), so a harness killed
    mid-test (SIGKILL included) leaves no replica serving on; if the parent is already gone, exit."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:
        os._exit(0)


def replica_main(conn, setup: ReplicaSetup, factory: DecoderFactory, parent_pid: int) -> None:
    """A worker process: load once, answer "ready", then serve jobs until told to stop (None)."""
    die_with_parent(parent_pid)
    try:
        fns = factory(setup)
        conn.send(("ready", None))
        while (job := conn.recv()) is not None:
            conn.send(("done", serve_job(fns, job)))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):  # the parent went away or was interrupted
        pass
    except BaseException as e:  # noqa: BLE001 - the parent re-raises it with the replica's traceback
        try:
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        except (BrokenPipeError, OSError):
            pass
    finally:
        conn.close()


class ReplicaError(RuntimeError):
    """A replica process failed; the message carries its traceback."""


class ReplicaPool:
    """`size` replica processes serving load tests (see the module doc). Use as a context manager."""

    def __init__(self, setup: ReplicaSetup, size: int, factory: DecoderFactory = load_decoders) -> None:
        if size < 1:
            raise ValueError(f"a replica pool needs at least one replica, got {size}")
        ctx = mp.get_context("spawn")
        self.size, self.conns, self.procs = size, [], []
        try:
            for r in range(size):
                parent, child = ctx.Pipe()
                proc = ctx.Process(
                    target=replica_main,
                    args=(child, setup, factory, os.getpid()),
                    name=f"replica-{r}",
                    daemon=True,
                )
                proc.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(proc)
            for r in range(size):
                self._receive(r, "ready")
        except BaseException:
            self.close()
            raise

    def _receive(self, r: int, expected: str) -> Any:
        try:
            kind, value = self.conns[r].recv()
        except EOFError:
            code = self.procs[r].exitcode
            raise ReplicaError(f"replica {r} exited (code {code}) without answering") from None
        if kind == "error":
            raise ReplicaError(f"replica {r} failed: {value}")
        if kind != expected:
            raise ReplicaError(f"replica {r} answered {kind!r}, expected {expected!r}")
        return value

    def run(
        self, arm, opts, calibration, requests: Sequence[tuple[float, Any, int]], spec: LoadSpec
    ) -> list[Record]:
        """One load test over `arm.replicas` of the pool's processes; one Record per request, in
        request order, each with the replica that served it."""
        n = arm.replicas
        if not 1 <= n <= self.size:
            raise ValueError(f"{arm.label}: {n} replicas, but the pool has {self.size}")
        shares = route_round_robin(len(requests), n)
        start = time.monotonic() + START_LEAD_S
        for r, share in enumerate(shares):
            part = [requests[i] for i in share]
            self.conns[r].send(ReplicaJob(arm, opts, calibration, part, spec, start))
        merged: list[Record | None] = [None] * len(requests)
        for r, share in enumerate(shares):
            for rec, index in zip(self._receive(r, "done"), share, strict=True):
                merged[index] = replace(rec, index=index, replica=r)
        return merged  # type: ignore[return-value]  # every index was filled once

    def close(self) -> None:
        """Ask every worker to stop, then kill those that do not within STOP_TIMEOUT_S."""
        for conn in self.conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []

    def __enter__(self) -> ReplicaPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
