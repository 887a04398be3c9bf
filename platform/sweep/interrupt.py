"""Ctrl-C during a sweep: noticing it, though Tune swallows the first one.

Tune catches the first SIGINT itself, saves its experiment state and returns from `fit()` as if the
sweep were done. `fit_noticing_interrupt` runs `fit` with a log filter that recognises Tune's record of
that and raises `SweepInterrupted` afterwards; a second Ctrl-C arrives as a plain KeyboardInterrupt.
Either ends the sweep's MLflow parent run KILLED (genrec.platform.sweep.parent_run) and makes the CLI
exit 130 with genrec's own resume command; the rows written so far are kept for `--resume`.
"""

from __future__ import annotations

import logging
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
