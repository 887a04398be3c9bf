"""Draft-head objectives for `genrec train --objective nezha|mtp` (NEZHA Algorithm 3, lines 1-12).

Every train target is one instance ((q, x), y) of Algorithm 3: its prompt is [BOS] + the SID tokens
of the items before it, followed for NEZHA by the placeholders <SP_1>..<SP_L>. A forward pass gives
the head's input states, the head runs with teacher forcing (transitions fold in the true codes),
and the loss is eq. 6: the cross-entropy of the true code summed over the L levels (averaged over
the batch's targets). Backbone and head are optimised together. Two ways to batch the instances
(`TrainConfig.head_batching`):

    packed       (default) the next-item model's training windows, every target of a window in one
                 sequence that shares the history (training/packed_head_batch.py): the same windows,
                 targets and optimiser steps as the beam-search model, and fewer tokens (each
                 history is laid out once per window, not once per target)
    per_example  one prompt per target with up to `max_items` items before it, shuffled across users
                 (about 5x more optimiser steps per epoch than next-item training on Beauty)

Following the paper, this is the ONLY loss: the backbone's own next-token loss is not added (eq. 6
is all Algorithm 3 minimises), so a NEZHA/MTP checkpoint's `lm_head` is untrained and plain beam
search on it is meaningless; compare against a separate next-item model trained from the same
initialisation (same seed), data and epoch budget.

MTP uses the same examples without placeholders: L parallel heads on the last history state.

On an imported checkpoint (`genrec train --objective nezha --init MODEL`, training/imported_init.py) the
backbone is frozen and only the head is trained (`FrozenBackbone`): prompts are the checkpoint's own
template, and the placeholders are ids its vocabulary already embeds (it has no <SP_l> tokens), stored
in the head's config so decoding feeds the same ones. Its examples are per_example (the packed layout is
our BOS + SID prompt).

`history_blind_loss` is the validation loss of a predictor that ignores the history and only
counts the training targets, in the head's own factorisation: p(c_l | c_<l) for a head whose levels
condition on earlier codes (NEZHA), p(c_l) for heads whose levels are independent given the prompt
(MTP, NEZHA-1). A head whose validation loss is not below that figure has learned nothing from the
history. Training records it beside the per-level validation losses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from genrec.workloads.models.inputs import build_prompts, training_windows
from genrec.workloads.models.nezha_head import (
    HeadConfig,
    append_placeholders,
    build_head,
    head_level_losses,
    head_states,
)
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec
from genrec.workloads.training.packed_head_batch import build_packed_head_batch
from genrec.workloads.training.train_config import HEAD_BATCHING

HEAD_OBJECTIVES = ("nezha", "mtp")


@dataclass(frozen=True)
class FrozenBackbone:
    """A head trained on a frozen imported backbone: its prompts (histories -> left-padded tokens and
    mask on the device) and the ids fed as placeholders."""

    prompts: Callable[[list[list[int]]], tuple[torch.Tensor, torch.Tensor]]
    placeholder_ids: tuple[int, ...]


def _radix_keys(codes: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """Mixed-radix integer of each row of codes [N, k] (codes[:, j] < sizes[j])."""
    keys = np.zeros(len(codes), dtype=np.int64)
    for j in range(codes.shape[1]):
        keys = keys * int(sizes[j]) + codes[:, j]
    return keys


def _count_of(table_keys: np.ndarray, table_counts: np.ndarray, queries: np.ndarray) -> np.ndarray:
    pos = np.searchsorted(table_keys, queries).clip(max=max(len(table_keys) - 1, 0))
    hit = table_keys[pos] == queries if len(table_keys) else np.zeros(len(queries), dtype=bool)
    return np.where(hit, table_counts[pos] if len(table_keys) else 0, 0)


def history_blind_loss(
    config: HeadConfig, train_codes: np.ndarray, val_codes: np.ndarray, alpha: float = 0.5
) -> float:
    """Eq. 6's loss on val_codes of a history-free predictor in the head's factorisation.

    The predictor is fit on train_codes by counting, with add-alpha smoothing over each level's T_l
    codes: p(c_l | c_<l) for heads whose levels condition on earlier codes (NEZHA), p(c_l) for heads
    whose levels are independent given the prompt (MTP, NEZHA-1). Returns nats per SID.
    """
    train_codes, val_codes = np.asarray(train_codes, np.int64), np.asarray(val_codes, np.int64)
    sizes, n_levels = config.codebook_sizes, len(config.codebook_sizes)
    independent = config.kind == "mtp" or not config.use_context
    total = 0.0
    for l in range(n_levels):
        lo = l if independent else 0  # the codes a level's prediction may depend on: none, or c_<l
        ctx_train = _radix_keys(train_codes[:, lo:l], sizes[lo:l])
        pair_keys, pair_counts = np.unique(ctx_train * sizes[l] + train_codes[:, l], return_counts=True)
        ctx_keys, ctx_counts = np.unique(ctx_train, return_counts=True)
        ctx_val = _radix_keys(val_codes[:, lo:l], sizes[lo:l])
        n_pair = _count_of(pair_keys, pair_counts, ctx_val * sizes[l] + val_codes[:, l])
        n_ctx = _count_of(ctx_keys, ctx_counts, ctx_val)
        total += float(-np.log((n_pair + alpha) / (n_ctx + alpha * sizes[l])).mean())
    return total


def head_examples(sequences: Sequence[Sequence[int]], max_items: int) -> list[tuple[list[int], int]]:
    """(history, target) for every item after a sequence's first, history = up to max_items before it."""
    out = []
    for seq in sequences:
        seq = list(seq)
        for t in range(1, len(seq)):
            out.append((seq[max(0, t - max_items) : t], seq[t]))
    return out


