"""`genrec train`: next-item training of the GR transformer on a dataset folder.

`objective="nezha"` or `"mtp"` trains the backbone together with a draft head on the head's loss
instead (training/nezha_objective.py); the loop, schedule, early stopping and checkpoints are shared.
The AtSpeed draft objectives (`wordkd`, `seqkd`, `tvdkd`, `atspeed_s`, `atspeed_r`; training/align.py)
train a draft model on the same windows and steps with alpha * L_align + (1 - alpha) * L_rec; their
validation loss is the next-item one, and the checkpoint's config names the target it was aligned to.
`init` starts from a Hugging Face model instead of random weights (training/imported_init.py): a head
on an imported checkpoint's frozen backbone, or next-item fine-tuning of a pretrained LM (hf:DIR).

AdamW with linear warm-up then cosine decay, gradient clipping, validation loss after every
epoch, early stopping on it, and the best checkpoint kept (written atomically). The loss is on
target SID tokens only (see models/inputs.py): every item of a training window after the first
is predicted from the items before it. bf16 autocast is used on CUDA.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from genrec.workloads.data.dataset import Dataset, load_dataset
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.checkpoint import Checkpoint, save_checkpoint, update_checkpoint_meta
from genrec.workloads.models.inputs import (
    IGNORE,
    build_training_batch,
    item_token_table,
    max_prompt_len,
    training_windows,
)
from genrec.workloads.models.model_config import model_config_for
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.progress import bar_enabled
from genrec.workloads.sid_codec import SIDCodec
from genrec.workloads.training.train_config import ALIGN_OBJECTIVES, TrainConfig


@dataclass
class TrainResult:
    path: Path
    best_val_loss: float
    best_epoch: int
    epochs_run: int
    steps: int
    seconds: float
    history: list[dict] = field(default_factory=list)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Multiplier of the base lr: linear warm-up, then cosine down to min_lr_ratio."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: GRTransformer, cfg: TrainConfig) -> torch.optim.AdamW:
    # decay matrices only; norms and embeddings are left alone (the usual transformer recipe)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or "embed" in n]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98))


def length_bucketed_batches(
    lengths: list[int], batch_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Shuffled batches of similar-length windows (less padding), in shuffled order."""
    order = rng.permutation(len(lengths))
    chunk = batch_size * 50
    batches = []
    for i in range(0, len(order), chunk):
        part = order[i : i + chunk]
        part = part[np.argsort(np.asarray(lengths)[part], kind="stable")]
        batches += [part[j : j + batch_size] for j in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return batches


def validation_windows(ds: Dataset, max_items: int, limit: int, seed: int) -> list[list[int]]:
    """One window per (user, valid target): history = the user's train items, target last."""
    windows = [ex.history[-max_items:] + [t] for ex in ds.eval_examples("valid") for t in ex.targets]
    if not windows:
        raise UserInputError(
            f"{ds.root}: the valid split is empty, so there is no validation loss; rebuild the data"
        )
    if len(windows) > limit:
        idx = np.random.default_rng(seed).choice(len(windows), size=limit, replace=False)
        windows = [windows[i] for i in sorted(idx)]
    return windows


def target_loss(model: GRTransformer, tokens, mask, labels, device, autocast: bool) -> torch.Tensor:
    tokens, mask, labels = tokens.to(device), mask.to(device), labels.to(device)
    sel = labels != IGNORE
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
        hidden = model.hidden_states(tokens, mask)
        # only labelled positions go through the vocabulary-wide projection
        logits = model.lm_head(hidden[sel])
    return F.cross_entropy(logits.float(), labels[sel])


@torch.no_grad()
def validation_loss(model, windows, item_tokens, cfg: TrainConfig, device, autocast) -> float:
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(windows), cfg.batch_size):
        chunk = windows[i : i + cfg.batch_size]
        tok, mask, lab = build_training_batch(chunk, item_tokens, [1] * len(chunk))
        total += target_loss(model, tok, mask, lab, device, autocast).item() * len(chunk)
        n += len(chunk)
    model.train()
    return total / n


@dataclass
class _TrainData:
    """A dataset folder read for training: the item token table, next-item and validation windows."""

    ds: Dataset
    codec: SIDCodec
    item_tokens: np.ndarray  # [num_items, L] token ids
    seqs: list[list[int]]  # each user's train items
    windows: list[tuple[list[int], int]]  # (window, num_targets)
    val_windows: list[list[int]]
    init: Any = None  # training/imported_init.InitModel: the imported checkpoint a head trains on


@dataclass
class _Loop:
    """What one optimiser step needs: the model, the objective (None: next_item; `align`: an AtSpeed
    draft objective), the optimiser and schedule, and the batch order's rng."""

    cfg: TrainConfig
    data: _TrainData
    model: GRTransformer
    objective: Any  # nezha / mtp: a HeadObjective (training/nezha_objective.py); None: next_item
    align: Any  # an AtSpeed draft objective (training/align.py); None otherwise
    trainable: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    rng: np.random.Generator
    lengths: list[int]
    total_steps: int
    device: torch.device
    autocast: bool


