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

Token-level baselines, on the training windows' target SID tokens (teacher forcing on the data; the
target runs on the same batch in the same step, without gradients, so nothing is cached):
    WordKD   forward KL, sum_{v in level t} p(v|c) log(p(v|c) / q(v|c))           (Hinton; Sanh)
    TVDKD    total variation, 1/2 sum_{v in level t} |p(v|c) - q(v|c)|             (Wen et al.)
both restricted to the codes of the level being predicted and averaged over the positions.

Sequence-level objectives, on the teacher's top-K SIDs Y of each example (teacher.py: one row per
training window, the window's prompt), the draft and target run with teacher forcing on prompt + SID
in one packed forward per batch (prompt laid out once, see `build_sequence_batch`):
    SeqKD      the next-item cross-entropy of the teacher SIDs (Kim & Rush): mean over (x, y in Y, t)
               of -log q(y_t | c_<t), the L_rec of eq. 37 on the teacher data
    AtSpeed-S  eq. 4, read as below: mean over (x, y in Y) of 1/L sum_t [RKLD_t - DR_t] with
                 RKLD_t = sum_{v in V_c} q'(v) log(q'(v) / p'(v))            = KL(q' || p')
                 DR_t   = w_t * sum_{v in V_c} q'(v) log q'(v)                = -w_t * H(q')
                 w_t    = p(y_{K,t} | y_{K,<t})
               y_K the teacher's K-th (lowest-ranked) SID and w_t the target's raw conditional of its
               t-th code (the paper's p(y_K), appendix A.2.2), a constant of the target (no gradient)
    AtSpeed-R  eq. 8: mean over (x, y in Y) of 1/L sum_t TVD_t, TVD_t = 1/2 sum_{v in V_c} |p'(v) - q'(v)|
V_c = ConstrainedTopK(q) at c_<t: the K codes of level t with the highest draft probability among
the codes that extend y_<t to a valid item-SID prefix (fewer where fewer are valid), K the teacher
file's K. p' and q' are p and q renormalised over V_c ("normalized truncated ... over top-K valid
tokens", section 3.2, which says the same holds for AtSpeed-S).

Why AtSpeed-S is not eq. 4 as printed (docs/results.md, "AtSpeed-S objective re-check"). Printed, the
density term is sum_{V_c} q'(v) log(q'(v) / p(y_K)) = -H(q') - log p(y_K): with q' normalised its
p(y_K) part is a constant, so RKLD - DR = -sum_{V_c} q'(v) log p'(v) + const, which is linear in q'
(it is the expected target log-likelihood of eq. 2 that the appendix starts from). Its minimum is q'
one-hot on the target's best code: it rewards collapse, and at q' = p' it still pushes away from the
target. We keep the paper's terms (reverse KL on V_c; a negative-entropy density term scaled by
p(y_K)) but let p(y_K) weight the entropy instead of sitting inside the log (as the authors' released
code does, with its own choice of the K-th probability). Then the per-level loss is
KL(q' || p') + w H(q') = (1 - w) sum q' log q' - sum q' log p', bounded below by 0 and strictly convex
in q' for w < 1, with its minimum at q' proportional to p'^(1 / (1 - w)): the target's ranking over
V_c, sharpened by the density term, never one-hot. The sum over y in Y of eq. 4 is taken as a mean:
it estimates an expectation over sequences (eq. 33-34), the released code averages, and a sum would
multiply alpha's effective weight by K (alpha 0.5 would act like 0.91, where the paper reports that
alpha 0.7 already hurts AtSpeed-S).

Ablations (flags): w/o DR drops DR_t (AtSpeed-S); w/o CA replaces V_c by the whole vocabulary with
the plain softmaxes, eq. 3 (AtSpeed-S and -R); w/o top-K aligns on the teacher's top-1 SID only
(any sequence objective; V_c keeps size K and y_K stays the K-th SID). `AlignFlags.dr_mode="literal"`
(AtSpeed-S, Python API only) is eq. 4 as printed, DR_t = sum_{V_c} q' log(q' / p(y_{K,t}|y_{K,<t})),
kept to show the collapse; the code before this re-check was that term summed over y in Y, which
Adam sees as the literal mode at alpha' = K alpha / (K alpha + 1 - alpha).
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
from genrec.workloads.decoding.prefix_keys import PrefixKeySets
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.checkpoint import load_checkpoint
from genrec.workloads.models.inputs import IGNORE, build_training_batch, max_prompt_len
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import BOS, PAD, SIDCodec
from genrec.workloads.training.teacher import TeacherData, check_teacher_matches, load_teacher
from genrec.workloads.training.trainer import (
    ALIGN_OBJECTIVES,
    SEQUENCE_OBJECTIVES,
    TARGET_OBJECTIVES,
    TOKEN_OBJECTIVES,
    TrainConfig,
    target_loss,
)

