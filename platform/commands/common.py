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
