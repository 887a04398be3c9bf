"""The synthetic constrained decode that the STATIC benchmarks time (static_step, static_point,
static_vs_official): fixed random logits per level run through the beam core that decoding uses
(beam_core.run_beam_search) with a constraint backend as its ConstraintProcessor, timed per level
(whole step, the constraint's mask call, the processor's share).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from genrec.workloads.constraints.backend import MaskBackend
from genrec.workloads.decoding.base import PhaseTimer
from genrec.workloads.decoding.beam_core import run_beam_search, select_beams
from genrec.workloads.decoding.processors import ConstraintProcessor, ConstraintState
from genrec.workloads.decoding.xbeam import EarlyTopK


class DenseConstraint:
    """A ConstraintProcessor without `candidates`: the beam core then masks every level densely."""

    phase = "mask"

    def __init__(self, backend: MaskBackend) -> None:
        self.inner = ConstraintProcessor(backend)

    def init_state(self, batch: int, device: torch.device) -> ConstraintState:
        return self.inner.init_state(batch, device)

    def apply(
        self, level: int, state: ConstraintState, log_probs: torch.Tensor, beam_scores: torch.Tensor
    ) -> tuple[torch.Tensor, ConstraintState]:
        return self.inner.apply(level, state, log_probs, beam_scores)

    def advance(
        self, level: int, state: ConstraintState, parent: torch.Tensor, token: torch.Tensor
    ) -> ConstraintState:
        return self.inner.advance(level, state, parent, token)


@dataclass
class ReplayScorer:
    """The synthetic decode's model: fixed logits per level. Notes when each level starts and when
    its log-probs are ready (after the log-softmax)."""

    logits: list[torch.Tensor]
    starts: list[int] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)

    def level_log_probs(self, level: int) -> torch.Tensor:
        self.starts.append(time.perf_counter_ns())
        log_probs = torch.log_softmax(self.logits[level], dim=-1)
        self.ready.append(time.perf_counter_ns())
        return log_probs

    def advance(self, level: int, parent: torch.Tensor, token: torch.Tensor) -> None:
        return None


class LevelTimer(PhaseTimer):
    """A PhaseTimer that also keeps each phase's calls per level (the level the scorer is on): for a
    processor, its `candidates` / `apply` call, then its `advance`."""

    def __init__(self, device: torch.device, scorer: ReplayScorer) -> None:
        super().__init__(device)
        self.scorer = scorer
        self.per_level: dict[str, dict[int, list[int]]] = {}

    def add(self, name: str, ns: int) -> None:
        super().add(name, ns)
        self.per_level.setdefault(name, {}).setdefault(len(self.scorer.starts) - 1, []).append(ns)


@dataclass
class DecodeTiming:
    codes: torch.Tensor  # [batch, beam, L]
    scores: torch.Tensor  # [batch, beam]
    total_ns: int
    level_ns: list[int]  # whole step of each level (log-softmax, constraint, selection, advance)
    select_ns: list[int]  # the same after the log-softmax: what the constraint changes
    mask_ns: list[int]  # the constraint's candidates or mask (its first call of the level)
    processor_ns: list[int]  # the constraint processor's whole share: mask + state advance


def synthetic_decode(
    backend: MaskBackend | None,
    logits: list[torch.Tensor],
    batch: int,
    beam: int,
    dense: bool = False,
    select: str = "flat",
) -> DecodeTiming:
    """Constrained beam search over fixed logits through the beam core (backend None: unconstrained;
    `dense`: the dense path on every level; `select`: "flat" = select_beams (what `beam` and `static`
    run), "early" = xBeam's early-terminating top-W (what `xgr` runs))."""
    dev = logits[0].device
    levels = len(logits)
    processors = (
        [] if backend is None else [DenseConstraint(backend) if dense else ConstraintProcessor(backend)]
    )
    scorer = ReplayScorer(logits)
    timer = LevelTimer(dev, scorer)
    _sync(dev)
    t0 = time.perf_counter_ns()
    selector = EarlyTopK() if select == "early" else select_beams
    out = run_beam_search(scorer, processors, batch, beam, levels, dev, timer, selector)
    _sync(dev)
    end = time.perf_counter_ns()
    bounds = [*scorer.starts, end]
    calls = timer.per_level.get("mask", {})
    return DecodeTiming(
        out.codes,
        out.scores,
        end - t0,
        [bounds[i + 1] - bounds[i] for i in range(levels)],
        [bounds[i + 1] - scorer.ready[i] for i in range(levels)],
        [calls.get(i, [0])[0] for i in range(levels)],
        [sum(calls.get(i, [0])) for i in range(levels)],
    )


def make_logits(
    vocab: int, levels: int, batch: int, beam: int, temp: float, seed: int, dev: torch.device
) -> list[torch.Tensor]:
    """The fixed random logits of a synthetic decode: [batch, V] for level 0, [batch * beam, V] after."""
    rng = torch.Generator(device="cpu").manual_seed(seed)
    logits = [
        torch.randn(batch if lvl == 0 else batch * beam, vocab, generator=rng) * temp for lvl in range(levels)
    ]
    return [x.to(dev) for x in logits]


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def per_level_median_ms(runs: list[DecodeTiming], what: str) -> list[float]:
    """Median over the repeats of one per-level time (a DecodeTiming field), per level, in ms."""
    return [float(np.median(v)) / 1e6 for v in zip(*(getattr(r, what) for r in runs))]


def level_paths(tm) -> list[str]:
    """Which path each level takes: 'sparse' (candidates) or 'dense' (the [R, T] bias row)."""
    return ["sparse" if tm.proposes_candidates(level) else "dense" for level in range(tm.levels)]
