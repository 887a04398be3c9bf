"""One AtSpeed configuration as a registry benchmark (`benchmark: atspeed_arm`): the paper's Table 1 cell.

An arm is a draft objective (how the draft was trained) plus a verification:

    objective   sft | wordkd | seqkd | tvdkd | atspeed_s | atspeed_r, and the ablations
                atspeed_s-no_dr, atspeed_s-no_ca, atspeed_r-no_ca, atspeed_r-top1, and
                atspeed_s-ad / atspeed_r-ad / seqkd-ad (also the target's beams after every level:
                Table 5's w/ AD)
    verification strict (Algorithm 1; WS against the target's beam search at beam K) or
                relaxed (Algorithm 2; quality against the target's sampling beam search)

`arm_point(...)` for one seed: trains (or reuses) the target (`next_item`, `target_size`), the teacher
file (the target's top-`teacher_k` beam SIDs; sampled ones for atspeed_r), and the draft
(`draft_size`, the arm's objective, `alpha`); then decodes the first `users` test users with the
target's reference (beam search, or sampling beam search for relaxed) and with AtSpeed, alternating
per batch, and returns WS@K (reference median / AtSpeed median), AS@K (accepted levels per SD step),
per-level acceptance, target calls per batch, the phase split, quality of both on the same users
(HR / NDCG / Recall @K) and, for strict, the share of batches whose top-K equals beam search's.
Checkpoints are cached under `models_dir` by configuration (one training per configuration, locked
against concurrent trials). Study driver code (no ray): also runs on a plain GPU machine.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from genrec.studies.nezha.nezha_arms import ensure_trained
from genrec.workloads.errors import UserInputError
from genrec.workloads.training.align_sequence_level import ATSPEED_S_READING
from genrec.workloads.training.train_config import TrainConfig

# objective name -> (trainer objective, flags)
OBJECTIVES: dict[str, tuple[str, dict]] = {
    "sft": ("next_item", {}),
    "wordkd": ("wordkd", {}),
    "seqkd": ("seqkd", {}),
    "tvdkd": ("tvdkd", {}),
    "atspeed_s": ("atspeed_s", {}),
    "atspeed_r": ("atspeed_r", {}),
    "atspeed_s-no_dr": ("atspeed_s", {"no_dr": True}),
    "atspeed_s-no_ca": ("atspeed_s", {"no_ca": True}),
    "atspeed_r-no_ca": ("atspeed_r", {"no_ca": True}),
    "atspeed_r-top1": ("atspeed_r", {"top1": True}),
    "atspeed_s-ad": ("atspeed_s", {"all_steps": True}),
    "atspeed_r-ad": ("atspeed_r", {"all_steps": True}),
    "seqkd-ad": ("seqkd", {"all_steps": True}),
}
VERIFICATIONS = ("strict", "relaxed")
NEEDS_TEACHER = ("seqkd", "atspeed_s", "atspeed_r")


def cached_dir(models_dir: str | Path, data: str | Path, name: str, fields: dict) -> Path:
    key = json.dumps({"data": str(Path(data).resolve()), **fields}, sort_keys=True, default=str)
    return Path(models_dir) / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def ensure_teacher(
    target_dir: Path,
    data: str,
    out: Path,
    k: int,
    sampling: bool,
    seed: int,
    device: str,
    mix_draft: Path | None = None,
    mix_lambda: float = 0.5,
    all_steps: bool = False,
) -> Path:
    """Build the teacher file once (locked: concurrent trials wait for the first). With `mix_draft`,
    the beam top-K of its mixture with the target (weight `mix_lambda` on the target; the paper's D');
    `out` must then name the draft and lambda, since an existing file is reused as it is."""
    from genrec.workloads.evaluation import load_context
    from genrec.workloads.training.teacher import TeacherMixture, build_teacher_data

    mixture = TeacherMixture(mix_lambda, str(mix_draft)) if mix_draft is not None else None
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            ctx, ds, _ = load_context(target_dir, data, device, draft_dir=mix_draft)
            build_teacher_data(
                ctx,
                ds,
                k,
                out,
                sampling=sampling,
                seed=seed,
                target_path=target_dir,
                progress=False,
                mixture=mixture,
                all_steps=all_steps,
            )
    return out


def teacher_steps(objective: str) -> bool:
    """Whether the objective trains on all-step teacher data (its file also holds every level's beam)."""
    return bool(OBJECTIVES[objective][1].get("all_steps"))


def teacher_kind(objective: str) -> tuple[bool, bool, str]:
    """(sampling, all_steps, the kind in the cached teacher file's name) of an objective's teacher
    file: AtSpeed-R's sampled SIDs or the beam top-K, with every level's beams for the -ad objectives."""
    sampling, steps = OBJECTIVES[objective][0] == "atspeed_r", teacher_steps(objective)
    return sampling, steps, ("sample" if sampling else "beam") + ("-all" if steps else "")


def train_config(objective: str, size: str, seed: int, common: dict, **extra) -> TrainConfig:
    if objective not in OBJECTIVES:
        raise UserInputError(f"objective must be one of {list(OBJECTIVES)}, got {objective!r}")
    trainer_objective, flags = OBJECTIVES[objective]
    cfg = TrainConfig(model_size=size, seed=seed, objective=trainer_objective, **flags, **common, **extra)
    cfg.validate()
    return cfg


def prepare_models(
    objective: str,
    data: str,
    models_dir: str,
    target_size: str,
    draft_size: str,
    seed: int,
    common: dict,
    teacher_k: int,
    alpha: float,
    device: str,
) -> tuple[Path, Path]:
    """The target and the arm's draft for `seed`, trained (or reused)."""
    target_cfg = train_config("sft", target_size, seed, common)
    target_dir = cached_dir(models_dir, data, f"target-{target_size}-seed{seed}", asdict(target_cfg))
    ensure_trained(data, target_dir, target_cfg)
    extra: dict = {}
    if objective != "sft":
        extra = {"target": str(target_dir), "alpha": alpha}
    if OBJECTIVES[objective][0] in NEEDS_TEACHER:
        sampling, steps, kind = teacher_kind(objective)
        out = Path(models_dir) / f"teacher-{kind}-k{teacher_k}-{target_dir.name}.parquet"
        extra["teacher"] = str(
            ensure_teacher(target_dir, data, out, teacher_k, sampling, seed, device, all_steps=steps)
        )
    draft_cfg = train_config(objective, draft_size, seed, common, **extra)
    fields = asdict(draft_cfg)
    if OBJECTIVES[objective][0] == "atspeed_s":  # a draft of an earlier reading of the loss is not reused
        fields["atspeed_s_reading"] = ATSPEED_S_READING
    draft_dir = cached_dir(models_dir, data, f"draft-{draft_size}-{objective}-seed{seed}", fields)
    ensure_trained(data, draft_dir, draft_cfg)
    return target_dir, draft_dir


def time_pair(ctx, batches, reference, arm, repeats: int) -> tuple[list, list]:
    """(ms, DecodeResult) per batch and repeat for the reference and the arm, alternating order."""
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    for dec, params in (reference, arm):  # warm-up
        dec.decode(ctx, batches[0], params)
    out: tuple[list, list] = ([], [])
    for r in range(repeats):
        for i, hist in enumerate(batches):
            order = (0, 1) if (r + i) % 2 == 0 else (1, 0)
            for which in order:
                dec, params = (reference, arm)[which]
                sync()
                t0 = time.perf_counter_ns()
                res = dec.decode(ctx, hist, params)
                sync()
                out[which].append(((time.perf_counter_ns() - t0) / 1e6, res))
    return out


def quality(runs, targets_per_batch, k: int) -> dict:
    from genrec.workloads.metrics import ranking_metrics

    ranked = [ids for _, res in runs for ids in res.item_ids.tolist()]
    targets = [t for batch in targets_per_batch for t in batch] * (len(runs) // len(targets_per_batch))
    return ranking_metrics(ranked, targets, (k,))


def arm_point(
    objective: str,
    verification: str = "strict",
    data: str = "runs/data/synth",
    models_dir: str = "runs/models/atspeed_arms",
    target_size: str = "small",
    draft_size: str = "tiny",
    epochs: int = 8,
    k: int = 10,
    draft_beams: int = 40,
    gamma: int = 3,
    tree_attention: bool = True,
    teacher_k: int = 10,
    alpha: float = 0.5,
    users: int = 128,
    batch_size: int = 1,
    repeats: int = 1,
    seed: int = 42,
    threads: int = 1,
    device: str = "cpu",
) -> dict:
    """Train (or reuse) the target and the arm's draft for `seed`; measure AtSpeed against its reference."""
    from genrec.workloads.decoding.base import get_decoder, make_params
    from genrec.workloads.evaluation import load_context

    if verification not in VERIFICATIONS:
        raise UserInputError(f"verification must be one of {list(VERIFICATIONS)}, got {verification!r}")
    if threads:
        torch.set_num_threads(threads)
    common = {"epochs": epochs, "device": device, "threads": threads}
    target_dir, draft_dir = prepare_models(
        objective, data, models_dir, target_size, draft_size, seed, common, teacher_k, alpha, device
    )
    ctx, ds, _ = load_context(target_dir, data, device, draft_dir=draft_dir)
    examples = ds.eval_examples("test")[:users]
    batches = [
        [ex.history for ex in examples[i : i + batch_size]] for i in range(0, len(examples), batch_size)
    ]
    targets = [
        [ex.targets for ex in examples[i : i + batch_size]] for i in range(0, len(examples), batch_size)
    ]
    relaxed = verification == "relaxed"
    ref_dec = get_decoder("beam_sample" if relaxed else "beam")
    ref = (ref_dec, make_params(ref_dec, {"beam_width": k, "k": k, **({"seed": seed} if relaxed else {})}))
    at_dec = get_decoder(f"atspeed_{verification}")
    at_params = {
        "beam_width": k,
        "k": k,
        "draft_beams": max(draft_beams, k),
        "gamma": gamma,
        "tree_attention": tree_attention,
        "seed": seed,
    }
    arm = (at_dec, make_params(at_dec, at_params))
    ref_runs, arm_runs = time_pair(ctx, batches, ref, arm, repeats)
    return summarise(ref_runs, arm_runs, targets, k, relaxed) | {
        "target_dir": str(target_dir),
        "draft_dir": str(draft_dir),
        "users": len(examples),
        "dataset_name": ds.manifest.name,
    }


def summarise(ref_runs, arm_runs, targets, k: int, relaxed: bool) -> dict:
    ref_ms = np.array([ms for ms, _ in ref_runs])
    arm_ms = np.array([ms for ms, _ in arm_runs])
    counters = [res.counters for _, res in arm_runs]
    steps = sum(c["sd_steps"] for c in counters)
    out = {
        "ws": float(np.median(ref_ms) / np.median(arm_ms)),
        "ws_mean_ratio": float(np.mean(ref_ms / arm_ms)),
        "reference_ms": float(np.median(ref_ms)),
        "atspeed_ms": float(np.median(arm_ms)),
        "accepted_steps": float(sum(c["accepted_steps"] * c["sd_steps"] for c in counters) / max(1, steps)),
        "target_calls": float(np.mean([c["target_calls"] for c in counters])),
        "draft_calls": float(np.mean([c["draft_calls"] for c in counters])),
    }
    for phase in ("prefill", "draft", "verify"):
        out[f"{phase}_ms"] = float(np.median([res.timings_ms.get(phase, 0.0) for _, res in arm_runs]))
    out["free_draft_ceiling"] = float(np.median(ref_ms) / max(1e-9, np.median(arm_ms) - out["draft_ms"]))
    for j in range(1, 6):
        key = f"acceptance_level_{j}"
        if any(key in c for c in counters):
            out[key] = float(np.mean([c.get(key, 0.0) for c in counters]))
    for name, runs in (("reference", ref_runs), ("atspeed", arm_runs)):
        for metric, value in quality(runs, targets, k).items():
            out[f"{name}_{metric}"] = value
    if not relaxed:
        same = [torch.equal(a.codes, b.codes) for (_, a), (_, b) in zip(ref_runs, arm_runs)]
        out["identical_share"] = float(np.mean(same))
    return out
