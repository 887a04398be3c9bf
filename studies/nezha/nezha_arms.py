"""One arm of issue 6's comparison as a registry benchmark (`benchmark: nezha_arm`).

An arm is a training objective (and NEZHA head variant) plus a decoder:

    beam      next_item checkpoint, beam search
    nezha     NEZHA head, final verification (the paper's NEZHA)
    nezha-1   head without the context state (no_context), final verification
    nezha-2   head without the placeholder states (no_placeholder), final verification
    nezha-3   addition instead of the RNN transition (add), final verification
    nezha-4   the nezha checkpoint, no verification
    nezha-every  the nezha checkpoint, verification at every step (invalid prefixes never survive, so
              every user gets K items whenever K valid ones exist under the head's beams)
    mtp       parallel heads (MTP), final verification
    beam-converged  next_item with 5x the epoch budget (early stopping ends it when validation stops
              improving): shows whether the shared epoch budget let beam search converge. With
              head_batching="per_example" the head objectives take about 5x more optimiser steps per
              epoch than next_item; with "packed" (the default) they take the same steps

`arm_point(arm, seed, ...)` trains the arm's checkpoint for that seed (or reuses one already trained
with the same configuration: nezha and nezha-4 share theirs), evaluates it on the test split and
returns the quality, validity, latency (prefill / decode) and training figures. Every arm of one seed
is trained from the same seed, data, size and epoch budget (seeded_training's rule). The sweep runs
one trial per (arm, seed); the report page (studies/nezha/report.py) averages over seeds and runs the
paired one-sided t-tests. Study driver code (no ray): also runs on a plain GPU machine.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from genrec.workloads.errors import UserInputError
from genrec.workloads.training.train_config import TrainConfig

if TYPE_CHECKING:
    from genrec.workloads.evaluation import EvalConfig
    from genrec.workloads.results import ResultRow


@dataclass(frozen=True)
class Arm:
    objective: str  # next_item | nezha | mtp
    head_variant: str  # full | no_context | no_placeholder | add
    decoder: str  # beam | nezha | mtp
    verify: str | None  # final | none for head decoders; None for beam search
    epoch_factor: int = 1  # the arm trains for epochs * epoch_factor (early stopping still applies)


ARMS: dict[str, Arm] = {
    "beam": Arm("next_item", "full", "beam", None),
    "nezha": Arm("nezha", "full", "nezha", "final"),
    "nezha-1": Arm("nezha", "no_context", "nezha", "final"),
    "nezha-2": Arm("nezha", "no_placeholder", "nezha", "final"),
    "nezha-3": Arm("nezha", "add", "nezha", "final"),
    "nezha-4": Arm("nezha", "full", "nezha", "none"),
    "nezha-every": Arm("nezha", "full", "nezha", "every"),
    "mtp": Arm("mtp", "full", "mtp", "final"),
    "beam-converged": Arm("next_item", "full", "beam", None, epoch_factor=5),
}
QUALITY_KEYS = ("hr@5", "ndcg@5", "recall@5", "hr@10", "ndcg@10", "recall@10")


def checkpoint_dir(models_dir: str | Path, data: str | Path, cfg: TrainConfig) -> Path:
    """Where the arm's checkpoint lives: named by objective, variant and seed, plus a hash of the
    dataset path and the whole training configuration (a changed budget never reuses a stale one)."""
    fields = asdict(cfg)
    if cfg.objective == "next_item":  # next_item ignores head_batching: one checkpoint for either
        fields.pop("head_batching")
    key = json.dumps({"data": str(Path(data).resolve()), **fields}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    variant = "" if cfg.head_variant == "full" else f"-{cfg.head_variant}"
    return Path(models_dir) / f"{cfg.model_size}-{cfg.objective}{variant}-seed{cfg.seed}-{digest}"


def arm_train_config(arm: str, *, epochs: int, **shared) -> TrainConfig:
    """The arm's TrainConfig: the fields every arm shares (`shared`, seed included), plus the arm's
    objective, head variant and epoch budget."""
    if arm not in ARMS:
        raise UserInputError(f"arm must be one of {list(ARMS)}, got {arm!r}")
    spec = ARMS[arm]
    cfg = TrainConfig(
        **shared,
        epochs=epochs * spec.epoch_factor,
        objective=spec.objective,
        head_variant=spec.head_variant,
    )
    cfg.validate()
    return cfg


def finished(model_dir: Path) -> bool:
    """Training writes train_seconds into config.json after its last epoch."""
    config = model_dir / "config.json"
    return config.exists() and "train_seconds" in json.loads(config.read_text())


def ensure_trained(data: str | Path, model_dir: Path, cfg: TrainConfig, progress: bool = False) -> None:
    """Train into model_dir unless a finished checkpoint is there.

    A file lock makes concurrent trials that need the same checkpoint (nezha and nezha-4) train it
    once: the second waits, then finds it finished."""
    from genrec.workloads.training.trainer import train

    model_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(model_dir.parent / f"{model_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not finished(model_dir):
            if progress:  # the epoch lines that follow do not name the model
                print(f"training {model_dir.name} ({cfg.objective}, up to {cfg.epochs} epochs)", flush=True)
            train(data, model_dir, cfg, progress=progress)


def arm_eval_config(
    spec: Arm, beam_width: int, eval_batch_size: int, max_users: int, seed: int, device: str, threads: int
) -> EvalConfig:
    """The arm's EvalConfig: its decoder (and verification mode), K = 10, cut-offs 5 and 10."""
    from genrec.workloads.evaluation import EvalConfig

    params: dict = {"beam_width": beam_width, "k": 10}
    if spec.verify is not None:
        params["verify"] = spec.verify
    return EvalConfig(
        decoder=spec.decoder,
        params=params,
        ks=(5, 10),
        batch_size=eval_batch_size,
        max_users=max_users,
        seed=seed,
        device=device,
        threads=threads,
    )


