"""`genrec train` and `genrec eval`."""

import typer


def register(app: typer.Typer) -> None:
    pass
