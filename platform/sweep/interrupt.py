"""Ctrl-C during a sweep: noticing it, though Tune swallows the first one; SIGTERM and SIGHUP alike.

Tune catches the first SIGINT itself, saves its experiment state and returns from `fit()` as if the
sweep were done. `fit_noticing_interrupt` runs `fit` with a log filter that recognises Tune's record of
that and raises `SweepInterrupted` afterwards; a second Ctrl-C arrives as a plain KeyboardInterrupt.
Either ends the sweep's MLflow parent run KILLED (genrec.platform.sweep.parent_run) and makes the CLI
exit 130 with genrec's own resume command; the rows written so far are kept for `--resume`.

`StopSignals` makes SIGTERM and SIGHUP (a supervisor, a closed terminal) take the same path: each is
handed to whatever handles SIGINT at that moment (Tune's handler during `fit`, else KeyboardInterrupt),
and the CLI exits 128 + the first signal's number (143 for SIGTERM). Ray's core worker replaces the
SIGTERM handler during `ray.init` with one that aborts the driver (SIGABRT, Ray's stack lines, no
shutdown, Ray's agents left running), so `init_ray` takes the signals back afterwards (`take_back`).
A signal sent to the whole process group also ends Ray's GCS and raylet, and Tune's clean stop then
waits on them (removing a placement group from a GCS that is gone): after `STOP_GRACE_S` the command
gives up on it, prints the resume command, kills what is left of the local Ray and exits all the same.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.tune import ResultGrid, Tuner

TUNE_LOGGER = "ray.tune.tune"  # where Tune logs its interrupt


class SweepInterrupted(Exception):
    """Ctrl-C (SIGINT) stopped the sweep; the rows written so far are kept for `--resume`."""


class _TuneInterruptWatch(logging.Filter):
    """Tune catches the first SIGINT itself, saves its state and returns from `fit()` as if done,
    logging a `Tuner.restore(...)` hint. This filter notices that record (so the sweep can say it was
    interrupted and exit 130) and drops it: genrec's own resume command is printed instead."""

    MARKERS = ("Stop signal received", "has been interrupted", "Tuner.restore(")

    def __init__(self) -> None:
        super().__init__()
        self.interrupted = False

    def filter(self, record: logging.LogRecord) -> bool:
        if any(m in record.getMessage() for m in self.MARKERS):
            self.interrupted = True
            return False
        return True


def fit_noticing_interrupt(tuner: Tuner, experiment: str) -> ResultGrid:
    """`tuner.fit()`'s results; raises SweepInterrupted(experiment) when Tune caught a Ctrl-C."""
    watch = _TuneInterruptWatch()
    tune_log = logging.getLogger(TUNE_LOGGER)
    tune_log.addFilter(watch)
    try:
        results = tuner.fit()
    finally:
        tune_log.removeFilter(watch)
    if watch.interrupted:
        raise SweepInterrupted(experiment)
    return results


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_S = 15.0  # Tune's clean stop on a 2-core machine takes a few seconds; longer means Ray is gone


class StopSignals:
    """While active (a `with` block around the sweep), SIGTERM and SIGHUP stop the sweep as Ctrl-C does;
    `exit_code` is 128 + the first stop signal received (SIGINT's 130 when none was)."""

    active: StopSignals | None = None  # the one `take_back` reinstalls after ray.init

    def __init__(self, give_up: Callable[[], None] = lambda: None, grace_s: float = STOP_GRACE_S) -> None:
        self.received: int | None = None
        self.previous: dict[int, object] = {}
        self.give_up, self.grace_s = give_up, grace_s
        self.timer: threading.Timer | None = None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # Python takes signals in the main thread only: a sweep run from a thread keeps them
        self.previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        self.install()
        StopSignals.active = self
        return self

    def __exit__(self, *exc: object) -> None:
        if self.timer is not None:  # the clean stop ended in time
            self.timer.cancel()
        StopSignals.active = None
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._as_ctrl_c)

    def _as_ctrl_c(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signum
            self.timer = threading.Timer(self.grace_s, self._exit_anyway)
            self.timer.daemon = True
            self.timer.start()
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler) and handler is not signal.default_int_handler:
            handler(signal.SIGINT, frame)  # Tune's: stop the trials, save its state, return from fit()
        else:  # also where SIGINT is ignored (a background job): the stop signal must still stop
            raise KeyboardInterrupt

    def exit_code(self) -> int:
        return 128 + (self.received or signal.SIGINT)

    def _exit_anyway(self) -> None:
        """The clean stop did not end within the grace period: `give_up` (say how to resume, kill the
        local Ray), then exit at once with the signal's code; rows and Tune's state are already on disk."""
        try:
            self.give_up()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.exit_code())


def take_back() -> None:
    """After `ray.init`: the stop signals to the active StopSignals again (Ray's core worker took SIGTERM)."""
    if StopSignals.active is not None:
        StopSignals.active.install()