def train(
    data_dir: str | os.PathLike, out_dir: str | os.PathLike, cfg: TrainConfig, progress: bool = True
) -> TrainResult:
    cfg.validate()
    seed_everything(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    init = None
    if cfg.init:  # an imported checkpoint, or an HF folder given the data set's SID tokens first
        from genrec.workloads.training.imported_init import finish, start

        cfg, init = start(cfg, data_dir, out_dir, device)
    try:
        return _train(data_dir, out_dir, cfg, progress, device, init)
    finally:
        if init is not None:
            finish(init)


def _train(
    data_dir, out_dir, cfg: TrainConfig, progress: bool, device: torch.device, init: Any
) -> TrainResult:
    autocast = device.type == "cuda"
    data = _training_data(data_dir, cfg, init)
    loop, meta = _setup_loop(data_dir, data, cfg, device, autocast)
    best = (float("inf"), -1)
    history: list[dict] = []
    step, bad_epochs, t0 = 0, 0, time.perf_counter()
    bar = tqdm(
        total=loop.total_steps,
        disable=not bar_enabled(progress),
        desc=f"train {cfg.model_size}",
        unit="step",
        dynamic_ncols=True,
    )
    # progress=False (`genrec train --quiet`, a quiet sweep) also silences the per-epoch lines;
    # progress=True keeps them even where the bar is off (a redirected log still records them)
    log = bar.write if progress else (lambda line: None)
    epoch = 0
    for epoch in range(1, cfg.epochs + 1):
        running, count, step = _run_epoch(loop, epoch, step, bar)
        record, val = _end_of_epoch(loop, epoch, running, count)
        history.append(record | {"val_loss": val, "step": step})
        blind = f" (history-blind {meta['history_blind_val_loss']:.4f})" if loop.objective is not None else ""
        log(f"epoch {epoch}: train loss {running / max(count, 1):.4f}  val loss {val:.4f}{blind}")
        if val < best[0] - 1e-4:
            best, bad_epochs = (val, epoch), 0
            meta.update(best_val_loss=val, best_epoch=epoch, history=history)
            _save_best(out_dir, loop, meta)
        else:
            bad_epochs += 1
            if bad_epochs >= cfg.patience:
                log(f"early stop: no validation improvement for {cfg.patience} epochs")
                break
        if cfg.max_steps and step >= cfg.max_steps:
            break
    bar.close()
    seconds = time.perf_counter() - t0
    # record the full history and wall time in the kept (best) checkpoint's config
    update_checkpoint_meta(
        out_dir, dict(history=history, train_seconds=seconds, epochs_run=epoch, steps=step)
    )
    return TrainResult(Path(out_dir), best[0], best[1], epoch, step, seconds, history)


def _training_data(data_dir: str | os.PathLike, cfg: TrainConfig, init: Any = None) -> _TrainData:
    ds = load_dataset(data_dir)
    from genrec.workloads.training.align import alignment_codec  # (align imports this module)

    codec = alignment_codec(cfg, ds)  # the dataset's, or an imported --target's code space
    if init is not None:  # the imported checkpoint's SID table spells the items (checked here)
        codec = init.codec_for(ds, data_dir)
    item_tokens = item_token_table(codec, ds.item_codes())
    seqs = list(ds.user_sequences(("train",)).values())
    windows = training_windows(seqs, cfg.max_items)
    if not windows:
        raise UserInputError(f"{data_dir}: no user has two or more train interactions; nothing to learn from")
    val_windows = validation_windows(ds, cfg.max_items, cfg.max_val_examples, cfg.seed)
    return _TrainData(ds, codec, item_tokens, seqs, windows, val_windows, init)


def _setup_loop(
    data_dir: str | os.PathLike, data: _TrainData, cfg: TrainConfig, device: torch.device, autocast: bool
) -> tuple[_Loop, dict]:
    """The model, its objective, optimiser, schedule and batch rng (built in this order: the seeded
    RNGs are drawn from in it), and the checkpoint's meta."""
    codec = data.codec
    if data.init is not None:  # the imported backbone (a head objective freezes it)
        model = data.init.ckpt.model
    else:
        model_cfg = model_config_for(
            cfg.model_size, codec.vocab_size, max_prompt_len(codec.levels, cfg.max_items + 1)
        )
        model = GRTransformer(model_cfg).to(device)
        model.train()
    objective, align, align_meta = _build_objective(cfg, model, data, device, autocast)
    trainable = model if objective is None else objective.trainable
    opt = make_optimizer(trainable, cfg)
    rng = np.random.default_rng(cfg.seed)
    lengths = [len(w) for w, _ in data.windows] if objective is None else objective.lengths()
    total_steps = _total_steps(len(lengths), cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, total_steps, cfg))
    meta = _checkpoint_meta(data_dir, data, cfg, trainable, align_meta)
    if objective is not None:
        meta["history_blind_val_loss"] = objective.history_blind_val_loss()
    loop = _Loop(
        cfg, data, model, objective, align, trainable, opt, sched, rng, lengths, total_steps, device, autocast
    )
    return loop, meta


