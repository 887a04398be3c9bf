"""Draft alignment objectives for AtSpeed (`genrec train --objective wordkd|seqkd|tvdkd|atspeed_s|atspeed_r`).

A draft is a smaller GRTransformer on the target's SID vocabulary and codec, trained on the same
next-item windows as `next_item` (SFT) with an alignment loss mixed in (AtSpeed eq. 5 and 9):

    L = alpha * L_align + (1 - alpha) * L_rec

L_rec is the next-item loss exactly as `next_item` computes it (the cross-entropy of the windows'
target SID tokens, eq. 37 averaged per token), so alpha = 0 is SFT exactly (the alignment term is
not even computed) and alpha = 1 is the alignment loss alone. `mix_losses` is that formula.

Notation: x a prompt, y = (y_1..y_L) a SID, c_<t = (x, y_<t), q the draft, p the target. A model's
probability of a code v at level t is its full-vocabulary softmax at that position read at v's token,
which is what beam search scores (decoding/scorers.level_log_probs); sequence log-probabilities are
sums of those, as the teacher file stores them.

The objectives live beside this module: align_token_level.py (WordKD, TVDKD), align_sequence_level.py
(SeqKD, AtSpeed-S, AtSpeed-R per level, and why AtSpeed-S is read as it is), align_sequences.py (the
teacher's sequences and the loss over them) and align_context_tree.py (each distinct context scored
once).

Ablations (flags): w/o DR drops DR_t (AtSpeed-S); w/o CA replaces V_c by the whole vocabulary with
the plain softmaxes, eq. 3 (AtSpeed-S and -R); w/o top-K aligns on the teacher's top-1 SID only
(any sequence objective; V_c keeps size K and y_K stays the K-th SID). `AlignFlags.dr_mode="literal"`
(AtSpeed-S, Python API only) is eq. 4 as printed, DR_t = sum_{V_c} q' log(q' / p(y_{K,t}|y_{K,<t})),
kept to show the collapse (align_sequence_level.py); the code before that re-check was that term
summed over y in Y, which Adam sees as the literal mode at alpha' = K alpha / (K alpha + 1 - alpha).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from genrec.workloads.data.dataset import Dataset
from genrec.workloads.decoding.base import ItemIndex
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.checkpoint import load_checkpoint
from genrec.workloads.models.inputs import build_training_batch, max_prompt_len
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec
from genrec.workloads.training.align_context_tree import build_context_tree, context_logits
from genrec.workloads.training.align_sequence_level import (
    DR_MODES,
    alignment_support,
)
from genrec.workloads.training.align_sequences import (
    AlignSequences,
    all_step_sequences,
    context_tree_loss,
    context_valid_mask,
    final_sequences,
    sequence_tokens,
)
from genrec.workloads.training.align_token_level import labelled_logits, token_levels, tvdkd_loss, wordkd_loss
from genrec.workloads.training.imported_teacher import (
    ImportedTeacher,
    draft_codec_for_imported,
    imported_target_table,
    load_imported_teacher,
)
from genrec.workloads.training.teacher import TeacherData, check_teacher_matches, load_teacher
from genrec.workloads.training.train_config import (
    ALIGN_OBJECTIVES,
    SEQUENCE_OBJECTIVES,
    TARGET_OBJECTIVES,
    TOKEN_OBJECTIVES,
    TrainConfig,
)
from genrec.workloads.training.trainer import target_loss

__all__ = [
    "AlignFlags",
    "AlignObjective",
    "alignment_codec",
    "load_alignment_target",
    "load_target",
    "mix_losses",
    "prepare_alignment",
]


@dataclass(frozen=True)
class AlignFlags:
    """The paper's ablations (section 4.3); the defaults are the full methods."""

    density_reg: bool = True  # False: AtSpeed-S w/o DR
    constrained: bool = True  # False: w/o CA (whole vocabulary, eq. 3)
    top1: bool = False  # True: w/o top-K (the teacher's top-1 SID only)
    dr_mode: str = "weighted"  # "literal": eq. 4's density term as printed (collapses; an ablation)
    all_steps: bool = False  # w/ AD: the target's beam after every level too (align_sequences.py)

    def __post_init__(self) -> None:
        if self.dr_mode not in DR_MODES:
            raise ValueError(f"dr_mode must be one of {DR_MODES}, got {self.dr_mode!r}")


