"""AtSpeed draft objectives side by side, strict verification, several seeds, one process (no Ray).

    python -m genrec.studies.atspeed.atspeed_objectives --data /tmp/as/data \\
        --models-dir /tmp/as/models --objectives sft seqkd atspeed_s atspeed_s-no_dr atspeed_s-literal \\
        --seeds 42 43 44 --k 10 5 --draft-beams 40 20 10 --gamma 3 --users 256 --threads 1 --out FILE.json

Per seed: the `target_size` target (next item; or one trained target shared by every seed, --target,
when only the drafts' seeds should vary), its beam teacher file (top `teacher_k` SIDs) and one
`draft_size` draft per objective, trained or reused under --models-dir exactly as
`atspeed_arms.prepare_models` names them (objective names as in `atspeed_arms.OBJECTIVES`). Then, per
draft, K and N, the first --users test users are decoded one at a time with the target's beam search
at beam K and with `atspeed_strict` (N draft beams, gamma, tree attention), alternating: AS@K
(accepted levels per SD step), target calls, WS@K and whether every user's top-K equals beam search's.
The summary gives, per (K, N) and objective, the per-seed AS@K, its median, and one-sided paired tests
of the first AtSpeed-S objective against each other objective: over seeds (paired t, H1: AtSpeed-S
accepts more) and over (seed, user) pairs (sign-flip permutation), plus each draft's training seconds
and validation loss.

`atspeed_s-literal` is an ablation only this driver trains: AtSpeed-S with eq. 4's density term as
printed (`AlignFlags.dr_mode="literal"`, training/align.py), which the trainer's CLI does not expose.
Every AtSpeed-S draft's cache key carries the objective's reading (`ATSPEED_S_READING`), so drafts
trained by the code before the re-check (a different loss under the same TrainConfig) are not reused.

`<objective>-mix` (`atspeed_s-mix`, `seqkd-mix`, or a SeqKD / AtSpeed-S ablation with the suffix)
trains that objective on the paper's mixture data D' instead of the target's own top-K: the beam
top-`teacher_k` of (1 - lambda) q + lambda p (`--mix-lambda`, default 0.5; training/teacher.py), with
q the seed's SFT draft (the `sft` objective's draft, trained first by this driver if not yet cached).
That is one round of "on-policy" data: q is the SFT draft, never the draft being trained, and the data
is not rebuilt as that draft changes. The mixture teacher file's name carries lambda and a hash of
lambda and the target's and the SFT draft's paths (each path a hash of its configuration), so no
stale file is reused.

`atspeed_s-ad`, `atspeed_r-ad` and `seqkd-ad` train on all-step teacher data (the paper's Table 5
"w/ AD": the target's beams after every level as well as its final top-K; training/align_sequences.py),
from extra teacher files (`teacher-beam-all-...`, `teacher-sample-all-...`); they take no -mix.

`<objective>@<alpha>` (`seqkd@0.7`, `atspeed_s-mix@0.3`) trains that objective with its own alignment
weight instead of --alpha, so one run can hold each method at its best alpha, or one method at
several. The label only names the rows; the cached draft is found by its configuration, so a draft
trained with `--alpha 0.7` is the one `@0.7` reuses. `sft` takes no alpha (it has no alignment term).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from genrec.studies.atspeed.atspeed_arms import (
    NEEDS_TEACHER,
    OBJECTIVES,
    cached_dir,
    ensure_teacher,
    summarise,
    teacher_kind,
    teacher_steps,
    time_pair,
    train_config,
)
from genrec.studies.common.options import REQUIRED, add_shared_options
from genrec.studies.nezha.nezha_arms import ensure_trained
from genrec.workloads.decoding.mixture_model import check_mix_lambda
from genrec.workloads.errors import UserInputError, run_main
from genrec.workloads.io import atomic_write_text
from genrec.workloads.metrics import paired_permutation_test, paired_t_test_less
from genrec.workloads.training.align_sequence_level import ATSPEED_S_READING

MODULE = "genrec.studies.atspeed.atspeed_objectives"
LITERAL = "atspeed_s-literal"
MIX = "-mix"  # objective suffix: train on the draft/target mixture data D' (module doc)
MIXABLE = ("seqkd", "atspeed_s")  # the trainer objectives that read the teacher's top-K beam SIDs
ALPHA = "@"  # objective suffix: this objective's own alignment weight (module doc)
# TrainConfig fields the driver can set (unset: TrainConfig's defaults); a draft's cache key is its
# whole TrainConfig, so the drafts cached before these flags existed are still found
RECIPE_FIELDS = {"lr": float, "batch_size": int, "warmup_steps": int, "weight_decay": float, "patience": int}


def recipe_overrides(args: argparse.Namespace) -> dict:
    """The recipe flags given on the command line, as TrainConfig fields."""
    return {name: getattr(args, name) for name in RECIPE_FIELDS if getattr(args, name) is not None}


def split_alpha(objective: str) -> tuple[str, float | None]:
    """`seqkd@0.7` -> ("seqkd", 0.7); an objective without its own alpha -> (objective, None)."""
    name, sep, alpha = objective.partition(ALPHA)
    if not sep:
        return objective, None
    try:
        value = float(alpha)
    except ValueError:
        raise UserInputError(
            f"objective {objective!r}: {alpha!r} after '@' is not a number (e.g. seqkd@0.7)"
        ) from None
    if not 0.0 <= value <= 1.0:
        raise UserInputError(f"objective {objective!r}: alpha must be in [0, 1], got {value}")
    if name == "sft":
        raise UserInputError(f"objective {objective!r}: sft has no alignment term, so no alpha; write sft")
    return name, value


def base_objective(objective: str) -> str:
    """The atspeed_arms.OBJECTIVES entry an objective trains (without -mix or @alpha; the literal
    ablation is AtSpeed-S with other flags)."""
    base = split_alpha(objective)[0].removesuffix(MIX)
    return "atspeed_s" if base == LITERAL else base


def known_objective(objective: str) -> bool:
    name = split_alpha(objective)[0]
    if name.endswith(MIX):
        base = name.removesuffix(MIX)
        # the mixture file holds the final top-K only, not every level's beam
        return base in OBJECTIVES and OBJECTIVES[base][0] in MIXABLE and not teacher_steps(base)
    return name in OBJECTIVES or name == LITERAL


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    add_shared_options(
        p,
        helps={"data": "dataset folder"},
        data=REQUIRED,
        threads=1,
        device="cpu",
    )
    p.add_argument("--models-dir", required=True, help="where targets, teacher files and drafts are cached")
    p.add_argument(
        "--objectives",
        nargs="+",
        default=["sft", "seqkd", "atspeed_s", "atspeed_s-no_dr"],
        help="draft objectives, each optionally with -mix and/or its own alpha: seqkd@0.7 (module doc)",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    p.add_argument("--target-size", default="small")
    p.add_argument(
        "--target",
        default=None,
        help="a trained target checkpoint shared by every seed (then the seeds vary the drafts only; "
        "default: train one `--target-size` target per seed)",
    )
    p.add_argument("--draft-size", default="tiny")
    p.add_argument("--epochs", type=int, default=8)
    recipe = p.add_argument_group(
        "training recipe",
        "default: TrainConfig's (lr 3e-3, batch 128, warm-up 100, weight decay 0.05, patience 3). The "
        "paper trains its drafts with --lr 1e-3 --batch-size 64 --warmup-steps 200 --weight-decay 0.01 "
        "or 0.1 for 20 epochs. Applies to every model this driver trains (a per-seed target too).",
    )
    for name, kind in RECIPE_FIELDS.items():
        recipe.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    p.add_argument("--k", type=int, nargs="+", default=[10, 5], help="the target's beam K values")
    p.add_argument("--draft-beams", type=int, nargs="+", default=[40], help="N values (raised to K)")
    p.add_argument("--gamma", type=int, default=3)
    p.add_argument(
        "--verification",
        nargs="+",
        choices=["strict", "relaxed"],
        default=["strict"],
        help="strict: against the target's beam search; relaxed: against its sampling beam search "
        "(temperature 1, the same seed), with Recall@K of both",
    )
    p.add_argument("--teacher-k", type=int, default=10)
    p.add_argument(
        "--alpha", type=float, default=0.5, help="alignment weight of every objective without its own @ALPHA"
    )
    p.add_argument(
        "--mix-lambda",
        type=float,
        default=0.5,
        help="the target's weight in the -mix objectives' teacher mixture (1 - lambda) q + lambda p",
    )
    p.add_argument("--users", type=int, default=256)
    p.add_argument("--quiet", action="store_true", help="no line per trained model and epoch")
    p.add_argument("--out", default=None, help="JSON file for the per-seed rows and the summary")
    args = p.parse_args(argv)
    try:
        unknown = [o for o in args.objectives if not known_objective(o)]
    except UserInputError as e:
        p.error(str(e))
    if unknown:
        mixed = [f"{o}{MIX}" for o in OBJECTIVES if known_objective(f"{o}{MIX}")]
        p.error(f"unknown objectives {unknown}; choose from {[*OBJECTIVES, LITERAL, *mixed]}")
    try:
        check_mix_lambda(args.mix_lambda)
    except UserInputError as e:
        p.error(str(e))
    return args


@contextmanager
def literal_density_term() -> Iterator[None]:
    """Train AtSpeed-S with eq. 4's density term as printed: the trainer builds its AlignFlags from
    TrainConfig, which has no field for it, so the objective's flags are swapped after it is built."""
    from genrec.workloads.training import align

    original = align.prepare_alignment

    def literal(*a, **kw):
        objective, meta = original(*a, **kw)
        objective.flags = replace(objective.flags, dr_mode="literal")
        meta["align_flags"] = asdict(objective.flags)
        return objective, meta

    align.prepare_alignment = literal  # trainer.train imports it at call time
    try:
        yield
    finally:
        align.prepare_alignment = original