NEG_INF = float("-inf")
DR_MODES = ("weighted", "literal")  # AtSpeed-S's density term; see the module doc
# bumped whenever atspeed_s_loss changes meaning, so drafts cached under another reading are not reused
ATSPEED_S_READING = "weighted-dr-mean-over-sids-v2"


@dataclass(frozen=True)
class AlignFlags:
    """The paper's ablations (section 4.3); the defaults are the full methods."""

    density_reg: bool = True  # False: AtSpeed-S w/o DR
    constrained: bool = True  # False: w/o CA (whole vocabulary, eq. 3)
    top1: bool = False  # True: w/o top-K (the teacher's top-1 SID only)
    dr_mode: str = "weighted"  # "literal": eq. 4's density term as printed (collapses; an ablation)

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


# --- token-level baselines ------------------------------------------------------------------------
def token_levels(tokens: Tensor, codec: SIDCodec) -> Tensor:
    """The SID level (0-based) of each token id, -1 for tokens of no level (special tokens)."""
    levels = torch.full_like(tokens, -1)
    for level in range(codec.levels):
        lo, hi = codec.level_range(level)
        levels = torch.where((tokens >= lo) & (tokens < hi), level, levels)
    return levels


def _level_pairs(draft_logits: Tensor, target_logits: Tensor, levels: Tensor, codec: SIDCodec):
    """Per level present: (draft, target) full-vocab log-softmax at that level's positions, restricted
    to the level's code range (not renormalised: the scores beam search uses)."""
    if not bool((levels >= 0).all()):
        raise ValueError("every position must predict a SID code (levels >= 0)")
    for level in range(codec.levels):
        sel = levels == level
        if sel.any():
            lo, hi = codec.level_range(level)
            yield tuple(
                torch.log_softmax(x[sel].float(), dim=-1)[:, lo:hi] for x in (draft_logits, target_logits)
            )


def wordkd_loss(draft_logits: Tensor, target_logits: Tensor, levels: Tensor, codec: SIDCodec) -> Tensor:
    """WordKD: mean over positions of sum_{v in level} p(v) log(p(v) / q(v)) (forward KL, target first).

    draft_logits, target_logits [N, V] at N positions predicting a code of `levels` [N]; p and q are
    the full-vocabulary softmaxes read on the predicted level's codes (as beam search scores them).
    """
    total = draft_logits.new_zeros((), dtype=torch.float32)
    for lq, lp in _level_pairs(draft_logits, target_logits, levels, codec):
        total = total + (lp.exp() * (lp - lq)).sum()
    return total / len(levels)


def tvdkd_loss(draft_logits: Tensor, target_logits: Tensor, levels: Tensor, codec: SIDCodec) -> Tensor:
    """TVDKD: mean over positions of 1/2 sum_{v in level} |p(v) - q(v)| (total variation distance).

    Same inputs and per-level restriction as `wordkd_loss`.
    """
    total = draft_logits.new_zeros((), dtype=torch.float32)
    for lq, lp in _level_pairs(draft_logits, target_logits, levels, codec):
        total = total + 0.5 * (lp.exp() - lq.exp()).abs().sum()
    return total / len(levels)