# --- the mixture --------------------------------------------------------------------------------
def mix_losses(rec: Tensor | None, align: Tensor | None, alpha: float) -> Tensor:
    """Eq. 5 / 9: alpha * L_align + (1 - alpha) * L_rec. The end points return one term untouched,
    so alpha = 0 is SFT to the bit and alpha = 1 ignores L_rec (which may then be None)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if alpha == 0.0:
        assert rec is not None
        return rec
    if alpha == 1.0:
        assert align is not None
        return align
    assert rec is not None and align is not None
    return alpha * align + (1.0 - alpha) * rec


# --- the trainer's side -------------------------------------------------------------------------
class AlignObjective:
    """One batch's mixed loss for a draft; the trainer drives the loop (windows, steps, validation)."""

    def __init__(
        self,
        kind: str,
        alpha: float,
        flags: AlignFlags,
        model: GRTransformer,
        target: GRTransformer | OwnTarget | ImportedTeacher | None,
        teacher: TeacherData | None,
        codec: SIDCodec,
        item_tokens: np.ndarray,
        item_codes: np.ndarray,
        windows: Sequence[tuple[Sequence[int], int]],
        max_items: int,
        device: torch.device,
        autocast: bool,
    ) -> None:
        if kind not in ALIGN_OBJECTIVES:
            raise ValueError(f"objective must be one of {ALIGN_OBJECTIVES}, got {kind!r}")
        if kind in TARGET_OBJECTIVES and target is None:
            raise ValueError(f"{kind} needs the target model")
        if kind in SEQUENCE_OBJECTIVES and teacher is None:
            raise ValueError(f"{kind} needs teacher data")
        self.kind, self.alpha, self.flags = kind, alpha, flags
        if isinstance(target, GRTransformer):  # one of ours, on the draft's own batches
            target = OwnTarget(target)
        self.model, self.target, self.teacher = model, target, teacher
        self.codec, self.item_tokens, self.item_codes, self.windows = codec, item_tokens, item_codes, windows
        self.max_items, self.device, self.autocast = max_items, device, autocast
        self.prefixes = ItemIndex(codec, item_codes, device).prefix_sets() if teacher is not None else None
        self.parts: dict[str, list[float]] = {"rec": [], "align": []}

    def lengths(self) -> list[int]:
        return [len(w) for w, _ in self.windows]

    def loss(self, batch_idx: np.ndarray) -> Tensor:
        windows = [self.windows[i] for i in batch_idx]
        tok, mask, lab = build_training_batch(
            [w for w, _ in windows], self.item_tokens, [n for _, n in windows]
        )
        if self.alpha == 0.0:  # SFT, computed exactly as next_item computes it
            rec = target_loss(self.model, tok, mask, lab, self.device, self.autocast)
            self.parts["rec"].append(rec.item())
            return rec
        tok, mask, lab = tok.to(self.device), mask.to(self.device), lab.to(self.device)
        rec = None
        if self.kind in TOKEN_OBJECTIVES:
            draft, labels = labelled_logits(self.model, tok, mask, lab, self.autocast)
            with torch.no_grad():
                target = self.target.token_logits(windows, tok, mask, lab, self.autocast)
            rec = F.cross_entropy(draft, labels)
            fn = wordkd_loss if self.kind == "wordkd" else tvdkd_loss
            align = fn(draft, target, token_levels(labels, self.codec), self.codec)
        else:
            if self.alpha < 1.0:
                rec = target_loss(self.model, tok, mask, lab, self.device, self.autocast)
            align = self.sequence_loss(batch_idx)
        if rec is not None:
            self.parts["rec"].append(rec.item())
        self.parts["align"].append(align.item())
        return mix_losses(rec, align, self.alpha)

    def sequence_loss(self, batch_idx: np.ndarray) -> Tensor:
        """The sequence-level alignment loss of the teacher rows `batch_idx` (= the windows' indices) on
        their final SIDs (and step beams with --all-steps): every distinct context scored once, in one
        packed tree forward per model (align_sequences.py, align_context_tree.py)."""
        assert self.teacher is not None and self.prefixes is not None
        k = self.teacher.k
        seqs = self.sequences(batch_idx)
        prompts = [self.teacher.prompts[i] for i in batch_idx]
        tree = build_context_tree(
            prompts, seqs.codes, seqs.lengths, self.item_tokens, self.codec, self.max_items, self.device
        )
        tokens = sequence_tokens(seqs.codes, self.codec, self.device)
        draft = context_logits(self.model, tree, self.autocast)
        if self.kind == "seqkd":
            return context_tree_loss("seqkd", draft, None, tree, seqs, tokens, None)
        with torch.no_grad():
            target = self.target.context_logits(tree, prompts, seqs.codes, seqs.lengths, self.autocast)
        allowed = context_valid_mask(tree, self.codec, self.prefixes) if self.flags.constrained else None
        support = alignment_support(draft, allowed, k)
        return context_tree_loss(
            self.kind, draft, target, tree, seqs, tokens, support, self.flags.density_reg, self.flags.dr_mode
        )

    def sequences(self, batch_idx: np.ndarray) -> AlignSequences:
        """The rows' sequences: the first `n_align` final SIDs (1 for w/o top-K) count, and with
        --all-steps the step beams too."""
        assert self.teacher is not None
        k = self.teacher.k
        n_align = 1 if self.flags.top1 else k
        codes = self.teacher.codes[batch_idx]
        if self.flags.all_steps:
            assert self.teacher.step_codes is not None
            return all_step_sequences(codes, self.teacher.step_codes[batch_idx], n_align, self.device)
        # AtSpeed-S needs the K-th SID (y_K) even when it aligns on the top-1 only
        n_seq = k if self.kind == "atspeed_s" else n_align
        return final_sequences(codes[:, :n_seq], n_align, self.device)

    def epoch_parts(self) -> dict[str, float]:
        """Mean L_rec and L_align over the steps since the last call (for the training history)."""
        out = {f"train_{name}_loss": float(np.mean(v)) for name, v in self.parts.items() if v}
        self.parts = {"rec": [], "align": []}
        return out