def train_timed(data: str, model_dir: Path, cfg, literal: bool = False, progress: bool = False) -> dict:
    """Train (or reuse) one checkpoint; its training seconds and best validation loss from config.json.
    progress: a line naming the model, then one per epoch, when it is trained."""
    if literal:
        with literal_density_term():
            ensure_trained(data, model_dir, cfg, progress)
    else:
        ensure_trained(data, model_dir, cfg, progress)
    meta = json.loads((model_dir / "config.json").read_text())
    return {
        "dir": str(model_dir),
        "train_seconds": meta.get("train_seconds"),
        "val_loss": meta["best_val_loss"],
    }


def seed_target(args: argparse.Namespace, seed: int, common: dict) -> tuple[Path, dict]:
    """The seed's target: --target as given (shared), or one trained (or reused) for this seed."""
    if args.target is not None:
        target_dir = Path(args.target).resolve()
        if not (target_dir / "config.json").is_file():
            raise UserInputError(f"--target {args.target}: no checkpoint there (config.json missing)")
        meta = json.loads((target_dir / "config.json").read_text())
        info = {"dir": str(target_dir), "train_seconds": meta.get("train_seconds"), "shared": True}
        return target_dir, {**info, "val_loss": meta.get("best_val_loss")}
    target_cfg = train_config("sft", args.target_size, seed, common)
    target_dir = cached_dir(
        args.models_dir, args.data, f"target-{args.target_size}-seed{seed}", asdict(target_cfg)
    )
    return target_dir, train_timed(args.data, target_dir, target_cfg, progress=not args.quiet)


