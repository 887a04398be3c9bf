"""STATIC constrained decoding as registry benchmarks (`benchmark: static_scaling` / `static_branch`).

    scaling_point  one (backend, |C|, V) point: the median time of one constrained decoding step
                   (log-softmax + the backend's mask + top-k + state advance, per step = the synthetic
                   decode of static_step.py divided by L) against the same decode without a mask, run
                   interleaved in one process on the same logits; plus build time and index memory.
    branch_point   the VNTK alone at one maximum branch factor B: a constraint set whose last-level
                   nodes all have exactly B children; the dense fused form (`apply`, `kernel_ms`), the
                   bool-mask form, and the sparse candidates decoding uses on CSR levels
                   (`candidates_ms`, torch) on `batch * beam` random last-level states.

Pure torch / numpy (no ray): the sweep trial calls these with `seed`, `threads` and `device` filled in.
Baselines (cpu_trie, ppv_*, hash_bitmap) above `baseline_max_size` items are not run: the point returns
`skipped = 1` and NaN timings, so one grid over backend x |C| can take STATIC further than the baselines.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from genrec.kernels.constrained_mask_torch import csr_candidates, packed_edges, row_bounds
from genrec.studies.static.static_decode import _sync, make_logits, synthetic_decode
from genrec.workloads.constraints.baselines import BASELINES
from genrec.workloads.constraints.sets import ConstraintSet, uniform_random
from genrec.workloads.constraints.transition import TransitionMatrix, build_transition_matrix
from genrec.workloads.constraints.vntk import StaticMask

SCALING_BACKENDS = ("static", *BASELINES)  # static | cpu_trie | ppv_exact | ppv_approx | hash_bitmap
KERNELS = ("torch", "triton")
NAN = float("nan")


def _setup(threads: int, device: str) -> torch.device:
    if threads:
        torch.set_num_threads(int(threads))
    return torch.device(device)


def _median_ms(times_ns: list[int], per: int = 1) -> float:
    return float(np.median(times_ns)) / 1e6 / per


def _skipped_point() -> dict:
    """A baseline above baseline_max_size: not run, NaN timings."""
    return {
        "skipped": 1,
        "step_ms": NAN,
        "unconstrained_step_ms": NAN,
        "overhead_ratio": NAN,
        "overhead_ms": NAN,
        "build_s": NAN,
        "memory_mb": NAN,
        "mb_per_million": NAN,
    }


def _build_backend(backend: str, cset: ConstraintSet, dense_levels: int, dev: torch.device) -> tuple:
    """The backend's index over `cset` on `dev`, plus the figures only STATIC reports."""
    if backend == "static":
        tm = build_transition_matrix(cset, dense_levels).to(dev)
        extra = {
            "u_max_mb": tm.u_max_bytes() / 2**20,
            "max_branch_sparse": max(tm.max_branch[dense_levels:]),
        }
        return StaticMask(tm, "torch"), extra
    return BASELINES[backend](cset, dev), {}


def _interleaved_decode_ns(
    be, backend: str, logits, batch: int, beam: int, warmup: int, reps: int
) -> dict[str, list[int]]:
    """Synthetic decode times with the backend's mask and without, alternating which runs first."""
    pair = {"unconstrained": None, backend: be}
    times: dict[str, list[int]] = {k: [] for k in pair}
    for rep in range(warmup + reps):
        order = list(pair) if rep % 2 == 0 else list(reversed(pair))  # drift hits both alike
        for name in order:
            timing = synthetic_decode(pair[name], logits, batch, beam)
            if rep >= warmup:
                times[name].append(timing.total_ns)
    return times


def _step_metrics(times: dict[str, list[int]], backend: str, levels: int) -> dict:
    step = _median_ms(times[backend], levels)
    base = _median_ms(times["unconstrained"], levels)
    return {
        "step_ms": step,
        "step_ms_p99": float(np.percentile(times[backend], 99)) / 1e6 / levels,
        "unconstrained_step_ms": base,
        "overhead_ratio": step / base,
        "overhead_ms": step - base,
    }


def _returned_metrics(cset: ConstraintSet, last, levels: int) -> dict:
    """How many SIDs the last constrained decode returned, and the share of them in the set."""
    found = torch.isfinite(last.scores).reshape(-1).cpu().numpy()
    flat = last.codes.reshape(-1, levels).cpu().numpy()[found]
    return {
        "compliance": float(cset.contains(flat).mean()) if len(flat) else NAN,
        "returned": int(found.sum()),
    }


def scaling_point(
    constraint_size: int,
    vocab: int = 2048,
    levels: int = 8,
    batch: int = 2,
    beam: int = 70,
    backend: str = "static",
    dense_levels: int = 2,
    reps: int = 20,
    warmup: int = 3,
    temp: float = 3.0,
    baseline_max_size: int = 10**6,
    threads: int = 2,
    device: str = "cpu",
    seed: int = 0,
) -> dict:
    """Per-step cost of one backend at one constraint-set size (uniform random SIDs over V^L)."""
    if backend not in SCALING_BACKENDS:
        raise ValueError(f"backend must be one of {SCALING_BACKENDS}, got {backend!r}")
    if backend != "static" and baseline_max_size and constraint_size > baseline_max_size:
        return _skipped_point()
    dev = _setup(threads, device)
    t0 = time.perf_counter()
    cset = uniform_random((vocab,) * levels, constraint_size, seed=seed)
    set_build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    be, extra = _build_backend(backend, cset, dense_levels, dev)
    _sync(dev)
    build_s = time.perf_counter() - t0
    logits = make_logits(vocab, levels, batch, beam, temp, seed, dev)
    with torch.no_grad():
        times = _interleaved_decode_ns(be, backend, logits, batch, beam, warmup, reps)
        last = synthetic_decode(be, logits, batch, beam)
    memory_mb = be.memory_bytes() / 2**20
    return {
        "skipped": 0,
        **_step_metrics(times, backend, levels),
        "build_s": build_s,
        "set_build_s": set_build_s,
        "memory_mb": memory_mb,
        "mb_per_million": memory_mb / (len(cset) / 1e6),
        "set_size": len(cset),
        **_returned_metrics(cset, last, levels),
        **extra,
    }


