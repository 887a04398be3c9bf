"""When to draw a progress bar: only on a terminal.

tqdm redraws its bar with carriage returns; written to a file or a pipe (a redirected log, a Ray
worker's log, CI) every redraw becomes text, and the log fills with them. Callers pass
`disable=not bar_enabled(progress)`; their own plain summary lines still print.
"""

from __future__ import annotations

import sys
from typing import TextIO


def bar_enabled(progress: bool, stream: TextIO | None = None) -> bool:
    """True when a bar was asked for and `stream` (default: the current sys.stderr, tqdm's) is a TTY."""
    if not progress:
        return False
    stream = sys.stderr if stream is None else stream  # looked up now: tests and loggers swap it
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