def teacher_path(args: argparse.Namespace, target_dir: Path, objective: str, seed: int) -> Path:
    """Where the objective's teacher file of the target is cached: one beam file (and one with every
    level's beams) per target; with a shared --target one sampling file per seed (the sampled SIDs
    depend on it), named after the target's path."""
    sampling, _, kind = teacher_kind(objective)
    if args.target is None:
        return Path(args.models_dir) / f"teacher-{kind}-k{args.teacher_k}-{target_dir.name}.parquet"
    tag = hashlib.sha256(str(target_dir).encode()).hexdigest()[:10]
    per_seed = f"-seed{seed}" if sampling else ""
    return Path(args.models_dir) / f"teacher-{kind}-k{args.teacher_k}-shared-{tag}{per_seed}.parquet"


def mixture_teacher_path(args: argparse.Namespace, target_dir: Path, draft_dir: Path) -> Path:
    """Where the mixture teacher file of (target, draft q, lambda) is cached."""
    paths = {"target": str(target_dir.resolve()), "draft": str(draft_dir.resolve())}
    key = json.dumps({**paths, "lambda": args.mix_lambda}, sort_keys=True)  # the name shows it rounded
    tag = hashlib.sha256(key.encode()).hexdigest()[:10]
    return Path(args.models_dir) / f"teacher-mix{args.mix_lambda:g}-k{args.teacher_k}-{tag}.parquet"


