"""STATIC side by side with the official PyTorch implementation (youtube/static-constraint-decoding).

    git clone https://github.com/youtube/static-constraint-decoding /tmp/static-constraint-decoding
    python -m genrec.studies.static.static_vs_official --peer /tmp/static-constraint-decoding \\
        --sizes 10000 100000 1000000 10000000 --vocab 2048 --levels 8 --dense-levels 2 \\
        --batch 2 --beam 70 --threads 1 --repeats 30 --warmup 3 [--out docs/results/static_vs_official.json]

The peer is imported from the folder given by --peer (its `static_decoding` package: `csr_utils`
builds its index, `decoding_pt` decodes); none of its code is copied here. For each |C| one uniform
random set of SIDs is built; both indexes are built from its sorted codes, and both searches run on
the same fixed random logits per level, interleaved repeat by repeat in alternating order, in one
process (inference mode, --threads torch threads):

- ours: the beam core (beam_core.run_beam_search) with STATIC as its constraint processor, each level
  on its cheaper path (static_decode.synthetic_decode);
- peer: `sparse_transition_torch` with a model that replays the same logits, `tokens_per_beam` =
  beam (--peer-tokens-per-beam; fewer makes its dense level inexact: the global top W is only among
  each beam's top `tokens_per_beam` when that is >= W).

Per level, two times are taken from inside each search, without changing what it runs:
- `mask`: the constraint's own work from the level's log-probs to what the selection ranks. Ours: the
  processor's `candidates` / `apply` call. Peer: at level 0 and its dense level, from the end of its
  log-softmax to its first top-k (the mask gather and `torch.where`); at CSR levels, its
  `generate_and_apply_logprobs_mask` call. The peer's module globals `F`, `torch` and that function
  are swapped for copies whose `log_softmax` / `topk` / mask function note the time, then call the
  original.
- `step`: the whole level after the log-softmax (mask, top-k selection, next states, SID buffer):
  ours from the log-probs being ready to the next level's start; peer from the end of its
  log-softmax to its next model call (the model call and the log-softmax are the same work in both).
Reported per |C|: per-level medians over the repeats and their sums over levels (`mask_ms_sum`,
`step_ms_sum`; also the median of per-search sums, `*_sum_of_runs`), the peer / ours ratios of the
sums, build time and index memory of each, and whether the two searches returned the same SIDs per
user.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys
import time
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from genrec.studies.common.options import add_shared_options
from genrec.studies.static.static_decode import make_logits, synthetic_decode
from genrec.workloads.constraints.sets import uniform_random
from genrec.workloads.constraints.transition import build_transition_matrix
from genrec.workloads.constraints.vntk import StaticMask
from genrec.workloads.errors import UserInputError, run_main
from genrec.workloads.io import atomic_write_text
from genrec.workloads.results import current_environment


def load_peer(path: Path) -> tuple[types.ModuleType, types.ModuleType]:
    """The peer's (csr_utils, decoding_pt) modules, loaded from the files of its checkout folder (each
    imports only numpy / torch; nothing is installed or put on sys.path)."""
    if not (path / "static_decoding" / "decoding_pt.py").is_file():
        raise UserInputError(
            f"--peer {path}: no static_decoding/decoding_pt.py there; clone "
            "https://github.com/youtube/static-constraint-decoding and pass its folder"
        )
    return tuple(
        _module_from_file(path / "static_decoding" / f"{name}.py") for name in ("csr_utils", "decoding_pt")
    )


def _module_from_file(file: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"static_peer_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class PeerClock:
    """Times noted inside one peer search, per level: model calls, log-softmax ends, first top-k, and
    its CSR mask function's duration."""

    model_calls: list[int] = field(default_factory=list)
    softmax_ends: list[int] = field(default_factory=list)
    first_topk: dict[int, int] = field(default_factory=dict)
    csr_mask: dict[int, int] = field(default_factory=dict)

    def level(self) -> int:
        return len(self.model_calls) - 1


class ReplayModel:
    """The peer's model interface (input ids -> logits [R, 1, V]) replaying fixed logits per level."""

    def __init__(self, logits: list[torch.Tensor], clock: PeerClock) -> None:
        self.logits, self.clock = logits, clock

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.clock.model_calls.append(time.perf_counter_ns())
        return self.logits[self.clock.level()][:, None, :]


