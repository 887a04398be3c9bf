"""One CSR level of STATIC's constrained beam search as one Triton launch: candidates, top-W, next states.

On a GPU the torch sparse path of a CSR level (`csr_candidates`, the beam core's top-W, the chosen
slots' next states) is about ten small kernels per level, so it is bound by launches, not by work.
`csr_level_select_triton` does the whole level in one launch, one program per user:

1. (`logits=True` only) the log-softmax is fused: the program computes the logsumexp of each of its w
   rows over V (online max / sum over [LSE_ROWS, BLOCK_V] tiles) and folds it into the beam's score
   (score - lse, kept in a [R] scratch buffer, then a barrier), so each candidate costs one add;
2. candidates: slot s of beam j (i = j * B_l + s) reads edge row_ptr[state_j] + s of the stacked
   (token, next state) edges; it is a child iff that edge is below the node's end (every read past it
   is masked off, so the token clamp of the torch path is not needed); its value is
   score_j + logp[row_j, token], -inf on empty slots;
3. exact top-W: each value's float32 bits become a monotone int32 (negative floats get their lower 31
   bits flipped) packed above the candidate index into an int64 key, so keys are distinct and order
   like the values. The w * B_l candidates are read CHUNK (a power of two, at most MAX_CHUNK unless TOP
   is larger) at a time; a running top-TOP (TOP = the next power of two >= W, at least MIN_LANES) stays
   sorted descending, and each chunk's top-TOP
   (tl.topk), flipped to ascending, is merged by an elementwise max (the bitonic half-cleaner: it
   holds exactly the TOP largest of both) and re-sorted. One chunk when w * B_l <= MAX_CHUNK;
4. the first W keys are decoded back to (value, index): parent j, and from the chosen edge the code
   and the next CSR state. Slots with value -inf (fewer than W valid candidates, or padding beams) get
   parent 0, code 0 and the sink state 0.

Outputs match the torch reference `genrec.kernels.constrained_mask_torch.csr_level_select`: the same
multiset of scores bit for bit given log-probs (one float32 add per candidate in both); equal scores may
come in another order, so the chosen beams agree up to ties.
With `logits=True` the scores agree up to float rounding (score - lse + logit here, score + (logit -
lse) in torch). The grid has only B programs: fine while a level is a few hundred candidates per user
(CSR levels after the dense ones); the fused log-softmax reads w * V floats per program.

Kept to the Triton 3.6 language (the lent GPU machine's version): runtime-bound loops are `while`
loops, because the interpreter (TRITON_INTERPRET=1, CPU tests) cannot run a `for` over a runtime bound
with numpy 2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["MAX_BEAM", "MAX_CHUNK", "csr_level_select_triton", "triton_runs_on"]

MAX_CHUNK = 1024  # candidates sorted at once per program (a chunk never has fewer lanes than TOP)
MAX_BEAM = 1024  # widest beam served: the running top-W lives in registers
MIN_LANES = 16  # smallest sort (tests lower it, with MAX_CHUNK, to merge many chunks of a tiny level)
LSE_ROWS, BLOCK_V = 8, 512  # the fused log-softmax's tile: rows x vocabulary lanes
# decided when the kernels below are decorated (triton reads TRITON_INTERPRET then, not per call)
_INTERPRETED = bool(triton.knobs.runtime.interpret)


@triton.jit
def _pack(val, idx):
    """int64 keys ordered like the float32 values, ties broken by the index (distinct keys)."""
    bits = val.to(tl.int32, bitcast=True)
    mono = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (mono.to(tl.int64) << 32) | idx.to(tl.int64)


@triton.jit
def _unpack(key):
    """(float32 value, int32 index) of keys made by _pack (the bit flip is its own inverse)."""
    mono = (key >> 32).to(tl.int32)
    bits = mono ^ ((mono >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), (key & 0x7FFFFFFF).to(tl.int32)


@triton.jit
def _scores_minus_lse(
    lp_ptr, scores_ptr, adj_ptr, b, w, vocab, lp_stride, ROWS: tl.constexpr, BLOCK_V: tl.constexpr
):  # fmt: skip
    """adj[row] = score[row] - logsumexp(logits[row, :V]) for the user's w rows (the fused log-softmax),
    ROWS rows per [ROWS, BLOCK_V] tile, so one program keeps several rows' loads in flight."""
    j0 = 0
    while j0 < w:
        j = j0 + tl.arange(0, ROWS)
        row = b * w + j
        live = j < w
        # per-lane running max and sum; the max starts finite, so a lane of padding adds exp(-inf) = 0
        m = tl.full([ROWS, BLOCK_V], -3.0e38, tl.float32)
        s = tl.zeros([ROWS, BLOCK_V], tl.float32)
        v0 = 0
        while v0 < vocab:
            offs = v0 + tl.arange(0, BLOCK_V)
            ok = live[:, None] & (offs < vocab)[None, :]
            x = tl.load(lp_ptr + row[:, None] * lp_stride + offs[None, :], mask=ok, other=float("-inf"))
            m_new = tl.maximum(m, x)
            s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
            m = m_new
            v0 += BLOCK_V
        top = tl.max(m, axis=1)
        total = tl.sum(s * tl.exp(m - top[:, None]), axis=1)
        lse = top + tl.log(tl.where(live, total, 1.0))  # rows past w: no log(0)
        tl.store(adj_ptr + row, tl.load(scores_ptr + row, mask=live, other=0.0) - lse, mask=live)
        j0 += ROWS