def sft_draft(args: argparse.Namespace, seed: int, common: dict) -> Path:
    """The seed's SFT draft, trained (or reused) under the name the `sft` objective gives it."""
    cfg = train_config("sft", args.draft_size, seed, common)
    draft_dir = cached_dir(args.models_dir, args.data, f"draft-{args.draft_size}-sft-seed{seed}", asdict(cfg))
    train_timed(args.data, draft_dir, cfg, progress=not args.quiet)
    return draft_dir


def seed_teacher(args: argparse.Namespace, objective: str, target_dir: Path, seed: int, common: dict) -> Path:
    """The objective's teacher file: the target's beam (or, for AtSpeed-R, sampled) SIDs, or for a
    -mix objective the beam top-K of the SFT draft's mixture with the target."""
    if split_alpha(objective)[0].endswith(MIX):
        q = sft_draft(args, seed, common)
        out = mixture_teacher_path(args, target_dir, q)
        return ensure_teacher(
            target_dir, args.data, out, args.teacher_k, False, seed, args.device, q, args.mix_lambda
        )
    base = base_objective(objective)
    sampling, steps, _ = teacher_kind(base)
    out = teacher_path(args, target_dir, base, seed)
    return ensure_teacher(
        target_dir, args.data, out, args.teacher_k, sampling, seed, args.device, all_steps=steps
    )


def prepare_seed(args: argparse.Namespace, seed: int) -> tuple[Path, dict[str, dict]]:
    """The seed's target and one draft per objective (trained or reused)."""
    common = {"epochs": args.epochs, "device": args.device, "threads": args.threads, **recipe_overrides(args)}
    target_dir, target_info = seed_target(args, seed, common)
    drafts = {"target": target_info}
    for objective in args.objectives:
        name = base_objective(objective)
        label, own_alpha = split_alpha(objective)
        extra: dict = {}
        if name != "sft":
            extra = {"target": str(target_dir), "alpha": args.alpha if own_alpha is None else own_alpha}
        if OBJECTIVES[name][0] in NEEDS_TEACHER:
            extra["teacher"] = str(seed_teacher(args, objective, target_dir, seed, common))
        cfg = train_config(name, args.draft_size, seed, common, **extra)
        fields = asdict(cfg)
        if OBJECTIVES[name][0] == "atspeed_s":
            fields["atspeed_s_reading"] = ATSPEED_S_READING
        draft_dir = cached_dir(
            args.models_dir, args.data, f"draft-{args.draft_size}-{label}-seed{seed}", fields
        )
        literal = label == LITERAL
        drafts[objective] = train_timed(args.data, draft_dir, cfg, literal=literal, progress=not args.quiet)
    return target_dir, drafts