@dataclass(frozen=True)
class OwnTarget:
    """One of our models as the target: it reads the draft's own batches (same codec and prompts)."""

    model: GRTransformer

    def token_logits(self, windows, tok: Tensor, mask: Tensor, lab: Tensor, autocast: bool) -> Tensor:
        return labelled_logits(self.model, tok, mask, lab, autocast)[0]

    def context_logits(self, tree, prompts, codes, lengths, autocast: bool) -> Tensor:
        return context_logits(self.model, tree, autocast)


def alignment_codec(cfg: TrainConfig, ds: Dataset) -> SIDCodec:
    """The codec a draft trains on: the dataset's, or for an imported --target its SID table's code
    space in our level-offset ids (imported_teacher.py); read from config.json, before the draft is built."""
    table = imported_target_table(cfg.target) if cfg.objective in ALIGN_OBJECTIVES and cfg.target else None
    return ds.codec if table is None else draft_codec_for_imported(table, ds, cfg.target)


def load_target(path: str, codec: SIDCodec, max_items: int, device: torch.device) -> GRTransformer:
    """One of our target models, frozen, checked to share the codec and to fit the draft's windows."""
    ckpt = load_checkpoint(path, device)
    if ckpt.codec != codec:
        raise UserInputError(
            f"target {path} uses codebook sizes {list(ckpt.codec.codebook_sizes)}, the dataset "
            f"{list(codec.codebook_sizes)}; a draft needs its target's SID vocabulary and codec"
        )
    if ckpt.model.config.max_seq_len < max_prompt_len(codec.levels, max_items + 1):
        raise UserInputError(
            f"target {path} takes prompts of at most {ckpt.max_items} items, the draft trains on "
            f"{max_items}; pass --max-items {ckpt.max_items} or less"
        )
    return ckpt.model.eval().requires_grad_(False)


