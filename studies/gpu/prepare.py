"""The GPU check's data and model: a synthetic catalogue and a briefly trained model (no network, no Ray).

    python -m genrec.studies.gpu.prepare --out WORK --device cuda [--dry]

Writes WORK/data (a `genrec data synth` folder) and WORK/model (a `small` checkpoint trained for a few
hundred steps; `--dry`: a `tiny` one for two steps on a tiny catalogue). Serving throughput and the
AtSpeed training read these; quality is not what the check measures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from genrec.workloads.data.synth import SynthConfig, synth_dataset
from genrec.workloads.errors import run_main
from genrec.workloads.training.train_config import TrainConfig
from genrec.workloads.training.trainer import train

FULL = SynthConfig(seed=0, num_users=6000, num_items=5000, codebook_size=256)
DRY = SynthConfig(seed=0, num_users=200, num_items=300, codebook_size=16, feature_dim=0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dry", action="store_true", help="tiny data and model (the CPU dry run)")
    a = p.parse_args(argv)
    data, _ = synth_dataset(DRY if a.dry else FULL, a.out / "data", overwrite=True)
    cfg = TrainConfig(
        model_size="tiny" if a.dry else "small",
        epochs=1,
        max_steps=2 if a.dry else 300,
        device=a.device,
        max_val_examples=100,
    )
    train(data, a.out / "model", cfg, progress=False)
    print(f"prepared {data} and {a.out / 'model'}")
    return 0


if __name__ == "__main__":
    run_main(main)