def _build_objective(
    cfg: TrainConfig, model: GRTransformer, data: _TrainData, device: torch.device, autocast: bool
) -> tuple[Any, Any, dict]:
    """(head objective, alignment, alignment meta): both None for next_item."""
    objective = None  # next_item: the code below as it always was
    align = None  # an AtSpeed draft objective: next_item's windows and loop, plus alignment
    align_meta: dict = {}
    if cfg.objective in ALIGN_OBJECTIVES:
        from genrec.workloads.training.align import prepare_alignment

        # after the draft is built, so it starts from the weights a next_item run with this seed has
        align, align_meta = prepare_alignment(
            cfg, model, data.ds, data.codec, data.item_tokens, data.windows, device, autocast
        )
    elif data.init is not None:
        from genrec.workloads.training.imported_init import init_objective

        objective = init_objective(cfg, data, device, autocast)
    elif cfg.objective != "next_item":
        from genrec.workloads.training.nezha_objective import HeadObjective

        # built after the backbone, so the backbone starts from the same weights as a next_item run
        objective = HeadObjective(
            cfg.objective, cfg.head_variant, model, data.codec, data.item_tokens, data.ds.item_codes(),
            data.seqs, data.val_windows, cfg.max_items, device, autocast, cfg.head_batching,
        )  # fmt: skip
    return objective, align, align_meta


def _total_steps(num_examples: int, cfg: TrainConfig) -> int:
    steps_per_epoch = math.ceil(num_examples / cfg.batch_size)
    return (
        steps_per_epoch * cfg.epochs
        if not cfg.max_steps
        else min(cfg.max_steps, steps_per_epoch * cfg.epochs)
    )


def _checkpoint_meta(
    data_dir: str | os.PathLike,
    data: _TrainData,
    cfg: TrainConfig,
    trainable: torch.nn.Module,
    align_meta: dict,
) -> dict:
    init = data.init.meta(data_dir, len(data.item_tokens)) if data.init is not None else {}
    return {
        **init,
        "dataset": str(Path(data_dir).resolve()),
        "dataset_name": data.ds.manifest.name,
        "model_size": cfg.model_size,
        "train": asdict(cfg),
        "objective": cfg.objective,
        "num_parameters": sum(p.numel() for p in trainable.parameters()),
        **align_meta,
    }


def _batch_loss(loop: _Loop, batch_idx: np.ndarray) -> torch.Tensor:
    if loop.align is not None:
        return loop.align.loss(batch_idx)
    if loop.objective is None:
        batch = [loop.data.windows[i] for i in batch_idx]
        tok, mask, lab = build_training_batch(
            [w for w, _ in batch], loop.data.item_tokens, [n for _, n in batch]
        )
        return target_loss(loop.model, tok, mask, lab, loop.device, loop.autocast)
    return loop.objective.loss(batch_idx)


def _run_epoch(loop: _Loop, epoch: int, step: int, bar: tqdm) -> tuple[float, int, int]:
    """One pass over the shuffled batches (or up to max_steps): (summed loss, batches, step)."""
    cfg = loop.cfg
    running, count = 0.0, 0
    for batch_idx in length_bucketed_batches(loop.lengths, cfg.batch_size, loop.rng):
        loss = _batch_loss(loop, batch_idx)
        loop.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(loop.trainable.parameters(), cfg.grad_clip)
        loop.opt.step()
        loop.sched.step()
        step += 1
        running, count = running + loss.item(), count + 1
        bar.update(1)
        if step % 10 == 0:
            bar.set_postfix(
                epoch=epoch, loss=f"{running / count:.3f}", lr=f"{loop.sched.get_last_lr()[0]:.1e}"
            )
        if cfg.max_steps and step >= cfg.max_steps:
            break
    return running, count, step


def _end_of_epoch(loop: _Loop, epoch: int, running: float, count: int) -> tuple[dict, float]:
    """The epoch's history record (without val_loss and step) and its validation loss."""
    record = {"epoch": epoch, "train_loss": running / max(count, 1)}
    if loop.align is not None:  # L_rec and L_align apart, to see what the mixture traded
        record |= loop.align.epoch_parts()
    if loop.objective is None:
        data = loop.data
        val = validation_loss(
            loop.model, data.val_windows, data.item_tokens, loop.cfg, loop.device, loop.autocast
        )
    else:  # per-level parts too: they show which levels a draft head has learned
        val, record["val_level_loss"] = loop.objective.val_losses(loop.cfg.batch_size)
    return record, val


def _save_best(out_dir: str | os.PathLike, loop: _Loop, meta: dict) -> None:
    head = loop.objective.head if loop.objective is not None else None
    if loop.data.init is not None:  # again an imported checkpoint: tokenizer, template, items beside it
        loop.data.init.save(out_dir, head, loop.cfg.max_items, meta, loop.data.ds.item_codes())
        return
    save_checkpoint(out_dir, Checkpoint(loop.model, loop.data.codec, loop.cfg.max_items, meta, head=head))
