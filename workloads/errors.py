"""Errors that mean "the user's input is wrong": the CLI turns them into a message and exit code 2."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn


class UserInputError(ValueError):
    """Bad input (file, parameter, id). The message names the problem and the fix; `param` names the one
    parameter at fault, when there is one (an experiment's error then points at its key)."""

    def __init__(self, message: str = "", param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def run_main(main: Callable[[], object]) -> NoReturn:
    """The `if __name__ == "__main__"` of a `python -m` driver: bad input (UserInputError) prints
    `error: MESSAGE` to stderr and exits 2, as the genrec CLI does, instead of a traceback; an int
    that `main` returns is the exit code, anything else (a result dict, None) exits 0."""
    try:
        result = main()
    except UserInputError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(result if isinstance(result, int) else 0)
