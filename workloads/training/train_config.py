"""The configuration of `genrec train` (training/trainer.py): every knob of the loop, the objectives and
an imported start, with the checks that refuse a bad combination in one line before anything is loaded."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from genrec.workloads.errors import UserInputError
from genrec.workloads.models.model_config import MODEL_SIZES
from genrec.workloads.models.nezha_head import HEAD_VARIANTS

# AtSpeed draft alignment (training/align.py): which objectives read a teacher file, which run the target
ALIGN_OBJECTIVES = ("wordkd", "seqkd", "tvdkd", "atspeed_s", "atspeed_r")
TOKEN_OBJECTIVES = ("wordkd", "tvdkd")
SEQUENCE_OBJECTIVES = ("seqkd", "atspeed_s", "atspeed_r")
TARGET_OBJECTIVES = ("wordkd", "tvdkd", "atspeed_s", "atspeed_r")
OBJECTIVES = ("next_item", "nezha", "mtp", *ALIGN_OBJECTIVES)
HEAD_BATCHING = ("packed", "per_example")  # training/nezha_objective.py


@dataclass
class TrainConfig:
    model_size: str = "tiny"
    max_items: int = 20  # history items per prompt / training window
    epochs: int = 20
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 0.05
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05  # cosine decays to lr * min_lr_ratio
    grad_clip: float = 1.0
    patience: int = 3  # epochs without validation improvement before stopping
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch CPU threads; 0 keeps torch's default
    max_val_examples: int = 5000
    max_steps: int = 0  # stop after this many optimiser steps (0 = no limit); for smoke runs
    # next_item: the backbone's next-token loss; nezha / mtp: a draft head's loss only
    # (training/nezha_objective.py); head_variant picks a NEZHA ablation (models/nezha_head.py)
    objective: str = "next_item"
    head_variant: str = "full"
    # how a head objective batches its targets: packed (the next-item windows, the same optimiser
    # steps as next_item) or per_example (one prompt per target); next_item always uses windows
    head_batching: str = "packed"
    # AtSpeed draft alignment (training/align.py): the target checkpoint, the teacher file (from
    # `genrec atspeed teacher`), the mixing weight of eq. 5 / 9 and the paper's ablations
    target: str = ""
    teacher: str = ""
    alpha: float = 0.5  # L = alpha * L_align + (1 - alpha) * L_rec
    no_dr: bool = False  # AtSpeed-S w/o DR
    no_ca: bool = False  # w/o CA: align over the whole vocabulary (eq. 3)
    top1: bool = False  # w/o top-K: the teacher's top-1 SID only
    all_steps: bool = False  # w/ AD: the target's beam after every level too (Table 5; align_sequences.py)
    level_softmax: bool = False  # an imported target's levels by their own softmax (imported_teacher.py)
    # an imported checkpoint folder (`genrec model import hf`): nezha / mtp train only a head on its
    # frozen backbone; "hf:DIR": next_item fine-tunes a pretrained LM given the data set's SID tokens,
    # all weights or (`train_rows="new-rows"`) the SID rows only (training/imported_init.py)
    init: str = ""
    train_rows: str = "all"
    # with "hf:DIR": the SID pattern ("" = lcrec to add, the tokenizer's preset to find), the compute
    # dtype ("bfloat16" = autocast, fp32 master weights) and the saved dtype ("" = the stored one)
    init_sid_pattern: str = ""
    init_dtype: str = ""
    init_save_dtype: str = ""

    def validate(self) -> None:
        problems = []
        if self.model_size not in MODEL_SIZES:
            problems.append(f"model_size must be one of {sorted(MODEL_SIZES)}, got {self.model_size!r}")
        for name in ("max_items", "epochs", "batch_size", "patience"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr}")
        if not self.weight_decay >= 0:
            problems.append(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.warmup_steps < 0:
            problems.append(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.device not in ("auto", "cpu", "cuda"):
            problems.append(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.objective not in OBJECTIVES:
            problems.append(f"objective must be one of {list(OBJECTIVES)}, got {self.objective!r}")
        if self.head_variant not in HEAD_VARIANTS:
            problems.append(f"head_variant must be one of {sorted(HEAD_VARIANTS)}, got {self.head_variant!r}")
        elif self.head_variant != "full" and self.objective != "nezha":
            problems.append(f"head_variant {self.head_variant!r} needs --objective nezha")
        if self.head_batching not in HEAD_BATCHING:
            problems.append(f"head_batching must be one of {list(HEAD_BATCHING)}, got {self.head_batching!r}")
        problems += self.alignment_problems()
        init_flags = (self.train_rows != "all", self.init_sid_pattern, self.init_dtype, self.init_save_dtype)
        if self.init or any(init_flags):
            from genrec.workloads.training.imported_init import init_problems

            problems += init_problems(self)
        if self.device == "cuda" and not torch.cuda.is_available():
            problems.append("device cuda asked for, but no CUDA device is available; use --device cpu")
        if problems:
            raise UserInputError("; ".join(problems))

    def alignment_problems(self) -> list[str]:
        o, problems = self.objective, []
        if not 0.0 <= self.alpha <= 1.0:
            problems.append(f"alpha must be in [0, 1], got {self.alpha}")
        if o in TARGET_OBJECTIVES and not self.target:
            problems.append(f"--objective {o} needs --target (the checkpoint the draft aligns to)")
        if o in SEQUENCE_OBJECTIVES and not self.teacher:
            problems.append(f"--objective {o} needs --teacher FILE (build it with `genrec atspeed teacher`)")
        if o not in ALIGN_OBJECTIVES and (self.target or self.teacher):
            problems.append(f"--target / --teacher are for the draft objectives {list(ALIGN_OBJECTIVES)}")
        if self.no_dr and o != "atspeed_s":
            problems.append("--no-dr (w/o DR) applies to --objective atspeed_s only")
        if self.no_ca and o not in ("atspeed_s", "atspeed_r"):
            problems.append("--no-ca (w/o CA) applies to --objective atspeed_s or atspeed_r only")
        if self.top1 and o not in SEQUENCE_OBJECTIVES:
            names = " / ".join(SEQUENCE_OBJECTIVES)
            problems.append(f"--top1 (w/o top-K) applies to --objective {names} only")
        if self.level_softmax and o not in TARGET_OBJECTIVES:
            problems.append(f"--level-softmax reads a --target's levels: {list(TARGET_OBJECTIVES)} only")
        if self.all_steps and o not in SEQUENCE_OBJECTIVES:
            names = " / ".join(SEQUENCE_OBJECTIVES)
            problems.append(f"--all-steps (w/ AD) applies to --objective {names} only")
        return problems