def measure(
    args: argparse.Namespace, target_dir: Path, draft_dir: str, seed: int, k: int, n: int, verification: str
) -> dict:
    """AtSpeed (n draft beams) against its reference on the first --users test users: strict against
    the target's beam search at beam k, relaxed against its sampling beam search (seeded)."""
    from genrec.workloads.decoding.base import get_decoder, make_params
    from genrec.workloads.evaluation import load_context
    from genrec.workloads.metrics import user_metric_vector

    ctx, ds, _ = load_context(target_dir, args.data, args.device, draft_dir=draft_dir)
    examples = ds.eval_examples("test")[: args.users]
    if not examples:
        raise UserInputError("the dataset has no test users")
    batches = [[ex.history] for ex in examples]
    targets = [[ex.targets] for ex in examples]
    relaxed = verification == "relaxed"
    ref_name, arm_name = ("beam_sample", "atspeed_relaxed") if relaxed else ("beam", "atspeed_strict")
    ref_dec, arm_dec = get_decoder(ref_name), get_decoder(arm_name)
    ref_params = {"beam_width": k, "k": k, **({"seed": seed} if relaxed else {})}
    params = {"beam_width": k, "k": k, "draft_beams": max(n, k), "gamma": args.gamma}
    ref = (ref_dec, make_params(ref_dec, ref_params))
    arm = (arm_dec, make_params(arm_dec, {**params, "tree_attention": True, "seed": seed}))
    ref_runs, arm_runs = time_pair(ctx, batches, ref, arm, repeats=1)
    row = summarise(ref_runs, arm_runs, targets, k, relaxed=relaxed)
    row["per_user_accepted_steps"] = [float(res.counters["accepted_steps"]) for _, res in arm_runs]
    flat_targets = [t for batch in targets for t in batch]
    for name, runs in (("reference", ref_runs), ("atspeed", arm_runs)):
        ranked = [ids for _, res in runs for ids in res.item_ids.tolist()]
        row[f"per_user_{name}_recall"] = user_metric_vector(ranked, flat_targets, f"recall@{k}").tolist()
    return row


def row_key(row: dict) -> tuple[str, tuple[int, int, str], int]:
    """(label, (K, N, verification), seed): the key every comparison looks a row up by."""
    return row["objective"], (row["k"], row["draft_beams"], row["verification"]), row["seed"]


def index_rows(rows: list[dict]) -> dict[tuple, dict]:
    return {row_key(r): r for r in rows}


def setting_name(key: tuple[int, int, str]) -> str:
    """(K, N, verification) as the summary names it: k10_n40_strict."""
    return f"k{key[0]}_n{key[1]}_{key[2]}"


def compare(rows: list[dict], objectives: list[str], settings: list[tuple[int, int, str]]) -> dict:
    """Per (K, N, verification) and objective: per-seed AS@K and median; the first AtSpeed objective of
    that verification (AtSpeed-S for strict, AtSpeed-R for relaxed) against the others; relaxed also
    compares Recall@K with the target's sampling beam search (one-sided: is AtSpeed lower?)."""
    by = index_rows(rows)
    seeds = sorted({r["seed"] for r in rows})
    out: dict = {}
    for key in settings:
        prefix = "atspeed_r" if key[2] == "relaxed" else "atspeed_s"
        main = next((o for o in objectives if o.startswith(prefix)), None)
        per_k: dict = {}
        for o in objectives:
            values = [by[(o, key, s)]["accepted_steps"] for s in seeds]
            per_k[o] = {"per_seed": values, "median": float(np.median(values))}
            if key[2] == "strict":
                per_k[o]["identical_share_min"] = min(by[(o, key, s)]["identical_share"] for s in seeds)
            else:
                per_k[o]["recall"] = recall_vs_sampling(by, o, key, seeds)
        for o in [o for o in objectives if main is not None and o != main]:
            per_k[o][f"{main}_vs"] = more_accepted(by, main, o, key, seeds)
        out[setting_name(key)] = per_k
    return out


def more_accepted(by: dict, main: str, other: str, key: tuple, seeds: list[int]) -> dict:
    """One-sided tests of H1: `main` accepts more steps than `other` (over seeds, over users)."""
    a = [by[(main, key, s)]["accepted_steps"] for s in seeds]
    b = [by[(other, key, s)]["accepted_steps"] for s in seeds]
    tests: dict = {}
    if len(seeds) >= 2:  # H1: mean(b - a) < 0
        tests["seeds_paired_t"] = paired_t_test_less(b, a)
    ua = np.concatenate([by[(main, key, s)]["per_user_accepted_steps"] for s in seeds])
    ub = np.concatenate([by[(other, key, s)]["per_user_accepted_steps"] for s in seeds])
    tests["users_sign_flip"] = paired_permutation_test(ua, ub)
    return tests