def arm_row(row: ResultRow, dataset_name: str, model_dir: Path, meta: dict) -> dict:
    """The point's figures from the evaluation row and the checkpoint's training record (`meta`)."""
    q, timings, counters = row.quality, row.timings_ms, row.counters
    candidates = counters.get("candidates", 0.0)
    out = {k: q[k] for k in QUALITY_KEYS}
    out |= {
        "invalid_rate": q["invalid_rate"],
        "missing_rate": q.get("missing_rate", 0.0),
        "valid_share": 1.0 - q["invalid_rate"] - q.get("missing_rate", 0.0),
        "users_with_k_valid": q["users_with_k_valid"],  # the "K valid items for 99% of users"
        # head decoders: share of the unverified top-K drafts that are items (NEZHA-4's list)
        "drafts_valid_share": counters["drafts_valid"] / candidates if candidates else float("nan"),
        "latency_p50_ms": row.latency_ms["p50"],
        "latency_p99_ms": row.latency_ms["p99"],
        "prefill_ms": timings.get("prefill", 0.0),
        # beam steps, or NEZHA's draft + verify (the paper's LT split)
        "decode_ms": timings.get("decode", 0.0),
        "verify_ms": timings.get("verify", 0.0),
        "users": row.users,
        "dataset_name": dataset_name,
        "model_dir": str(model_dir),
        "train_seconds": meta.get("train_seconds", float("nan")),
        "train_steps": meta.get("steps", 0),
        "best_epoch": meta.get("best_epoch", 0),
        "best_val_loss": meta.get("best_val_loss", float("nan")),
        "history_blind_val_loss": meta.get("history_blind_val_loss", float("nan")),
    }
    return out


def arm_point(
    arm: str,
    data: str = "runs/data/synth",
    models_dir: str = "runs/models/nezha_arms",
    model_size: str = "tiny",
    epochs: int = 8,
    lr: float = 3e-3,
    batch_size: int = 128,
    patience: int = 3,
    max_steps: int = 0,
    beam_width: int = 10,
    eval_batch_size: int = 32,
    max_users: int = 0,
    seed: int = 42,
    threads: int = 1,
    device: str = "cpu",
    head_batching: str = "packed",
    progress: bool = False,
) -> dict:
    """Train (or reuse) the arm's checkpoint for `seed` and evaluate it on the test split."""
    from genrec.workloads.decoding import mtp as _mtp  # noqa: F401  (registers nezha and mtp)
    from genrec.workloads.evaluation import evaluate, load_context

    cfg = arm_train_config(  # refuses an unknown arm
        arm,
        model_size=model_size,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        patience=patience,
        max_steps=max_steps,
        seed=seed,
        device=device,
        threads=threads,
        head_batching=head_batching,
    )
    model_dir = checkpoint_dir(models_dir, data, cfg)
    ensure_trained(data, model_dir, cfg, progress)
    ctx, ds, ckpt = load_context(model_dir, data, device)
    ec = arm_eval_config(ARMS[arm], beam_width, eval_batch_size, max_users, seed, device, threads)
    row = evaluate(ctx, ds, ec, model_dir.name, progress=progress).row
    # ckpt.meta is config.json: training time, steps, best epoch and losses
    return arm_row(row, ds.manifest.name, model_dir, ckpt.meta)