# --- sequence-level objectives ---------------------------------------------------------------------
def seqkd_loss(draft_logits: Tensor, sid_tokens: Tensor) -> Tensor:
    """SeqKD: mean over (example, teacher SID, level) of -log q(y_t | c_<t), full-vocabulary softmax.

    draft_logits [B, K, L, V] predict sid_tokens [B, K, L] (teacher forcing); the next-item loss of
    eq. 37 with the teacher's SIDs as targets.
    """
    v = draft_logits.shape[-1]
    return F.cross_entropy(draft_logits.float().reshape(-1, v), sid_tokens.reshape(-1))


def valid_token_mask(codes: Tensor, codec: SIDCodec, prefixes: PrefixKeySets) -> Tensor:
    """[B, K, L, V] bool: at level t of SID codes[b, k], the tokens of level t whose code extends
    codes[b, k, :t] to a valid item-SID prefix (the constrained vocabulary of that step)."""
    b, k, levels = codes.shape
    out = torch.zeros(b, k, levels, codec.vocab_size, dtype=torch.bool, device=codes.device)
    parent = torch.zeros(b, k, dtype=torch.long, device=codes.device)  # mixed-radix key of codes[:t]
    for t in range(levels):
        lo, hi = codec.level_range(t)
        out[:, :, t, lo:hi] = prefixes.valid_children(t, parent)
        parent = parent * codec.codebook_sizes[t] + codes[:, :, t]
    return out


def alignment_support(draft_logits: Tensor, allowed: Tensor | None, k: int) -> Tensor:
    """V_c as a [..., V] mask: the k tokens with the highest draft probability among `allowed`
    (ConstrainedTopK(q); fewer where fewer are allowed), or every token when `allowed` is None (w/o CA).
    Only a selection: no gradient flows through it."""
    if allowed is None:
        return torch.ones_like(draft_logits, dtype=torch.bool)
    masked = draft_logits.detach().float().masked_fill(~allowed, NEG_INF)
    top = masked.topk(min(k, masked.shape[-1]), dim=-1).indices
    chosen = torch.zeros_like(allowed).scatter_(-1, top, True)
    return chosen & allowed


def _support_log_probs(logits: Tensor, support: Tensor) -> tuple[Tensor, Tensor]:
    """(log of the softmax renormalised over the support, -inf outside; the same with 0 outside).

    The zero-filled copy keeps 0 * (-inf) out of the products, so no NaN reaches the gradients."""
    lp = torch.log_softmax(logits.float().masked_fill(~support, NEG_INF), dim=-1)
    return lp, lp.masked_fill(~support, 0.0)


def density_log_weight(target_logits: Tensor, sid_tokens: Tensor) -> Tensor:
    """[B, L] log w_t = log p(y_{K,t} | y_{K,<t}): the target's full-vocabulary conditional of the t-th
    token of the K-th (last) teacher SID, the paper's p(y_K) (appendix A.2.2). A constant of the target;
    kept as a log so the literal mode's log w cannot underflow to -inf."""
    k = target_logits.shape[1]
    full = torch.log_softmax(target_logits[:, k - 1].detach().float(), dim=-1)  # [B, L, V]
    return full.gather(-1, sid_tokens[:, k - 1, :, None]).squeeze(-1)


def reverse_kl_on_support(lq: Tensor, lq0: Tensor, lp0: Tensor) -> Tensor:
    """[...] KL(q' || p') = sum_{V_c} q' log(q' / p'); >= 0, and 0 exactly when q' = p' on V_c.
    Arguments as `_support_log_probs` returns them (lq: -inf outside V_c; lq0, lp0: 0 there)."""
    return (lq.exp() * (lq0 - lp0)).sum(-1)