def branch_set(
    max_branch: int, constraint_size: int, vocab: int, levels: int, seed: int = 0
) -> ConstraintSet:
    """About `constraint_size` SIDs whose last-level nodes all have exactly `max_branch` children:
    constraint_size // max_branch random distinct prefixes of length L - 1, each completed by the
    `max_branch` consecutive codes (mod V) after a random offset."""
    n_prefix = max(1, constraint_size // max_branch)
    prefixes = uniform_random((vocab,) * (levels - 1), n_prefix, seed=seed).codes.astype(np.int64)
    offset = np.random.default_rng(seed + 1).integers(0, vocab, size=len(prefixes))
    last = (offset[:, None] + np.arange(max_branch)) % vocab  # [P, B], distinct per prefix
    codes = np.concatenate(
        [np.repeat(prefixes, max_branch, axis=0), last.reshape(-1, 1)], axis=1
    )  # prefix-major, so every prefix's children are distinct rows
    return ConstraintSet.from_codes(f"branch{max_branch}_s{seed}", (vocab,) * levels, codes, rule="branch")


def _vntk_functions(kernel: str) -> tuple:
    """(bool-mask VNTK, fused apply VNTK) of the torch or the Triton implementation."""
    if kernel == "torch":
        from genrec.kernels.constrained_mask_torch import vntk as mask_fn
        from genrec.kernels.constrained_mask_torch import vntk_apply as apply_fn
    else:
        from genrec.kernels.constrained_mask import vntk_apply_triton as apply_fn
        from genrec.kernels.constrained_mask import vntk_triton as mask_fn
    return mask_fn, apply_fn


def _call_times_ns(calls: dict, warmup: int, reps: int, dev: torch.device) -> dict[str, list[int]]:
    """Each call's times over `reps` rounds (after `warmup`), the calls run in turn within a round."""
    times: dict[str, list[int]] = {k: [] for k in calls}
    with torch.no_grad():
        for rep in range(warmup + reps):
            for name, (fn, args) in calls.items():
                _sync(dev)
                t = time.perf_counter_ns()
                fn(*args)
                _sync(dev)
                if rep >= warmup:
                    times[name].append(time.perf_counter_ns() - t)
    return times


def _random_states_and_logprobs(
    tm: TransitionMatrix, level: int, dense_levels: int, rows: int, vocab: int, seed: int, dev: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` random states of `level` (a sparse level) and random log-probabilities over the codebook."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    lo = tm.level_base[level - dense_levels]
    states = torch.randint(lo, tm.num_states, (rows,), generator=gen, dtype=torch.int32).to(dev)
    lp = torch.log_softmax(torch.randn(rows, vocab, generator=gen), -1).to(dev)
    return states, lp


def branch_point(
    max_branch: int,
    constraint_size: int = 100_000,
    vocab: int = 2048,
    levels: int = 8,
    batch: int = 2,
    beam: int = 70,
    dense_levels: int = 2,
    kernel: str = "torch",
    reps: int = 50,
    warmup: int = 5,
    threads: int = 2,
    device: str = "cpu",
    seed: int = 0,
) -> dict:
    """VNTK time at the last level of a set whose last-level nodes all have exactly `max_branch`
    children (the kernel reads B_l = max_branch slots per beam), on batch * beam random states."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if max_branch > vocab:
        raise ValueError(f"max_branch ({max_branch}) cannot exceed the codebook size vocab ({vocab})")
    dev = _setup(threads, device)
    mask_fn, apply_fn = _vntk_functions(kernel)
    cset = branch_set(max_branch, constraint_size, vocab, levels, seed)
    t0 = time.perf_counter()
    tm = build_transition_matrix(cset, dense_levels).to(dev)
    build_s = time.perf_counter() - t0
    level = levels - 1
    branch = tm.max_branch[level]
    rows = batch * beam
    states, lp = _random_states_and_logprobs(tm, level, dense_levels, rows, vocab, seed, dev)
    slots = torch.arange(branch, dtype=torch.int32, device=dev)
    calls = {
        "kernel": (apply_fn, (lp, states, tm.row_ptr, tm.edges, branch)),
        "mask_kernel": (mask_fn, (states, tm.row_ptr, tm.edges, branch, vocab)),
        "candidates": (csr_candidates, (lp, states, row_bounds(tm.row_ptr), packed_edges(tm.edges), slots)),
    }
    times = _call_times_ns(calls, warmup, reps, dev)
    kernel_ms = _median_ms(times["kernel"])
    return {
        "kernel_ms": kernel_ms,
        "kernel_ms_p99": float(np.percentile(times["kernel"], 99)) / 1e6,
        "mask_kernel_ms": _median_ms(times["mask_kernel"]),
        "candidates_ms": _median_ms(times["candidates"]),
        "kernel_us_per_beam": kernel_ms * 1e3 / rows,
        "max_branch_factor": int(branch),
        "set_size": len(cset),
        "build_s": build_s,
        "memory_mb": tm.memory_bytes()["total"] / 2**20,
    }