def instrument_peer(decoding_pt: types.ModuleType, clock_box: list[PeerClock]) -> None:
    """Swap the peer module's globals `F`, `torch` and its CSR mask function for timed copies.

    The copies are namespaces holding the same functions (attribute lookups cost what a module's do);
    only `log_softmax`, `topk` and the mask function are wrapped, each noting one timestamp."""
    functional, real_torch = decoding_pt.F, decoding_pt.torch
    mask_fn = decoding_pt.generate_and_apply_logprobs_mask

    def log_softmax(*args, **kwargs):
        out = functional.log_softmax(*args, **kwargs)
        clock_box[0].softmax_ends.append(time.perf_counter_ns())
        return out

    def topk(*args, **kwargs):
        clock = clock_box[0]
        clock.first_topk.setdefault(clock.level(), time.perf_counter_ns())
        return real_torch.topk(*args, **kwargs)

    def timed_mask(*args, **kwargs):
        t0 = time.perf_counter_ns()
        out = mask_fn(*args, **kwargs)
        clock_box[0].csr_mask[clock_box[0].level()] = time.perf_counter_ns() - t0
        return out

    decoding_pt.F = types.SimpleNamespace(**{**vars(functional), "log_softmax": log_softmax})
    decoding_pt.torch = types.SimpleNamespace(**{**vars(real_torch), "topk": topk})
    decoding_pt.generate_and_apply_logprobs_mask = timed_mask


@dataclass
class LevelTimes:
    total_ns: int
    mask_ns: list[int]
    step_ns: list[int]
    codes: np.ndarray  # [batch, beam, L]


@dataclass
class PeerIndex:
    tensors: dict  # the peer's decoding arguments
    memory_bytes: int  # of the builder's arrays as built (int32 / bool)
    build_s: float


def build_peer_index(csr_utils: types.ModuleType, codes: np.ndarray, vocab: int, d: int) -> PeerIndex:
    t0 = time.perf_counter()
    packed, indptr, branches, start_mask, dense_mask, dense_states = csr_utils.build_static_index(
        codes, vocab, dense_lookup_layers=d
    )
    build_s = time.perf_counter() - t0
    memory = sum(a.nbytes for a in (packed, indptr, start_mask, dense_mask, dense_states))
    # dtypes as in the peer's own tests (tests/test_pt_decoding.py): int64 tables, bool masks
    tensors = {
        "packed_csr": torch.tensor(packed, dtype=torch.long),
        "csr_indptr": torch.tensor(indptr, dtype=torch.long),
        "start_mask": torch.tensor(start_mask, dtype=torch.bool),
        "dense_mask": torch.tensor(dense_mask, dtype=torch.bool),
        "dense_states": torch.tensor(dense_states, dtype=torch.long),
        "max_branch_factors": tuple(int(b) for b in branches),
    }
    return PeerIndex(tensors, memory, build_s)


def run_peer(
    decoding_pt: types.ModuleType,
    index: PeerIndex,
    logits: list[torch.Tensor],
    clock_box: list[PeerClock],
    args: argparse.Namespace,
) -> LevelTimes:
    clock = PeerClock()
    clock_box[0] = clock
    t0 = time.perf_counter_ns()
    out = decoding_pt.sparse_transition_torch(
        model=ReplayModel(logits, clock),
        batch_size=args.batch,
        beam_size=args.beam,
        tokens_per_beam=args.peer_tokens_per_beam or args.beam,
        start_token=0,
        max_sample_len=args.levels,
        vocab_size=args.vocab,
        device=torch.device("cpu"),
        d_dense=args.dense_levels,
        **index.tensors,
    )
    end = time.perf_counter_ns()
    ends = [*clock.model_calls[1:], end]
    step = [ends[i] - clock.softmax_ends[i] for i in range(args.levels)]
    mask = [
        clock.csr_mask[i] if i in clock.csr_mask else clock.first_topk[i] - clock.softmax_ends[i]
        for i in range(args.levels)
    ]
    return LevelTimes(end - t0, mask, step, out.numpy())


def run_ours(mask: StaticMask, logits: list[torch.Tensor], args: argparse.Namespace) -> LevelTimes:
    t = synthetic_decode(mask, logits, args.batch, args.beam)
    return LevelTimes(t.total_ns, t.mask_ns, t.select_ns, t.codes.numpy())


def same_sids(a: np.ndarray, b: np.ndarray) -> float:
    """Fraction of users whose W SIDs are the same set in both searches."""
    same = [sorted(map(tuple, a[u].tolist())) == sorted(map(tuple, b[u].tolist())) for u in range(a.shape[0])]
    return float(np.mean(same))


def summarise(times: list[LevelTimes]) -> dict:
    def med(values) -> float:
        return float(np.median(values)) / 1e6

    mask = [med(v) for v in zip(*(t.mask_ns for t in times))]
    step = [med(v) for v in zip(*(t.step_ns for t in times))]
    # the sums of per-level medians are the headline figures: on a shared machine a search now and then
    # loses the CPU for a scheduler slice (~4 ms), which a per-level median drops and a per-search sum
    # keeps; the median of per-search sums is reported beside them
    return {
        "mask_ms_levels": mask,
        "step_ms_levels": step,
        "mask_ms_sum": sum(mask),
        "step_ms_sum": sum(step),
        "mask_ms_sum_of_runs": med([sum(t.mask_ns) for t in times]),
        "step_ms_sum_of_runs": med([sum(t.step_ns) for t in times]),
        "search_ms": med([t.total_ns for t in times]),
    }