class HeadObjective:
    """Builds the head, its examples, and the loss for one batch; the trainer drives the loop."""

    def __init__(
        self,
        kind: str,
        variant: str,
        model: GRTransformer,
        codec: SIDCodec,
        item_tokens: np.ndarray,
        item_codes: np.ndarray,
        sequences: Sequence[Sequence[int]],
        val_windows: Sequence[Sequence[int]],
        max_items: int,
        device: torch.device,
        autocast: bool,
        batching: str = "packed",
        frozen: FrozenBackbone | None = None,
    ) -> None:
        if batching not in HEAD_BATCHING:
            raise ValueError(f"head batching must be one of {HEAD_BATCHING}, got {batching!r}")
        if frozen is not None and batching != "per_example":
            raise ValueError("a head on a frozen imported backbone trains per_example (its own prompts)")
        sp = frozen.placeholder_ids if frozen is not None else ()
        self.config = HeadConfig.for_variant(kind, model.config.dim, codec.codebook_sizes, variant, sp)
        self.head = build_head(self.config).to(device)
        self.frozen = frozen
        self.model, self.codec, self.device, self.autocast = model, codec, device, autocast
        self.item_tokens, self.max_items, self.batching = item_tokens, max_items, batching
        self.item_codes = torch.as_tensor(np.asarray(item_codes, dtype=np.int64))
        # per_example: one (history, target) per target; packed: the next-item model's windows
        packed = batching == "packed"
        self.examples = [] if packed else head_examples(sequences, max_items)
        self.windows = training_windows(sequences, max_items) if packed else []
        self.val_examples = [(list(w[:-1]), int(w[-1])) for w in val_windows]
        # one module holding both, so the trainer's optimiser and clipping see every parameter; a frozen
        # backbone stays out of it (no gradient, no optimiser state, eval mode throughout)
        self.trainable = nn.ModuleDict({"model": model, "head": self.head})
        if frozen is not None:
            model.requires_grad_(False).eval()
            self.trainable = nn.ModuleDict({"head": self.head})
        self.placeholders = self.config.placeholders(codec)

    def lengths(self) -> list[int]:
        """One entry per training unit (a window when packed, an example otherwise), for batching."""
        if self.batching == "packed":
            return [len(w) for w, _ in self.windows]
        return [len(h) for h, _ in self.examples]

    def states(self, histories: list[list[int]]) -> torch.Tensor:
        if self.frozen is not None:
            tokens, mask = self.frozen.prompts(histories)
        else:
            tokens, mask = build_prompts(histories, self.item_tokens, self.max_items, self.device)
        if self.config.needs_placeholders:
            tokens, mask = append_placeholders(tokens, mask, self.placeholders)
        autocast = torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.autocast)
        with autocast, torch.set_grad_enabled(torch.is_grad_enabled() and self.frozen is None):
            hidden = self.model.hidden_states(tokens, mask)
        return head_states(hidden, self.config).float()

    def level_losses(self, pairs: Sequence[tuple[list[int], int]]) -> torch.Tensor:
        histories = [h for h, _ in pairs]
        targets = torch.as_tensor([t for _, t in pairs], dtype=torch.long)
        codes = self.item_codes[targets].to(self.device)
        return head_level_losses(self.head, self.states(histories), codes)

    def packed_level_losses(self, windows: Sequence[tuple[Sequence[int], int]]) -> torch.Tensor:
        """[L] per-level losses over every target of the given training windows, packed."""
        sp = self.placeholders if self.config.needs_placeholders else None
        batch = build_packed_head_batch(windows, self.item_tokens, sp, self.device)
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            hidden = self.model.hidden_states(
                batch.tokens, positions=batch.positions, attn_mask=batch.attn_mask
            )
        codes = self.item_codes[batch.targets].to(self.device)
        return head_level_losses(self.head, batch.head_states(hidden).float(), codes)

    def loss(self, batch_idx: np.ndarray) -> torch.Tensor:
        if self.batching == "packed":
            return self.packed_level_losses([self.windows[i] for i in batch_idx]).sum()
        return self.level_losses([self.examples[i] for i in batch_idx]).sum()

    @torch.no_grad()
    def val_losses(self, batch_size: int) -> tuple[float, list[float]]:
        """(validation loss, its per-level parts), averaged over the validation examples."""
        self.trainable.eval()
        total, n = torch.zeros(self.codec.levels), 0
        for i in range(0, len(self.val_examples), batch_size):
            chunk = self.val_examples[i : i + batch_size]
            total += self.level_losses(chunk).float().cpu() * len(chunk)
            n += len(chunk)
        self.trainable.train()
        levels = (total / n).tolist()
        return float(sum(levels)), levels

    def history_blind_val_loss(self) -> float:
        # both batchings train on every target after a sequence's first, once per epoch
        targets = [t for _, t in self.examples] + [t for w, n in self.windows for t in w[len(w) - n :]]
        train = self.item_codes[targets].numpy()
        val = self.item_codes[[t for _, t in self.val_examples]].numpy()
        return history_blind_loss(self.config, train, val)