@triton.jit
def _candidate_keys(
    lp_ptr, base_ptr, states_ptr, row_ptr_ptr, edges_ptr, b, w, vocab, lp_stride, branch, first,
    CHUNK: tl.constexpr,
):  # fmt: skip
    """Keys of candidates first .. first + CHUNK - 1 of user b (value -inf past the real children)."""
    i = first + tl.arange(0, CHUNK)
    j = i // branch
    row = b * w + j
    inside = i < w * branch
    state = tl.load(states_ptr + row, mask=inside, other=0).to(tl.int64)
    start = tl.load(row_ptr_ptr + state, mask=inside, other=0).to(tl.int64)
    end = tl.load(row_ptr_ptr + state + 1, mask=inside, other=0).to(tl.int64)
    edge = start + (i - j * branch)
    valid = inside & (edge < end)
    tok = tl.load(edges_ptr + edge * 2, mask=valid, other=0)
    valid = valid & (tok < vocab)  # real children always are; guards the log-prob read regardless
    lp = tl.load(lp_ptr + row * lp_stride + tok, mask=valid, other=float("-inf"))
    base = tl.load(base_ptr + row, mask=valid, other=float("-inf"))
    return _pack(tl.where(valid, base + lp, float("-inf")), i)


@triton.jit
def _csr_level_select_kernel(
    lp_ptr, scores_ptr, adj_ptr, states_ptr, row_ptr_ptr, edges_ptr,
    out_score_ptr, out_parent_ptr, out_code_ptr, out_state_ptr,
    w, vocab, lp_stride, branch, beam_width,
    FUSE_LSE: tl.constexpr, CHUNK: tl.constexpr, TOP: tl.constexpr,
    LSE_ROWS: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    base_ptr = scores_ptr
    if FUSE_LSE:
        _scores_minus_lse(lp_ptr, scores_ptr, adj_ptr, b, w, vocab, lp_stride, LSE_ROWS, BLOCK_V)
        tl.debug_barrier()  # the adjusted scores are read back by other threads of the program
        base_ptr = adj_ptr
    # running top-TOP, sorted descending; starts as -inf keys (decoded as padding if never replaced)
    top = _pack(tl.full([TOP], float("-inf"), tl.float32), tl.zeros([TOP], tl.int32))
    first = 0
    while first < w * branch:
        keys = _candidate_keys(
            lp_ptr, base_ptr, states_ptr, row_ptr_ptr, edges_ptr, b, w, vocab, lp_stride, branch, first, CHUNK
        )
        top = tl.sort(tl.maximum(top, tl.flip(tl.topk(keys, TOP), 0)), descending=True)
        first += CHUNK
    val, i = _unpack(top)
    k = tl.arange(0, TOP)
    out = k < beam_width
    found = out & (val > float("-inf"))
    j = tl.where(found, i // branch, 0)
    state = tl.load(states_ptr + b * w + j, mask=found, other=0).to(tl.int64)
    edge = tl.load(row_ptr_ptr + state, mask=found, other=0).to(tl.int64) + (i - j * branch)
    o = b * beam_width + k
    tl.store(out_score_ptr + o, val, mask=out)
    tl.store(out_parent_ptr + o, j.to(tl.int64), mask=out)
    tl.store(out_code_ptr + o, tl.load(edges_ptr + edge * 2, mask=found, other=0).to(tl.int64), mask=out)
    tl.store(out_state_ptr + o, tl.load(edges_ptr + edge * 2 + 1, mask=found, other=0), mask=out)


def triton_runs_on(device: torch.device) -> None:
    """Raise with the fix when Triton cannot run on `device` (CPU tensors need the interpreter)."""
    if device.type != "cuda" and not _INTERPRETED:
        raise RuntimeError(
            f"csr_level_select_triton needs CUDA tensors (got {device.type}): on CPU set TRITON_INTERPRET=1 "
            "before triton is first imported (slow; tests only), or use the torch reference "
            "genrec.kernels.constrained_mask_torch.csr_level_select"
        )


def csr_level_select_triton(
    log_probs: torch.Tensor,
    scores: torch.Tensor,
    states: torch.Tensor,
    row_ptr: torch.Tensor,
    edges: torch.Tensor,
    branch: int,
    beam_width: int,
    logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One CSR level for all users in one launch (see the module doc): (new scores [B, W] float32,
    parent [B, W] int64 (index into the user's w beams), code [B, W] int64, next state [B * W] int32).

    log_probs [B * w, V] float32 (raw logits with `logits=True`), scores [B, w] float32, states [B * w]
    (CSR states of the level), row_ptr [S + 1] int32, edges [E + pad, 2] int32, branch = B_l."""
    triton_runs_on(log_probs.device)
    if not 1 <= beam_width <= MAX_BEAM:
        raise ValueError(f"beam width {beam_width} outside 1..{MAX_BEAM}: use csr_level_select_torch")
    batch, w = scores.shape
    rows, vocab = log_probs.shape
    if rows != batch * w or states.shape != (rows,):
        raise ValueError(f"log_probs {tuple(log_probs.shape)} and states must have B * w = {batch * w} rows")
    dev = log_probs.device
    # a level's slice of the full-vocabulary log-probs is row-strided but unit-stride inside a row
    lp = (log_probs if log_probs.stride(1) == 1 else log_probs.contiguous()).float()
    base = scores.contiguous().float()
    out_score = torch.empty(batch, beam_width, dtype=torch.float32, device=dev)
    parent = torch.empty(batch, beam_width, dtype=torch.int64, device=dev)
    code = torch.empty(batch, beam_width, dtype=torch.int64, device=dev)
    nxt = torch.empty(batch * beam_width, dtype=torch.int32, device=dev)
    if batch == 0:
        return out_score, parent, code, nxt
    top = max(triton.next_power_of_2(beam_width), MIN_LANES)
    chunk = max(min(triton.next_power_of_2(w * branch), MAX_CHUNK), top)
    _csr_level_select_kernel[(batch,)](
        lp, base, torch.empty_like(base) if logits else base, states.contiguous(),
        row_ptr.contiguous(), edges.contiguous(), out_score, parent, code, nxt,
        w, vocab, lp.stride(0), branch, beam_width,
        FUSE_LSE=logits, CHUNK=chunk, TOP=top,
        LSE_ROWS=LSE_ROWS, BLOCK_V=min(triton.next_power_of_2(vocab), BLOCK_V),
        num_warps=8 if chunk >= 1024 else 4,
    )  # fmt: skip
    return out_score, parent, code, nxt