def recall_vs_sampling(by: dict, objective: str, key: tuple, seeds: list[int]) -> dict:
    """Relaxed AtSpeed's Recall@K against the target's sampling beam search on the same users, per seed,
    and one-sided tests of H1: AtSpeed's recall is lower (over seeds; over (seed, user) pairs)."""
    k = key[0]
    ours = [by[(objective, key, s)][f"atspeed_recall@{k}"] for s in seeds]
    ref = [by[(objective, key, s)][f"reference_recall@{k}"] for s in seeds]
    out: dict = {"atspeed_per_seed": ours, "sampling_per_seed": ref}
    if len(seeds) >= 2:
        out["seeds_paired_t_lower"] = paired_t_test_less(ours, ref)
    ua = np.concatenate([by[(objective, key, s)]["per_user_atspeed_recall"] for s in seeds])
    ub = np.concatenate([by[(objective, key, s)]["per_user_reference_recall"] for s in seeds])
    out["users_sign_flip_lower"] = paired_permutation_test(ub, ua)  # H1: mean(ref - ours) > 0
    return out


def format_row(objective: str, row: dict, info: dict) -> str:
    k = row["k"]
    if "identical_share" in row:
        check = f"identical {row['identical_share']:.0%}"
    else:
        check = f"recall {row[f'atspeed_recall@{k}']:.4f} (sampling {row[f'reference_recall@{k}']:.4f})"
    return (
        f"  {objective:18s} {row['verification']:7s} K={k:<3d} N={row['draft_beams']:<3d} "
        f"AS {row['accepted_steps']:.3f}  target calls {row['target_calls']:.2f}  WS {row['ws']:.2f}x  "
        f"{check}  (trained {info['train_seconds'] or 0:.0f} s, val loss {info['val_loss']:.4f})"
    )


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows, training = [], {}
    settings = sorted(
        {(k, max(n, k), v) for k in args.k for n in args.draft_beams for v in args.verification}, reverse=True
    )
    for seed in args.seeds:
        t0 = time.perf_counter()
        target_dir, drafts = prepare_seed(args, seed)
        training[seed] = drafts
        print(f"seed {seed}: models ready in {time.perf_counter() - t0:.0f} s", flush=True)
        for objective in args.objectives:
            for k, n, verification in settings:
                row = measure(args, target_dir, drafts[objective]["dir"], seed, k, n, verification)
                rows.append(
                    {
                        "objective": objective,
                        "seed": seed,
                        "k": k,
                        "draft_beams": n,
                        "verification": verification,
                        **row,
                    }
                )
                print(format_row(objective, rows[-1], drafts[objective]), flush=True)
    result = {
        "args": vars(args),
        "training": training,
        "rows": rows,
        "summary": compare(rows, args.objectives, settings),
    }
    if args.out:
        atomic_write_text(args.out, json.dumps(result, indent=1, default=str))
    print_summary(result["summary"])
    return result


def print_summary(summary: dict) -> None:
    """Per setting and objective: AS@K per seed, median, and the main objective's one-sided p-values."""
    for key, per_k in summary.items():
        print(key)
        for o, row in per_k.items():
            tests = next((v for name, v in row.items() if name.endswith("_vs")), {})
            p = {name: round(t["p_value"], 4) for name, t in tests.items()}
            if "recall" in row:
                rec = row["recall"]
                p["recall_lower_users"] = round(rec["users_sign_flip_lower"]["p_value"], 4)
            seeds = [round(v, 3) for v in row["per_seed"]]
            print(f"  {o:18s} per seed {seeds}  median {row['median']:.3f}  p {p}")


if __name__ == "__main__":
    run_main(main)
