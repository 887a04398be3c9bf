"""Draft-head objectives for `genrec train --objective nezha|mtp` (NEZHA Algorithm 3, lines 1-12).

Every train target is one example (Algorithm 3 iterates over instances ((q, x), y)): its prompt is
[BOS] + the SID tokens of up to `max_items` preceding items, followed for NEZHA by the placeholders
<SP_1>..<SP_L>. One forward pass gives the head's input states, the head runs with teacher forcing
(transitions fold in the true codes), and the loss is eq. 6: the cross-entropy of the true code
summed over the L levels (averaged over the batch). Backbone and head are optimised together.

Following the paper, this is the ONLY loss: the backbone's own next-token loss is not added (eq. 6
is all Algorithm 3 minimises), so a NEZHA/MTP checkpoint's `lm_head` is untrained and plain beam
search on it is meaningless; compare against a separate next-item model trained from the same
initialisation (same seed), data and epoch budget.

MTP uses the same examples without placeholders: L parallel heads on the last history state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from genrec.workloads.models.inputs import build_prompts
from genrec.workloads.models.nezha_head import (
    HeadConfig,
    append_placeholders,
    build_head,
    head_loss,
    head_states,
)
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec

HEAD_OBJECTIVES = ("nezha", "mtp")


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
    ) -> None:
        self.config = HeadConfig.for_variant(kind, model.config.dim, codec.codebook_sizes, variant)
        self.head = build_head(self.config).to(device)
        self.model, self.codec, self.device, self.autocast = model, codec, device, autocast
        self.item_tokens, self.max_items = item_tokens, max_items
        self.item_codes = torch.as_tensor(np.asarray(item_codes, dtype=np.int64))
        self.examples = head_examples(sequences, max_items)
        self.val_examples = [(list(w[:-1]), int(w[-1])) for w in val_windows]
        # one module holding both, so the trainer's optimiser and clipping see every parameter
        self.trainable = nn.ModuleDict({"model": model, "head": self.head})
        self.placeholders = [codec.placeholder_token(l) for l in range(codec.levels)]

    def lengths(self) -> list[int]:
        return [len(h) for h, _ in self.examples]

    def states(self, histories: list[list[int]]) -> torch.Tensor:
        tokens, mask = build_prompts(histories, self.item_tokens, self.max_items, self.device)
        if self.config.needs_placeholders:
            tokens, mask = append_placeholders(tokens, mask, self.placeholders)
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            hidden = self.model.hidden_states(tokens, mask)
        return head_states(hidden, self.config).float()

    def batch_loss(self, pairs: Sequence[tuple[list[int], int]]) -> torch.Tensor:
        histories = [h for h, _ in pairs]
        targets = torch.as_tensor([t for _, t in pairs], dtype=torch.long)
        codes = self.item_codes[targets].to(self.device)
        return head_loss(self.head, self.states(histories), codes)

    def loss(self, batch_idx: np.ndarray) -> torch.Tensor:
        return self.batch_loss([self.examples[i] for i in batch_idx])

    @torch.no_grad()
    def val_loss(self, batch_size: int) -> float:
        self.trainable.eval()
        total, n = 0.0, 0
        for i in range(0, len(self.val_examples), batch_size):
            chunk = self.val_examples[i : i + batch_size]
            total += self.batch_loss(chunk).item() * len(chunk)
            n += len(chunk)
        self.trainable.train()
        return total / n