def atspeed_s_level_loss(
    lq: Tensor, lq0: Tensor, lp0: Tensor, log_w: Tensor, density_reg: bool = True, dr_mode: str = "weighted"
) -> Tensor:
    """[...] per-level AtSpeed-S loss RKLD_t - DR_t from the support log-probabilities (as
    `_support_log_probs` returns them) and the log density weight log w_t (broadcast to lq.shape[:-1]).

    weighted: KL(q'||p') + w H(q'), minimised at q' ~ p'^(1/(1-w)) (sharpened target, never one-hot).
    literal:  KL(q'||p') + H(q') + log w = -sum q' log p' + log w, linear in q' (minimised by collapse).
    """
    rkld = reverse_kl_on_support(lq, lq0, lp0)
    if not density_reg:
        return rkld
    neg_entropy = (lq.exp() * lq0).sum(-1)  # sum_{V_c} q' log q' = -H(q')
    if dr_mode == "weighted":
        return rkld - log_w.exp() * neg_entropy
    if dr_mode == "literal":  # sum q' log(q' / w) = -H(q') - log w  (sum q' = 1)
        return rkld - (neg_entropy - log_w)
    raise ValueError(f"dr_mode must be one of {DR_MODES}, got {dr_mode!r}")


def atspeed_s_loss(
    draft_logits: Tensor,
    target_logits: Tensor,
    sid_tokens: Tensor,
    support: Tensor,
    n_align: int | None = None,
    density_reg: bool = True,
    dr_mode: str = "weighted",
) -> Tensor:
    """AtSpeed-S alignment loss, eq. 4 as read in the module doc (derivation: appendix A.2.2):

        mean over (x, y in Y) of 1/L sum_t [ KL(q'(.|c_<t) || p'(.|c_<t)) + w_t H(q'(.|c_<t)) ]
        w_t = p(y_{K,t} | y_{K,<t})

    draft_logits, target_logits [B, K, L, V] at c_<t of the teacher SIDs sid_tokens [B, K, L] (best
    first; the K-th is y_K). support [B, K, L, V] is V_c (`alignment_support`); q', p' are the two
    softmaxes renormalised over it. The first `n_align` SIDs (default K; 1 for w/o top-K) form Y;
    `density_reg` False drops the entropy term (w/o DR); `dr_mode="literal"` uses eq. 4's density term
    as printed (see `atspeed_s_level_loss`).
    """
    k = draft_logits.shape[1]
    n_align = k if n_align is None else n_align
    lq, lq0 = _support_log_probs(draft_logits, support)
    _, lp0 = _support_log_probs(target_logits, support)
    log_w = density_log_weight(target_logits, sid_tokens)[:, None, :]  # [B, 1, L]
    per_level = atspeed_s_level_loss(lq, lq0, lp0, log_w, density_reg, dr_mode)  # [B, K, L]
    return per_level[:, :n_align].mean(-1).mean()


def atspeed_r_loss(
    draft_logits: Tensor, target_logits: Tensor, support: Tensor, n_align: int | None = None
) -> Tensor:
    """AtSpeed-R alignment loss, eq. 8 (from eq. 6-7: maximise the acceptance 1 - TVD):

        1/|D'| sum_{(x, y) in D'} 1/L sum_t TVD(p'(.|x, y_<t), q'(.|x, y_<t)),
        TVD(p', q') = 1/2 sum_{v in V_c} |p'(v) - q'(v)|

    with D' the (prompt, teacher SID) pairs of the first `n_align` SIDs per example (default all K).
    Shapes as in `atspeed_s_loss`.
    """
    k = draft_logits.shape[1]
    n_align = k if n_align is None else n_align
    lq, _ = _support_log_probs(draft_logits, support)
    lp, _ = _support_log_probs(target_logits, support)
    tvd = 0.5 * (lp.exp() - lq.exp()).abs().sum(-1)  # [B, K, L]
    return tvd[:, :n_align].mean(-1).mean()


# --- the packed teacher-forcing batch ----------------------------------------------------------------
@dataclass
class SequenceBatch:
    """Each example's prompt once, then L-1 tokens per teacher SID; see build_sequence_batch."""

    tokens: Tensor  # [B, S] left-padded
    positions: Tensor  # [B, S] RoPE positions
    attn_mask: Tensor  # [B, S, S] True = the query (row) may attend the key (column)
    index: Tensor  # [B, K, L] flat index into the B*S states of the state predicting code t of SID k
    sid_tokens: Tensor  # [B, K, L] the teacher SIDs' tokens


