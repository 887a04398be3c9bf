"""What a device can run, checked against a decoder's Params before any work is queued.

A parameter can be well typed and still impossible where it would run: a Triton backend (`attention:
triton`, `kernel: triton`) on a machine with no GPU (Triton raises deep inside the first call), or a
`dense_levels` beyond the SIDs' levels. The same check runs in Serve (before a request is queued: 422),
`genrec eval` and `genrec sweep` (before the model loads or the first trial starts: exit 2), so the
message is the same everywhere: it names the parameter, the device and the value to use instead.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from genrec.platform.params import ParamError

TRITON_PARAMETERS = ("attention", "kernel")  # parameters whose value "triton" runs a Triton kernel


def resolve_device(device: str) -> str:
    """`auto` as the decoder host resolves it: cuda when torch sees a GPU, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def triton_unavailable(device: str) -> str:
    """Why Triton kernels cannot run on `device` here ("" when they can): Triton must be installed and
    the device a GPU, or TRITON_INTERPRET=1 set (the interpreter on the CPU, for tests)."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed here"
    if device.startswith("cuda") or os.environ.get("TRITON_INTERPRET") == "1":
        return ""
    return f"Triton kernels need a CUDA device and this runs on {device}"


def check_capabilities(params: Any, device: str | None, levels: int | None = None) -> None:
    """ParamError naming the first parameter of `params` that `device` (None: not known here, e.g. a
    remote cluster's) or SIDs of `levels` levels (None: not known yet) cannot run."""
    device = resolve_device(device) if device is not None else None
    for name in TRITON_PARAMETERS:
        if device is None or getattr(params, name, None) != "triton":
            continue
        reason = triton_unavailable(device)
        if reason:
            raise ParamError(f"`{name}` 'triton': {reason} ({device}); use {name}: torch here", name)
    dense = getattr(params, "dense_levels", None)
    if levels is not None and dense is not None and dense >= levels:
        raise ParamError(
            f"`dense_levels` {dense} is not below the SIDs' {levels} levels; use 0..{levels - 1}",
            "dense_levels",
        )
