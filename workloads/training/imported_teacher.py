"""An imported checkpoint as the target an AtSpeed draft of ours aligns to (`genrec train --objective
wordkd|tvdkd|seqkd|atspeed_s|atspeed_r --target IMPORTED`).

The draft is one of our models: BOS + SID prompts, level-offset token ids, trained on the target's code
space (its SID table's codebook sizes; the dataset's items must be spellable by the table). The target
keeps its own inputs: the prompt template stored with it, rendered with its own tokenizer for the same
history, and the SID tokens of its table. What the objectives compare is each model's distribution over
the codes of the level being predicted at the same context (history, y_<t):

- the target's is its full-vocabulary log-softmax read at the level's token ids through the table (what
  `beam` scores an imported model with; a gap code, which has no token, gets -inf), or with
  `level_softmax` the softmax over the level's tokens only (what `--param level_softmax=true` decodes);
- it is then written into the draft's vocabulary at the draft's ids of the same codes
  (`on_draft_vocab`), with the mass the target puts on every other token of its vocabulary lumped into
  one token of the draft that is no SID token (PAD). The result is a normalised log-distribution over
  the draft's vocabulary, so the objectives of align_token_level.py / align_sequences.py, which take
  "target logits" and apply log_softmax, read it unchanged: log_softmax of log-probabilities is the
  identity, the level's codes keep the target's exact full-vocabulary probabilities, and the
  renormalisation over V_c (AtSpeed-S/R) gives p'. Only w/o CA (the whole vocabulary) has no meaning
  across two vocabularies, and is refused.

Contexts: the token-level objectives teacher-force each labelled item of a window on its own row
(template(history before it) + its first L - 1 SID tokens), since the template wraps the history in
text and one row cannot predict several items. The sequence objectives reuse the packed prefix tree
(align_context_tree.py) with the template's tokens as each row's head: the contexts are laid out by
codes alone, so the target's tree has the draft tree's contexts in the same slots.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from genrec.workloads.data.dataset import Dataset
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.checkpoint import read_checkpoint_config
from genrec.workloads.models.hf_checkpoint import ImportedInputs, imported_inputs, is_imported
from genrec.workloads.models.inputs import left_pad
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import PAD, SIDCodec, codec_with_gaps_of
from genrec.workloads.sid_table import SIDTokenTable
from genrec.workloads.tokenize.level_scores import level_log_probs
from genrec.workloads.training.align_context_tree import ContextTree, build_context_tree, context_hidden

REST_ID = PAD  # the draft token that carries the target's mass outside the level's codes


def imported_target_table(path: str | os.PathLike) -> SIDTokenTable | None:
    """The SID table of an imported checkpoint folder from its config.json alone (no weights), else None."""
    from pathlib import Path

    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        return None  # load_target names the missing checkpoint
    config = read_checkpoint_config(cfg_path)
    if "imported" not in config:
        return None
    return SIDCodec.from_dict(config["codec"]).table


def draft_codec_for_imported(table: SIDTokenTable, ds: Dataset, target: str | os.PathLike) -> SIDCodec:
    """The codec of a draft of ours for an imported target: level-offset ids over the table's codebook
    sizes, once every item of the dataset is checked to be spellable by the table."""
    table.check_item_codes(ds.item_codes(), where=f"dataset {ds.root} (for --target {target})")
    return SIDCodec(table.codebook_sizes)


def on_draft_vocab(level_lp: Tensor, draft_ids: Tensor, vocab: int) -> Tensor:
    """[M, T] target log-probs of one level's codes -> [M, vocab] a log-distribution over the draft's
    vocabulary: the codes at `draft_ids` ([T], -1 where a code is left out), the rest of the target's
    mass at REST_ID, -inf elsewhere (module doc)."""
    out = level_lp.new_full((level_lp.shape[0], vocab), float("-inf"))
    keep = draft_ids >= 0
    kept = level_lp[:, keep]
    out[:, draft_ids[keep]] = kept
    inside = torch.logsumexp(kept, dim=-1).clamp(max=0.0)
    out[:, REST_ID] = torch.log(-torch.expm1(inside))  # log(1 - mass on the codes); -inf when it is all
    return out


@dataclass
class ImportedTeacher:
    """The imported target of an alignment run: its model, inputs and codec, and the draft's codec."""

    model: GRTransformer
    codec: SIDCodec  # the target's (its SID table)
    inputs: ImportedInputs
    item_codes: np.ndarray  # [N, L] the dataset's items
    max_items: int  # history items per prompt (the draft's window)
    draft_codec: SIDCodec  # the draft's ids, the target's gap codes left out
    draft_vocab: int
    level_softmax: bool = False

    # --- the target's level distributions ---------------------------------------------------------
    def level_log_probs(self, hidden: Tensor, level: int) -> Tensor:
        """[M, D] final hidden states predicting `level` -> [M, T_level] the target's code log-probs."""
        ids = self.codec.level_ids_tensor(level, hidden.device)
        return level_log_probs(hidden, self.model.lm_head.weight, ids, self.level_softmax).float()

    def prompt_ids(self, histories: Sequence[Sequence[int]]) -> list[list[int]]:
        """Each history's template prompt, tokenised by the target's tokenizer."""
        codes = [self.item_codes[np.asarray(h[-self.max_items :], dtype=np.int64)] for h in histories]
        return [list(p) for p in self.inputs.encoder.encode_batch(codes)]

    @torch.no_grad()
    def item_level_log_probs(self, pairs: Sequence[tuple[Sequence[int], int]]) -> list[Tensor]:
        """Per level l, [P, T_l] the target's code log-probs at level l of each (history, item) pair's
        item, teacher-forced on template(history) + the item's first L - 1 SID tokens."""
        levels = self.codec.levels
        item_ids = self.codec.codes_to_tokens(self.item_codes[np.asarray([t for _, t in pairs])])
        prompts = self.prompt_ids([h for h, _ in pairs])
        rows = [p + ids[: levels - 1].tolist() for p, ids in zip(prompts, item_ids)]
        tokens, mask = left_pad(rows, self.inputs.pad_id, self.model.device)
        hidden = self.model.hidden_states(tokens, mask)[:, -levels:]  # position -L + l predicts level l
        return [self.level_log_probs(hidden[:, level], level) for level in range(levels)]

    # --- what the objectives read ------------------------------------------------------------------
    def token_logits(self, windows: Sequence[tuple[Sequence[int], int]], *_draft_batch) -> Tensor:
        """[N, V_draft] at the labelled positions of the windows' next-item batch, in its order
        (window by window, each labelled item's levels in turn); the draft's batch is not read."""
        pairs = [(w[:p], w[p]) for w, n in windows for p in range(len(w) - n, len(w))]
        per_level = self.item_level_log_probs(pairs)
        mapped = [
            on_draft_vocab(lp, self.draft_codec.level_ids_tensor(l, lp.device), self.draft_vocab)
            for l, lp in enumerate(per_level)
        ]
        return torch.stack(mapped, dim=1).reshape(-1, self.draft_vocab)

    @torch.no_grad()
    def context_logits(
        self,
        tree: ContextTree,
        prompts: Sequence[Sequence[int]],
        codes: np.ndarray,
        lengths: np.ndarray,
        autocast: bool = False,
    ) -> Tensor:
        """[B, C, V_draft] at every context of the draft's tree `tree` (same prompts, codes and lengths)."""
        own = build_context_tree(
            prompts, codes, lengths, None, self.codec, self.max_items, self.model.device,
            heads=[np.asarray(p, dtype=np.int64) for p in self.prompt_ids(prompts)], pad=self.inputs.pad_id,
        )  # fmt: skip
        same = own.prefix.shape == tree.prefix.shape and torch.equal(
            own.prefix.to(tree.prefix.device), tree.prefix
        )
        if not same:
            raise AssertionError("the target's context tree must hold the draft tree's contexts in its slots")
        hidden = context_hidden(self.model, own, autocast)  # [B, C, D]
        length = own.length
        out = hidden.new_full((*length.shape, self.draft_vocab), float("-inf"), dtype=torch.float32)
        for level in range(self.codec.levels):
            at = length == level
            if at.any():
                lp = self.level_log_probs(hidden[at], level)
                ids = self.draft_codec.level_ids_tensor(level, lp.device)
                out[at] = on_draft_vocab(lp, ids, self.draft_vocab)
        return out.to(tree.prefix.device)


def load_imported_teacher(
    ckpt, ds: Dataset, draft_codec: SIDCodec, max_items: int, level_softmax: bool, path: str | os.PathLike
) -> ImportedTeacher:
    """The loaded imported checkpoint `ckpt` as the teacher of a draft on `draft_codec` (see module doc)."""
    if not is_imported(ckpt):
        raise ValueError(f"{path}: not an imported checkpoint")
    if draft_codec.codebook_sizes != ckpt.codec.codebook_sizes:
        raise UserInputError(
            f"--target {path} spells codebook sizes {list(ckpt.codec.codebook_sizes)}, the draft "
            f"{list(draft_codec.codebook_sizes)}; a draft needs its target's SID codes"
        )
    model = ckpt.model.eval().requires_grad_(False)
    gapped = codec_with_gaps_of(draft_codec, ckpt.codec.table)  # a gap code is in no beam of the target
    return ImportedTeacher(
        model, ckpt.codec, imported_inputs(ckpt), ds.item_codes(), max_items, gapped, draft_codec.vocab_size,
        level_softmax,
    )  # fmt: skip
