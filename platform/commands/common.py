"""Checks shared by several commands, run before anything loads or is written."""

from __future__ import annotations

from pathlib import Path

from genrec.workloads.errors import UserInputError


def check_device(device: str, option: str = "--device") -> None:
    """A one-line error for a device this machine's torch cannot use (instead of a traceback later)."""
    if not device.startswith("cuda"):
        return  # auto falls back to the CPU; cpu is always there
    import torch

    if torch.cuda.is_available():
        return
    reason = (
        "this torch build has no CUDA support"
        if torch.version.cuda is None
        else "no CUDA device is visible (CUDA_VISIBLE_DEVICES, drivers)"
    )
    raise UserInputError(
        f"{option} {device}: {reason} (torch {torch.__version__}); use {option} cpu or auto here, or run "
        "on a machine with a GPU and a CUDA build of torch"
    )


def check_new_output(out: Path, overwrite: bool, what: str) -> None:
    """Refuse to replace an existing, non-empty output folder unless --overwrite says so."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise UserInputError(
            f"{out}: already exists and holds {what}; pass --overwrite to replace it or choose another --out"
        )


# same default as genrec.workloads.results_store, not imported from there so `genrec --help` stays fast
DEFAULT_RESULTS_DIR = "runs/results"


def check_range(
    flag: str, value: float | None, low: float | None = None, high: float | None = None, note: str = ""
) -> None:
    """A number outside [low, high] is exit 2 naming the flag and its valid range, instead of being
    read as some default (0 must never silently mean 'the default'). None = not given: fine."""
    if value is None or ((low is None or value >= low) and (high is None or value <= high)):
        return
    if low is not None and high is not None:
        valid = f"in {low}..{high}"
    else:
        valid = f">= {low}" if low is not None else f"<= {high}"
    raise UserInputError(f"{flag} {value}: must be {valid}" + (f" ({note})" if note else ""))


def check_folder(flag: str, path: Path, fix: str) -> None:
    """An input folder that is not there is exit 2 with the fix, not an empty answer."""
    if not path.is_dir():
        what = "not a folder" if path.exists() else "no such folder"
        raise UserInputError(f"{flag} {path}: {what}; {fix}")


def results_dir_args(results_dir: Path | str | None) -> list[str]:
    """`--results-dir D` for a printed follow-up command when D is not the default one (as resolved from
    the current directory), else nothing: a hint run as printed must read the same rows."""
    if results_dir is None or Path(results_dir).resolve() == Path(DEFAULT_RESULTS_DIR).resolve():
        return []
    return ["--results-dir", str(results_dir)]


def command_hint(*argv: str) -> str:
    """A follow-up command, quoted so it can be pasted into a shell."""
    import shlex

    return shlex.join(argv)


SID_PATTERN_HELP = (
    "How SID tokens are spelled: lcrec (<a_N><b_N>...), openonerec (<s_a_N>...), or a template such as "
    "'<{level}_{code}>' / '<L{level}_{code}>'."
)


def sid_pattern_option(note: str = ""):
    """--sid-pattern, declared once for `genrec model import hf` and `genrec train --init hf:DIR`."""
    import typer

    return typer.Option("--sid-pattern", help=f"{note} {SID_PATTERN_HELP}".strip())
