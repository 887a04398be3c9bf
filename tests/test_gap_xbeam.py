"""xBeam's group-pruning path (numpy form on CPU; torch form) with ties inside the top BW (issue 36, item 3).

The pruned path proves its answer only when the BW-th value beats the (BW+1)-th, so inputs with few
distinct values almost always fall back to the flat selection and never reach its own ordering of equal
values. Here the top BW are full of exact ties (small integers) and strictly above every other candidate,
so the pruned path answers, and its order must be the flat stable order: by value, then by flat index
j * T + c (what `xgr == beam` claims, ties included)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.decoding import xbeam
from genrec.workloads.decoding.beam_core import run_beam_search, select_beams

NEG_INF = float("-inf")


def flat_stable_top(values: list[float], k: int) -> tuple[list[float], list[int]]:
    """The reference: sort every flat candidate by (value descending, index ascending), keep k."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]
    return [values[i] for i in order], order


def tied_candidates(b: int, w: int, t: int, k: int, seed: int, dtype: torch.dtype, lp_dtype: torch.dtype):
    """Beam scores in {0, -1, -2} and level log-probs [B, w, T]: in each row exactly k candidates take
    values in {-1, -2, -3} (their sums tie a lot), every other one is <= -20 or -inf."""
    rng = np.random.default_rng(seed)
    scores = np.sort(rng.integers(-2, 1, (b, w)).astype(np.float64), axis=1)[:, ::-1].copy()
    lp = -20.0 - rng.integers(0, 2, (b, w * t)).astype(np.float64)
    lp[rng.random((b, w * t)) < 0.3] = NEG_INF
    for row in range(b):
        band = rng.choice(w * t, size=k, replace=False)
        lp[row, band] = -1.0 - rng.integers(0, 3, k)
    return torch.tensor(scores, dtype=dtype), torch.tensor(lp, dtype=lp_dtype).view(b, w, t)


# (beam scores, log-probs) dtypes: equal fp32 / fp64 take the numpy form (CPU); fp64 scores over fp32
# log-probs take the torch form (the one GPUs run) on the same CPU
DTYPES = [(torch.float32, torch.float32), (torch.float64, torch.float64), (torch.float64, torch.float32)]


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 3),
    w=st.integers(1, 8),
    t=st.sampled_from([64, 128]),
    k_frac=st.floats(0, 1),
    seed=st.integers(0, 10_000),
    dtypes=st.sampled_from(DTYPES),
)
def test_pruned_path_orders_ties_like_the_flat_stable_sort(b, w, t, k_frac, seed, dtypes):
    k = 1 + int(k_frac * (16 * w - 2))  # prunes(): 2 (k + 1) T / 32 <= w T
    assert xbeam.prunes(w, t, k)
    scores, lp = tied_candidates(b, w, t, k, seed, *dtypes)
    assert xbeam.pruned_topk(scores, lp, k) is not None  # the pruned path answers (no fallback)
    top, flat = xbeam.early_topk(scores, lp, k)
    for row in range(b):
        values = (scores[row, :, None] + lp[row]).reshape(-1).tolist()
        want_values, want_index = flat_stable_top(values, k)
        assert flat[row].tolist() == want_index
        assert top[row].tolist() == want_values
    # the selector the xgr decoder runs: the same beams as (parent, code); with lent output buffers
    # too where the dtypes are the decoder's (fp32 scores and log-probs; the buffers are fp32)
    selectors = [xbeam.EarlyTopK()]
    if scores.dtype == lp.dtype == torch.float32:
        selectors.append(xbeam.EarlyTopK(xbeam.SelectBuffers.build(b, k, 1, torch.device("cpu"))))
    for selector in selectors:
        got_scores, parent, code = selector(scores, lp, k)
        assert torch.equal(got_scores, top) and torch.equal(parent * t + code, flat)


class TiedScorer:
    """A LevelScorer whose every level's log-probs are tie-full (no model): rows [B*w, T]."""

    def __init__(self, b: int, t: int, seed: int) -> None:
        self.b, self.t, self.rng, self.rows = b, t, np.random.default_rng(seed), b

    def level_log_probs(self, level: int) -> torch.Tensor:
        return torch.tensor(-self.rng.integers(1, 4, (self.rows, self.t)), dtype=torch.float32)

    def advance(self, level: int, parent: torch.Tensor, token: torch.Tensor) -> None:
        self.rows = len(parent)


@settings(max_examples=15, deadline=None)
@given(b=st.integers(1, 2), width=st.integers(2, 12), seed=st.integers(0, 10_000))
def test_early_selector_search_equals_a_stable_flat_search_on_ties(b, width, seed):
    """Three levels of 64 codes with log-probs in {-1, -2, -3}: the beam core with xBeam's selector keeps
    the same beams, in the same order, as one with a stable flat sort (the reference selector)."""

    def stable_select(scores, log_probs, beam_width):
        bb, w, t = log_probs.shape
        cand = (scores[:, :, None] + log_probs).view(bb, -1)
        values, index = cand.sort(dim=-1, descending=True, stable=True)
        values, index = values[:, :beam_width], index[:, :beam_width]
        return values, index // t, index % t

    device = torch.device("cpu")
    early = run_beam_search(TiedScorer(b, 64, seed), [], b, width, 3, device, select=xbeam.EarlyTopK())
    ref = run_beam_search(TiedScorer(b, 64, seed), [], b, width, 3, device, select=stable_select)
    assert torch.equal(early.scores, ref.scores) and torch.equal(early.codes, ref.codes)
    flat = run_beam_search(TiedScorer(b, 64, seed), [], b, width, 3, device, select=select_beams)
    assert torch.equal(early.scores, flat.scores)  # beam's flat top-k: the same values