def compare_at(
    n: int,
    args: argparse.Namespace,
    csr_utils: types.ModuleType,
    decoding_pt: types.ModuleType,
    clock_box: list,
) -> dict:
    cset = uniform_random((args.vocab,) * args.levels, n, seed=args.seed)
    t0 = time.perf_counter()
    tm = build_transition_matrix(cset, args.dense_levels)
    ours_build_s = time.perf_counter() - t0
    mask = StaticMask(tm)
    peer = build_peer_index(csr_utils, cset.codes, args.vocab, args.dense_levels)
    logits = make_logits(
        args.vocab, args.levels, args.batch, args.beam, args.temp, args.seed, torch.device("cpu")
    )
    arms = {
        "ours": lambda: run_ours(mask, logits, args),
        "peer": lambda: run_peer(decoding_pt, peer, logits, clock_box, args),
    }
    runs: dict[str, list[LevelTimes]] = {k: [] for k in arms}
    with torch.inference_mode():
        for rep in range(args.warmup + args.repeats):
            for name in arms if rep % 2 == 0 else reversed(arms):  # drift hits both alike
                timing = arms[name]()
                if rep >= args.warmup:
                    runs[name].append(timing)
    ours, theirs = summarise(runs["ours"]), summarise(runs["peer"])
    return {
        "set_size": n,
        "max_branch": list(tm.max_branch),
        "paths": ["sparse" if tm.proposes_candidates(lv) else "dense" for lv in range(tm.levels)],
        "ours": {**ours, "build_s": ours_build_s, "memory_mb": tm.memory_bytes()["total"] / 2**20},
        "peer": {**theirs, "build_s": peer.build_s, "memory_mb": peer.memory_bytes / 2**20},
        "mask_speedup": theirs["mask_ms_sum"] / ours["mask_ms_sum"],
        "step_speedup": theirs["step_ms_sum"] / ours["step_ms_sum"],
        "search_speedup": theirs["search_ms"] / ours["search_ms"],
        "same_sids": same_sids(runs["ours"][-1].codes, runs["peer"][-1].codes),
    }


def summary_table(results: list[dict]) -> str:
    lines = [
        f"{'|C|':>10}  {'mask ms ours':>12} {'peer':>8} {'x':>6}   {'step ms ours':>12} {'peer':>8} {'x':>6}"
        f"   {'same SIDs':>9}"
    ]
    for r in results:
        o, p = r["ours"], r["peer"]
        mask = f"{o['mask_ms_sum']:>12.3f} {p['mask_ms_sum']:>8.3f} {r['mask_speedup']:>5.2f}x"
        step = f"{o['step_ms_sum']:>12.3f} {p['step_ms_sum']:>8.3f} {r['step_speedup']:>5.2f}x"
        lines.append(f"{r['set_size']:>10}  {mask}   {step}   {r['same_sids']:>9.2f}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m genrec.studies.static.static_vs_official", description=__doc__.split("\n")[0]
    )
    p.add_argument("--peer", type=Path, required=True, help="checkout of youtube/static-constraint-decoding")
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000, 10_000_000])
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--levels", type=int, default=8)
    p.add_argument("--dense-levels", type=int, default=2, choices=[1, 2], help="the peer supports d = 1, 2")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--beam", type=int, default=70)
    p.add_argument("--peer-tokens-per-beam", type=int, default=0, help="0: the beam width (exact)")
    add_shared_options(
        p,
        repeats=30,
        warmup=3,
        threads=1,
        seed=0,
    )
    p.add_argument("--temp", type=float, default=3.0, help="logit scale (peakier distributions)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if min(args.sizes) < args.beam:
        p.error("every size must be >= --beam (the peer fills missing beams with SIDs outside the set)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        csr_utils, decoding_pt = load_peer(args.peer.resolve())
    except UserInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    clock_box: list[PeerClock] = [PeerClock()]
    instrument_peer(decoding_pt, clock_box)
    results = []
    for n in args.sizes:
        results.append(compare_at(n, args, csr_utils, decoding_pt, clock_box))
        print(json.dumps(results[-1]), flush=True)
    print(summary_table(results))
    if args.out:
        report = {
            "command": "python -m genrec.studies.static.static_vs_official " + shlex.join(sys.argv[1:]),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "environment": asdict(current_environment(torch.device("cpu"))),
            "results": results,
        }
        atomic_write_text(args.out, json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    run_main(main)
