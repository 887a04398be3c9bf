"""`genrec tokenize`: learn semantic IDs from item features."""

import typer


def register(app: typer.Typer) -> None:
    pass
