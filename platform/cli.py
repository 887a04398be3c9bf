"""`genrec` command line: one typer app, each area's commands in platform/commands/."""

from __future__ import annotations

import faulthandler
import io
import signal
import sys
import threading
from typing import Annotated

import typer

from genrec.platform.commands import atspeed as atspeed_commands
from genrec.platform.commands import data as data_commands
from genrec.platform.commands import loadtest as loadtest_commands
from genrec.platform.commands import model as model_commands
from genrec.platform.commands import model_import as model_import_commands
from genrec.platform.commands import rank as rank_commands
from genrec.platform.commands import report as report_commands
from genrec.platform.commands import serve as serve_commands
from genrec.platform.commands import sweep as sweep_commands
from genrec.platform.commands import tokenize as tokenize_commands
from genrec.workloads.errors import UserInputError

app = typer.Typer(
    name="genrec",
    help="genrec-lab: benchmark decoders for LLM-based generative recommendation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click hands help_option_names down to every sub-command's context: -h works everywhere
    context_settings={"help_option_names": ["-h", "--help"]},
)


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's, via its metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("genrec-lab")
    except PackageNotFoundError:  # run from a source tree that was never pip-installed
        return "unknown (not installed; pip install -e .)"


def print_version(value: bool) -> None:
    if value:
        typer.echo(f"genrec {package_version()}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=print_version, is_eager=True, help="Print the genrec version and exit."
        ),
    ] = False,
) -> None:
    pass  # the options of `genrec` itself; the help text is the Typer's `help`


app.add_typer(data_commands.app, name="data")
app.add_typer(atspeed_commands.app, name="atspeed")
tokenize_commands.register(app)
model_commands.register(app)
model_import_commands.register(app)
report_commands.register(app)
sweep_commands.register(app)
serve_commands.register(app)
loadtest_commands.register(app)
rank_commands.register(app)


# Options that take several values after one flag (`--k 5 10`); click wants `--k 5 --k 10`.
MULTI_VALUE_OPTIONS = ("--k", "--sweep-rates")


def expand_multi_value_options(argv: list[str]) -> list[str]:
    out: list[str] = []
    current, consumed = None, False
    for arg in argv:
        if arg in MULTI_VALUE_OPTIONS:
            if current and not consumed:
                out.append(current)
            current, consumed = arg, False
            continue
        if current and not arg.startswith("-"):
            out += [current, arg]
            consumed = True
            continue
        if current and not consumed:  # a flag without values: let click report the missing value
            out.append(current)
        current = None
        out.append(arg)
    if current and not consumed:
        out.append(current)
    return out


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input exits 2 with a one-line message instead of a traceback. SIGUSR1 prints every
    thread's stack to stderr and goes on (what a hung command is doing; its default would kill it)."""
    if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        except (OSError, ValueError, io.UnsupportedOperation):  # stderr is no file (captured): no dump
            pass
    argv = expand_multi_value_options(list(sys.argv[1:] if argv is None else argv))
    try:
        # standalone mode: click turns usage errors into exit code 2 and --help into 0 itself
        app(args=argv, standalone_mode=True)
    except UserInputError as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
