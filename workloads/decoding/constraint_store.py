"""Constraint sets and their mask indexes for one decoder context, built once and reused.

Any beam-based decoder names its constraint with `BeamParams.constraint` (a rule of
params.CONSTRAINT_RULES or a registered set's name); the store builds the set from the catalogue
on first use and the mask backend (STATIC's transition matrix by default, or a baseline) once per
(set, dense levels, backend, kernel, device).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from genrec.workloads.constraints.backend import MaskBackend
from genrec.workloads.constraints.baselines import BASELINES
from genrec.workloads.constraints.sets import (
    ConstraintSet,
    all_items,
    cold_start,
    from_file,
    random_subset,
    uniform_random,
)
from genrec.workloads.constraints.transition import build_transition_matrix
from genrec.workloads.constraints.vntk import StaticMask
from genrec.workloads.decoding.params import CONSTRAINT_RULES, BeamParams
from genrec.workloads.errors import UserInputError
from genrec.workloads.sid_codec import SIDCodec

KERNELS = ("torch", "triton")
BACKENDS = ("static", *BASELINES)


@dataclass(frozen=True)
class RuleKey:
    rule: str
    size: int
    seed: int
    path: str


@dataclass(frozen=True)
class MaskKey:
    set_name: str
    set_id: int  # identity: re-registering a name builds a new index
    dense_levels: int
    backend: str
    kernel: str
    device: str


class ConstraintStore:
    def __init__(self, codec: SIDCodec, item_codes: np.ndarray, popularity: np.ndarray | None) -> None:
        self.codec, self.item_codes, self.popularity = codec, item_codes, popularity
        self._registered: dict[str, ConstraintSet] = {}
        self._by_rule: dict[RuleKey, ConstraintSet] = {}
        self._masks: dict[MaskKey, MaskBackend] = {}

    def register(self, cset: ConstraintSet) -> None:
        """Make `cset` selectable as `constraint=cset.name` (replacing an earlier set of that name)."""
        if cset.name in CONSTRAINT_RULES:
            raise UserInputError(f"constraint set name {cset.name!r} clashes with a rule; rename it")
        if tuple(cset.codebook_sizes) != tuple(self.codec.codebook_sizes):
            raise UserInputError(
                f"constraint set {cset.name!r} has codebooks {cset.codebook_sizes}, the model's are "
                f"{self.codec.codebook_sizes}"
            )
        self._registered[cset.name] = cset
        self._masks = {k: v for k, v in self._masks.items() if k.set_name != cset.name}

    @property
    def registered(self) -> list[str]:
        return sorted(self._registered)

    def constraint_set(self, p: BeamParams) -> ConstraintSet:
        """The set `p.constraint` names (p.constraint must not be "none")."""
        if p.constraint not in CONSTRAINT_RULES:
            if p.constraint not in self._registered:
                raise UserInputError(
                    f"unknown constraint {p.constraint!r}: use a rule {list(CONSTRAINT_RULES)} "
                    f"or a registered set {self.registered}"
                )
            return self._registered[p.constraint]
        if p.constraint == "none":
            raise ValueError("constraint 'none' has no set")
        key = RuleKey(p.constraint, p.constraint_size, p.constraint_seed, p.constraint_path)
        if key not in self._by_rule:
            self._by_rule[key] = self._build(key)
        return self._by_rule[key]

    def _build(self, key: RuleKey) -> ConstraintSet:
        codec, items = self.codec, self.item_codes
        if key.rule == "all":
            return all_items(codec, items)
        if key.rule == "random":
            return random_subset(codec, items, key.size, key.seed)
        if key.rule == "cold_start":
            if self.popularity is None:
                raise UserInputError("constraint 'cold_start' needs train counts (the context's popularity)")
            return cold_start(codec, items, self.popularity)
        if key.rule == "file":
            return from_file(codec, key.path)
        return uniform_random(codec, key.size, key.seed)

    def mask_backend(
        self,
        p: BeamParams,
        device: torch.device,
        dense_levels: int = 2,
        backend: str = "static",
        kernel: str = "torch",
    ) -> MaskBackend:
        """The mask index of p's constraint set on `device` (built once per set and settings)."""
        if backend not in BACKENDS:
            raise UserInputError(f"`backend` must be one of {list(BACKENDS)}, got {backend!r}")
        cset = self.constraint_set(p)
        d = min(dense_levels, self.codec.levels - 1)
        key = MaskKey(cset.name, id(cset), d, backend, kernel, str(device))
        if key not in self._masks:
            if backend == "static":
                self._masks[key] = StaticMask(build_transition_matrix(cset, d).to(device), kernel)
            else:
                self._masks[key] = BASELINES[backend](cset, device)
        return self._masks[key]