def build_sequence_batch(
    prompts: Sequence[Sequence[int]],
    codes: Tensor,
    item_tokens: np.ndarray,
    codec: SIDCodec,
    max_items: int,
    device: torch.device | str = "cpu",
) -> SequenceBatch:
    """Teacher forcing of K SIDs per prompt in one forward, the prompt laid out once per row:

        [pad..] [BOS] prompt tokens | y_1 codes 1..L-1 | y_2 codes 1..L-1 | .. | y_K codes 1..L-1

    Code t of SID k is predicted by the prompt's last state (t = 0) or by SID k's token t-1. A SID
    token sees the whole prompt and its own SID's earlier tokens, at the RoPE position it has after
    the prompt, so every state equals that of the plain row [BOS] prompt y_k (tests check this).
    """
    b, k, levels = codes.shape
    if len(prompts) != b:
        raise ValueError(f"{len(prompts)} prompts for {b} rows of codes")
    sid_tokens = codec.codes_to_tokens(codes.to(device))
    sid_np = sid_tokens.cpu().numpy()
    n_sid = levels - 1  # the last code is only ever predicted
    rows = []
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty; a prompt needs at least one item")
        head = np.concatenate(
            [[BOS], item_tokens[np.asarray(prompt[-max_items:], dtype=np.int64)].reshape(-1)]
        )
        rows.append((head, sid_np[i, :, :n_sid].reshape(-1)))
    s = max(len(h) + len(t) for h, t in rows)
    tokens = np.full((b, s), PAD, dtype=np.int64)
    positions = np.zeros((b, s), dtype=np.int64)
    group = np.full((b, s), -2, dtype=np.int64)  # -2 pad, -1 prompt, k: a token of SID k
    index = np.zeros((b, k, levels), dtype=np.int64)
    for r, (head, tail) in enumerate(rows):
        p, start = len(head), s - len(head) - len(tail)
        tokens[r, start:] = np.concatenate([head, tail])
        positions[r, start:] = np.concatenate([np.arange(p), p + np.tile(np.arange(n_sid), k)])
        group[r, start : start + p] = -1
        group[r, start + p :] = np.repeat(np.arange(k), n_sid)
        index[r, :, 0] = r * s + start + p - 1
        index[r, :, 1:] = r * s + start + p + (np.arange(k)[:, None] * n_sid + np.arange(n_sid)[None, :])
    g = torch.from_numpy(group).to(device)
    pos = torch.from_numpy(positions).to(device)
    q_g, k_g = g[:, :, None], g[:, None, :]
    earlier = pos[:, None, :] <= pos[:, :, None]
    sees_prompt = (k_g == -1) & (q_g != -2) & ((q_g >= 0) | earlier)
    sees_own_sid = (q_g >= 0) & (k_g == q_g) & earlier
    eye = torch.eye(s, dtype=torch.bool, device=device)  # a pad query sees itself: no empty softmax row
    return SequenceBatch(
        tokens=torch.from_numpy(tokens).to(device),
        positions=pos,
        attn_mask=sees_prompt | sees_own_sid | eye,
        index=torch.from_numpy(index).to(device),
        sid_tokens=sid_tokens,
    )


def sequence_logits(model: GRTransformer, batch: SequenceBatch, autocast: bool = False) -> Tensor:
    """[B, K, L, V] float32 logits of every teacher SID code, from one packed forward."""
    device = batch.tokens.device
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
        hidden = model.hidden_states(batch.tokens, positions=batch.positions, attn_mask=batch.attn_mask)
        states = hidden.reshape(-1, hidden.shape[-1])[batch.index]  # [B, K, L, D]
        return model.lm_head(states).float()


def labelled_logits(
    model: GRTransformer, tokens: Tensor, mask: Tensor, labels: Tensor, autocast: bool = False
) -> tuple[Tensor, Tensor]:
    """(float32 logits [N, V], labels [N]) at the labelled positions of a next-item batch, computed
    as trainer.target_loss computes them (only labelled positions go through lm_head)."""
    sel = labels != IGNORE
    with torch.autocast(device_type=tokens.device.type, dtype=torch.bfloat16, enabled=autocast):
        hidden = model.hidden_states(tokens, mask)
        logits = model.lm_head(hidden[sel])
    return logits.float(), labels[sel]


