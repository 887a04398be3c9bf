"""AtSpeed's sequence-level objectives (`--objective seqkd|atspeed_s|atspeed_r`); notation as in align.py.

Sequence-level objectives, on the teacher's top-K SIDs Y of each example (teacher.py: one row per
training window, the window's prompt); the draft and target score every distinct context c_<t of a
batch once (align_context_tree.py), and align_sequences.py averages the per-level terms defined here:
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
"""

from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")
DR_MODES = ("weighted", "literal")  # AtSpeed-S's density term; see the module doc
# bumped when the AtSpeed-S objective changes meaning: drafts cached under another reading are not reused
ATSPEED_S_READING = "weighted-dr-mean-over-sids-v2"


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


def support_log_probs(logits: Tensor, support: Tensor) -> tuple[Tensor, Tensor]:
    """(log of the softmax renormalised over the support, -inf outside; the same with 0 outside).

    The zero-filled copy keeps 0 * (-inf) out of the products, so no NaN reaches the gradients."""
    lp = torch.log_softmax(logits.float().masked_fill(~support, NEG_INF), dim=-1)
    return lp, lp.masked_fill(~support, 0.0)


def reverse_kl_on_support(lq: Tensor, lq0: Tensor, lp0: Tensor) -> Tensor:
    """[...] KL(q' || p') = sum_{V_c} q' log(q' / p'); >= 0, and 0 exactly when q' = p' on V_c.
    Arguments as `support_log_probs` returns them (lq: -inf outside V_c; lq0, lp0: 0 there)."""
    return (lq.exp() * (lq0 - lp0)).sum(-1)


def negative_entropy_on_support(lq: Tensor, lq0: Tensor) -> Tensor:
    """[...] sum_{V_c} q' log q' = -H(q'); arguments as `support_log_probs` returns them."""
    return (lq.exp() * lq0).sum(-1)


def atspeed_s_terms(
    rkld: Tensor, neg_entropy: Tensor, log_w: Tensor, density_reg: bool = True, dr_mode: str = "weighted"
) -> Tensor:
    """RKLD_t - DR_t from its parts: KL(q'||p'), -H(q') and log w_t (broadcast together)."""
    if not density_reg:
        return rkld
    if dr_mode == "weighted":
        return rkld - log_w.exp() * neg_entropy
    if dr_mode == "literal":  # sum q' log(q' / w) = -H(q') - log w  (sum q' = 1)
        return rkld - (neg_entropy - log_w)
    raise ValueError(f"dr_mode must be one of {DR_MODES}, got {dr_mode!r}")
