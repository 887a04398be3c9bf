"""The flags the benchmark drivers share, declared once: name, type and meaning.

A driver names the shared flags it takes with its own defaults, e.g.
`add_shared_options(p, data=None, device="cpu", threads=1, beam_width=10)`, so `--threads` or
`--beam-width` reads and means the same in every `python -m genrec.studies.<topic>.<driver>`; the
driver declares only its own flags beside them. The training recipe the per-seed quality drivers share
is `add_training_options` (genrec.studies.common.seeded_training). Standard library only: the drivers
run on the lent GPU machine.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

REQUIRED: Any = object()  # a default meaning "the driver requires this flag"


@dataclass(frozen=True)
class SharedFlag:
    type: type
    help: str


SHARED_FLAGS: dict[str, SharedFlag] = {
    "data": SharedFlag(str, "dataset folder (genrec data synth / import --out)"),
    "model": SharedFlag(
        str, "checkpoint folder (genrec train --out), or hf:DIR: a Hugging Face folder imported on first use"
    ),
    "device": SharedFlag(str, "cpu, cuda or auto"),
    "threads": SharedFlag(int, "torch intra-op threads (0 = leave as is)"),
    "seed": SharedFlag(int, "random seed"),
    "k": SharedFlag(int, "SIDs returned per user"),
    "beam_width": SharedFlag(int, "beam width"),
    "batch_size": SharedFlag(int, "users per batch"),
    "repeats": SharedFlag(int, "timed repeats"),
    "warmup": SharedFlag(int, "untimed runs before the timed ones"),
}


def add_shared_options(
    p: argparse.ArgumentParser, helps: Mapping[str, str] | None = None, **defaults: Any
) -> None:
    """Add the named shared flags with this driver's defaults (REQUIRED: the flag must be given).
    `helps` replaces a flag's help where the driver says more (e.g. what a default of None means there)."""
    unknown = sorted(set(defaults) - set(SHARED_FLAGS))
    if unknown:
        raise ValueError(
            f"not shared flags: {unknown}; declare them in the driver (shared: {list(SHARED_FLAGS)})"
        )
    for name, default in defaults.items():
        flag = SHARED_FLAGS[name]
        text = (helps or {}).get(name, flag.help)
        opt = "--" + name.replace("_", "-")
        if default is REQUIRED:
            p.add_argument(opt, type=flag.type, required=True, help=text)
        else:
            p.add_argument(opt, type=flag.type, default=default, help=text)


def resolve_model_flags(args: argparse.Namespace, *names: str) -> None:
    """hf:DIR in the named flags (default: model, and draft where the driver has one) -> its cached
    import with --data's items, by the one rule of genrec.workloads.models.hf_cache (a bad hf: path is
    a UserInputError: run_main prints its line and exits 2)."""
    from genrec.workloads.models.hf_cache import is_hf_spec, resolve_model

    for name in names or ("model", "draft"):
        value = getattr(args, name, None)
        if is_hf_spec(value):
            setattr(args, name, str(resolve_model(value, getattr(args, "data", None), role=f"--{name}")))
