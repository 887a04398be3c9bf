"""AtSpeed's walltime for the GPU check: the target and draft that `atspeed_objectives` trained into a
models folder, timed by `atspeed_latency` (strict at N = 20, beam and HF generate beside it).

    python -m genrec.studies.gpu.atspeed_pair --models-dir DIR --data DATA --target-size base \\
        --device cuda --batch-size 32 --users 128 --out atspeed_b32.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from genrec.studies.atspeed import atspeed_latency
from genrec.workloads.errors import UserInputError, run_main


def trained(models: Path, pattern: str) -> Path:
    found = sorted(p for p in models.glob(pattern) if p.is_dir())
    if not found:
        raise UserInputError(
            f"no {pattern} in {models}: run atspeed_objectives with --models-dir {models} first"
        )
    return found[0]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models-dir", type=Path, required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--target-size", default="base")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--users", type=int, default=64)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    target = trained(a.models_dir, f"target-{a.target_size}-seed0-*")
    draft = trained(a.models_dir, "draft-tiny-sft-seed0-*")
    return atspeed_latency.main(
        [
            "--model",
            str(target),
            "--draft",
            str(draft),
            "--data",
            a.data,
            "--k",
            "10",
            "--draft-beams",
            "20",
            "--gamma",
            "3",
            "--users",
            str(a.users),
            "--batch-size",
            str(a.batch_size),
            "--repeats",
            "3",
            "--warmup",
            "1",
            "--threads",
            "0",
            "--device",
            a.device,
            "--hf",
            "--out",
            a.out,
        ]
    )


if __name__ == "__main__":
    run_main(main)