def load_alignment_target(
    cfg: TrainConfig, ds: Dataset, codec: SIDCodec, device: torch.device
) -> tuple[OwnTarget | ImportedTeacher, SIDCodec]:
    """The --target of `cfg` as the objective reads it, and the codec it reads the draft with (for an
    imported target: the draft's ids with the table's gap codes left out)."""
    path = cfg.target
    if imported_target_table(path) is None:
        if cfg.level_softmax:
            raise UserInputError(
                f"--level-softmax scores an imported target's levels; --target {path} is one of ours: drop it"
            )
        return OwnTarget(load_target(path, codec, cfg.max_items, device)), codec
    if cfg.no_ca:
        raise UserInputError(
            f"--no-ca aligns over the whole vocabulary, which the imported --target {path} does not "
            "share with the draft; drop --no-ca (w/o CA needs a target of ours)"
        )
    ckpt = load_checkpoint(path, device)
    teacher = load_imported_teacher(ckpt, ds, codec, cfg.max_items, cfg.level_softmax, path)
    return teacher, teacher.draft_codec


def prepare_alignment(
    cfg: TrainConfig,
    model: GRTransformer,
    ds: Dataset,
    codec: SIDCodec,
    item_tokens: np.ndarray,
    windows: Sequence[tuple[Sequence[int], int]],
    device: torch.device,
    autocast: bool,
) -> tuple[AlignObjective, dict]:
    """Load and check the target and teacher file of `cfg` (`codec`: the draft's, alignment_codec); the
    objective and the checkpoint meta (`target`, `teacher`, `alpha` and the ablation flags)."""
    target, objective_codec = load_alignment_target(cfg, ds, codec, device) if cfg.target else (None, codec)
    teacher, target_path = None, cfg.target
    if cfg.objective in SEQUENCE_OBJECTIVES:
        teacher = load_teacher(cfg.teacher)
        check_teacher_matches(teacher, list(windows), codec, ds.item_codes(), cfg.max_items, cfg.target)
        target_path = target_path or teacher.manifest.get("target", "")  # SeqKD may name it via the file
    if cfg.all_steps and teacher is not None and teacher.step_codes is None:
        raise UserInputError(
            f"{cfg.teacher}: built without the target's beam after every level, which --all-steps "
            "aligns on; rebuild it with `genrec atspeed teacher --all-steps`"
        )
    flags = AlignFlags(
        density_reg=not cfg.no_dr, constrained=not cfg.no_ca, top1=cfg.top1, all_steps=cfg.all_steps
    )
    objective = AlignObjective(
        cfg.objective, cfg.alpha, flags, model, target, teacher, objective_codec, item_tokens,
        ds.item_codes(), windows, cfg.max_items, device, autocast,
    )  # fmt: skip
    meta = {
        "target": str(Path(target_path).resolve()) if target_path else "",
        "alpha": cfg.alpha,
        "align_flags": asdict(flags),
        "teacher": str(Path(cfg.teacher).resolve()) if teacher is not None else "",
    }
    if isinstance(target, ImportedTeacher):  # what the draft was aligned to: the table's code space
        meta["target_sid_table"] = target.codec.table.to_dict()
        meta["teacher_level_softmax"] = cfg.level_softmax
    if teacher is not None:  # the kind is recorded, never branched on: beam, sample and mixture
        # files all hold K catalogue SIDs best first under the target, which is all the objectives read
        meta["teacher_k"], meta["teacher_kind"] = teacher.k, teacher.kind
    return objective, meta
