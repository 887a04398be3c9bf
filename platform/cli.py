"""`genrec` command line: one typer app, each area's commands in platform/commands/."""

from __future__ import annotations

import sys

import typer

from genrec.platform.commands import data as data_commands
from genrec.platform.commands import model as model_commands
from genrec.platform.commands import tokenize as tokenize_commands
from genrec.workloads.errors import UserInputError

app = typer.Typer(
    name="genrec",
    help="genrec-lab: benchmark decoders for LLM-based generative recommendation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(data_commands.app, name="data")
tokenize_commands.register(app)
model_commands.register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input exits 2 with a one-line message instead of a traceback."""
    try:
        app(args=argv, standalone_mode=False)
    except UserInputError as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        sys.exit(2)
    except Exception as e:  # click's usage errors carry their own exit code
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Abort):
            sys.exit(130)
        raise
    # standalone_mode=False returns the exit code instead of raising SystemExit


if __name__ == "__main__":
    main()