# --- the trainer's side -------------------------------------------------------------------------
class AlignObjective:
    """One batch's mixed loss for a draft; the trainer drives the loop (windows, steps, validation)."""

    def __init__(
        self,
        kind: str,
        alpha: float,
        flags: AlignFlags,
        model: GRTransformer,
        target: GRTransformer | None,
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
        self.model, self.target, self.teacher = model, target, teacher
        self.codec, self.item_tokens, self.windows = codec, item_tokens, windows
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
                target, _ = labelled_logits(self.target, tok, mask, lab, self.autocast)
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
        """The sequence-level alignment loss of the teacher rows `batch_idx` (= the windows' indices)."""
        assert self.teacher is not None and self.prefixes is not None
        k = self.teacher.k
        n_align = 1 if self.flags.top1 else k
        # AtSpeed-S needs the K-th SID (y_K) even when it aligns on the top-1 only
        n_forward = k if self.kind == "atspeed_s" else n_align
        codes = torch.as_tensor(self.teacher.codes[batch_idx, :n_forward], device=self.device)
        prompts = [self.teacher.prompts[i] for i in batch_idx]
        batch = build_sequence_batch(
            prompts, codes, self.item_tokens, self.codec, self.max_items, self.device
        )
        draft = sequence_logits(self.model, batch, self.autocast)
        if self.kind == "seqkd":
            return seqkd_loss(draft, batch.sid_tokens)
        with torch.no_grad():
            target = sequence_logits(self.target, batch, self.autocast)
        allowed = valid_token_mask(codes, self.codec, self.prefixes) if self.flags.constrained else None
        support = alignment_support(draft, allowed, k)
        if self.kind == "atspeed_s":
            return atspeed_s_loss(
                draft, target, batch.sid_tokens, support, n_align, self.flags.density_reg, self.flags.dr_mode
            )
        return atspeed_r_loss(draft, target, support, n_align)

    def epoch_parts(self) -> dict[str, float]:
        """Mean L_rec and L_align over the steps since the last call (for the training history)."""
        out = {f"train_{name}_loss": float(np.mean(v)) for name, v in self.parts.items() if v}
        self.parts = {"rec": [], "align": []}
        return out


def load_target(path: str, codec: SIDCodec, max_items: int, device: torch.device) -> GRTransformer:
    """The target model, frozen, checked to share the codec and to fit the draft's windows."""
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


def prepare_alignment(
    cfg: TrainConfig,
    model: GRTransformer,
    ds: Dataset,
    item_tokens: np.ndarray,
    windows: Sequence[tuple[Sequence[int], int]],
    device: torch.device,
    autocast: bool,
) -> tuple[AlignObjective, dict]:
    """Load and check the target and teacher file of `cfg`; the objective and the checkpoint meta
    (`target`, `teacher`, `alpha` and the ablation flags)."""
    target = load_target(cfg.target, ds.codec, cfg.max_items, device) if cfg.target else None
    teacher, target_path = None, cfg.target
    if cfg.objective in SEQUENCE_OBJECTIVES:
        teacher = load_teacher(cfg.teacher)
        check_teacher_matches(teacher, list(windows), ds.codec, ds.item_codes(), cfg.max_items, cfg.target)
        target_path = target_path or teacher.manifest.get("target", "")  # SeqKD may name it via the file
    flags = AlignFlags(density_reg=not cfg.no_dr, constrained=not cfg.no_ca, top1=cfg.top1)
    objective = AlignObjective(
        cfg.objective, cfg.alpha, flags, model, target, teacher, ds.codec, item_tokens, ds.item_codes(),
        windows, cfg.max_items, device, autocast,
    )  # fmt: skip
    meta = {
        "target": str(Path(target_path).resolve()) if target_path else "",
        "alpha": cfg.alpha,
        "align_flags": asdict(flags),
        "teacher": str(Path(cfg.teacher).resolve()) if teacher is not None else "",
    }
    if teacher is not None:
        meta["teacher_k"], meta["teacher_kind"] = teacher.k, teacher.kind
    return objective, meta
