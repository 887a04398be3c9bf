"""What the one-call GPU check runs: its steps in priority order, each step's commands, and the targets
read from the JSON each step writes.

A step is a list of commands (argv lists, run in turn) with a time limit and an estimate of its GPU time;
a target names the step whose JSON it reads, a reader that returns the figure (None where the file lacks
it) and the goal the figure must reach. `plan(cfg)` sizes everything for the device (`full`) or for the
CPU dry run that CI runs (`dry`: tiny shapes, Triton under its interpreter), so a change that breaks a
command or renames a JSON field fails here before a lent GPU session finds out.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KERNEL_TESTS = (
    "tests/test_csr_level_select.py",
    "tests/test_shared_prefix_attention_triton.py",
    "tests/test_constrained_mask_triton.py",
    "tests/test_xgr_attention.py",
    "tests/test_xgr.py::test_xgr_with_the_triton_attention_equals_beam",
)


@dataclass(frozen=True)
class CheckConfig:
    work: Path  # scratch folder: the prepared data and model, each step's raw JSON under raw/
    device: str = "cuda"
    dry: bool = False  # tiny shapes for the CPU dry run
    python: str = sys.executable

    def raw(self, name: str) -> Path:
        return self.work / "raw" / f"{name}.json"

    @property
    def data(self) -> Path:
        return self.work / "data"

    @property
    def model(self) -> Path:
        return self.work / "model"


@dataclass(frozen=True)
class Target:
    label: str  # what the summary prints, goal included
    step: str
    read: Callable[[Path], float | None]  # the step's raw JSON -> the figure
    goal: float  # met when figure >= goal
    cuda_only: bool = False  # a figure that only a CUDA device has (peak memory)
    raw: str = ""  # the raw JSON's name when it is not the step's

    @property
    def source(self) -> str:
        return self.raw or self.step


@dataclass(frozen=True)
class Step:
    name: str
    commands: tuple[tuple[str, ...], ...]
    timeout_s: int  # the most this step may take
    estimate_s: int  # expected GPU time: a step starts only when the budget has this much left
    needs: tuple[str, ...] = ()  # steps that must have succeeded first
    built: bool = True  # False: a measurement the repo cannot make yet ("not built")


# ---- readers: the figure a target needs from a step's JSON ------------------------------------------


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def pytest_counts(path: Path) -> dict[str, int]:
    """{'passed': n, 'failed': n, ...} from the pytest log a kernel step keeps beside its JSON."""
    text = path.with_suffix(".log").read_text() if path.with_suffix(".log").exists() else ""
    return {
        word: int(n)
        for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|tests? collected)", text)
    }


def kernels_ok(path: Path) -> float | None:
    """1.0 when every collected kernel test passed (or, dry, was collected), 0.0 on any failure."""
    c = pytest_counts(path)
    ran = c.get("passed", 0) + c.get("tests collected", 0) + c.get("test collected", 0)
    if not ran and not c:
        return None
    return 1.0 if ran and not c.get("failed") and not c.get("errors") and not c.get("error") else 0.0


def attention_ratio(beams: int) -> Callable[[Path], float | None]:
    """SDPA over a per-beam-copied cache / the Triton staged kernel, eager, at `beams` (widest batch)."""

    def read(path: Path) -> float | None:
        rows = [r for r in load(path)["rows"] if r.get("beams") == beams and r.get("sdpa_over_triton")]
        return max((r["sdpa_over_triton"] for r in rows), default=None)

    return read


def peak_ratio(beams: int) -> Callable[[Path], float | None]:
    def read(path: Path) -> float | None:
        return load(path)["ratios"].get(f"hf_over_xgr_bw{beams}")

    return read


def select_ratio(path: Path) -> float | None:
    rows = [r for r in load(path)["rows"] if r.get("beam") >= 512 or len(load(path)["rows"]) == 1]
    return min((r["flat_over_early_of_medians"] for r in rows), default=None)


def best_rate(arms: dict, prefix: str) -> float | None:
    rates = [a["best_rate_median"] for label, a in arms.items() if label.startswith(prefix)]
    return max(rates, default=None)


def serving_ratio(num: str, den: str) -> Callable[[Path], float | None]:
    """Best arm whose label starts with `num` over the best starting with `den` (items/s at the SLO)."""

    def read(path: Path) -> float | None:
        arms = load(path)["arms"]
        a, b = best_rate(arms, num), best_rate(arms, den)
        return a / b if a and b else None

    return read


def atspeed_ws(key: str) -> Callable[[Path], float | None]:
    """The best strict arm's `ws` (over beam) or `ws_vs_hf` (over HF generate)."""

    def read(path: Path) -> float | None:
        rows = load(path)["rows"]
        return max(
            (r[key] for name, r in rows.items() if name.startswith("strict") and key in r), default=None
        )

    return read


def static_results(path: Path) -> list[dict]:
    """static_step's per-size results (each with its backend rows and level-select timings)."""
    return load(path)["results"]


def trie_overhead(path: Path) -> float | None:
    """The CPU trie's added step time over STATIC's (torch), at the largest set measured."""
    rows = [r for res in static_results(path)[-1:] for r in res["rows"] if r["backend"] == "cpu_trie"]
    return max(
        (r["overhead_vs_static_torch"] for r in rows if r.get("overhead_vs_static_torch")), default=None
    )


def level_select_exact(path: Path) -> float | None:
    levels = [lv for res in static_results(path) for lv in res.get("level_select_us") or []]
    return float(all(lv["exact"] for lv in levels)) if levels else None


def level_select_speedup(path: Path) -> float | None:
    """torch / Triton median of the one-launch CSR level select, the slowest level (the kernel must win
    on every CSR level before the beam core takes it)."""
    levels = [lv for res in static_results(path) for lv in res.get("level_select_us") or []]
    return min((lv["triton_speedup"] for lv in levels), default=None)


def imported_ratio(path: Path) -> float | None:
    return load(path).get("xgr_over_hf_at_widest")


# ---- the plan -----------------------------------------------------------------------------------------


def module(cfg: CheckConfig, name: str, flags: str) -> tuple[str, ...]:
    """`python -m name` with its flags written as one string (paths here have no spaces)."""
    return (cfg.python, "-m", name, *flags.split())


def kernel_step(cfg: CheckConfig) -> Step:
    # dry: only collected (CI runs these tests under the interpreter anyway); full: compiled and run
    mode = ("--collect-only",) if cfg.dry else ()
    pytest = (cfg.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *mode)
    return Step(
        "kernels",
        ((*pytest, *KERNEL_TESTS), (*pytest, "-m", "gpu", "tests/test_gpu.py")),
        timeout_s=180,
        estimate_s=90,
    )


def xgr_steps(cfg: CheckConfig) -> list[Step]:
    d = cfg.device
    if cfg.dry:
        # one timed call per arm: under the interpreter the Triton kernel at BW 512 takes ~25 s a call
        att = "--beams 16 512 --users 1 --heads 1 --head-dim 16 --prompt 8 --dtypes float32 --repeats 1 "
        att += "--warmup 0 --inner 1"
        peak = "--size tiny --codebook 16 --items 300 --beams 16 --k 5"
        sel = "--beam 512 --codebook 64 --batch 1 --repeats 5 --warmup 1"
    else:
        att = "--beams 16 512 --users 1 8 --repeats 30 --warmup 5"
        peak = "--size small --beams 16 512"
        sel = "--beam 512 --codebook 256 --batch 1 4 --repeats 200"
    att_out, peak_out, sel_out = cfg.raw("xgr_attention"), cfg.raw("xgr_peak_memory"), cfg.raw("xgr_select")
    return [
        Step(
            "xgr_attention",
            (module(cfg, "genrec.studies.xgr.xgr_attention", f"--device {d} {att} --out {att_out}"),),
            timeout_s=150,
            estimate_s=45,
        ),
        Step(
            "xgr_peak_memory",
            (
                module(
                    cfg,
                    "genrec.studies.xgr.xgr_peak_memory",
                    f"--device {d} {peak} --decoders xgr hf_beam --out {peak_out}",
                ),
            ),
            timeout_s=120,
            estimate_s=30,
        ),
        Step(
            "xgr_select",
            (module(cfg, "genrec.studies.xgr.xgr_select", f"--device {d} {sel} --out {sel_out}"),),
            timeout_s=90,
            estimate_s=20,
        ),
    ]


def serving_step(cfg: CheckConfig) -> Step:
    flags = f"--model {cfg.model} --data {cfg.data} --device {cfg.device} --threads 1 --k 10 --refine 1 "
    flags += "--repeats 1 --arm xgr/fixed-16 xgr/slo-w0.3-b0.35 hf_beam/fixed-8 "
    if cfg.dry:  # a loose SLO, so the loaded 2-core CI machine answers and the ratios have figures
        flags += "--beam-width 16 --slo-ms 3000 --duration-s 1 --warmup-s 0.2 --rates 4 8 "
        flags += "--decoder-rates hf_beam=2,4"
    else:
        flags += "--beam-width 128 --slo-ms 200 --duration-s 2 --warmup-s 0.5 --rates 250 500 1000 2000 4000 "
        flags += "8000 --decoder-rates hf_beam=10,20,40,80,160,320"
    harness = module(cfg, "genrec.workloads.serving.harness", f"{flags} --out {cfg.raw('serving')}")
    return Step("serving", (harness,), timeout_s=200, estimate_s=90, needs=("prepare",))


def atspeed_step(cfg: CheckConfig) -> Step:
    models = cfg.work / "atspeed_models"
    size, epochs, users = ("tiny", 1, 4) if cfg.dry else ("base", 4, 64)
    train = module(
        cfg,
        "genrec.studies.atspeed.atspeed_objectives",
        f"--data {cfg.data} --models-dir {models} --target-size {size} --draft-size tiny --objectives sft "
        f"--seeds 0 --epochs {epochs} --k 10 --draft-beams 20 --gamma 3 --users {users} --threads 0 "
        f"--device {cfg.device} --quiet --out {cfg.raw('atspeed_objectives')}",
    )
    # atspeed_pair finds the trained target and draft by the folder names atspeed_objectives gives them
    latency = tuple(
        module(
            cfg,
            "genrec.studies.gpu.atspeed_pair",
            f"--models-dir {models} --data {cfg.data} --target-size {size} --device {cfg.device} "
            f"--batch-size {batch} --users {users * 2} --out {cfg.raw(f'atspeed_b{batch}')}",
        )
        for batch in (1, 32)
    )
    return Step("atspeed", (train, *latency), timeout_s=240, estimate_s=120, needs=("prepare",))


def static_step(cfg: CheckConfig) -> Step:
    if cfg.dry:
        shape = "--sizes 2000 --vocab 64 --levels 4 --beam 8 --repeats 2 --warmup 1 --threads 1"
    else:
        shape = "--sizes 1000000 --vocab 2048 --levels 8 --beam 70 --repeats 30 --warmup 5"
    flags = f"--device {cfg.device} {shape} --batch 2 --dense-levels 2 --backends unconstrained static_torch "
    flags += f"cpu_trie --level-select --out {cfg.raw('static')}"
    return Step(
        "static", (module(cfg, "genrec.studies.static.static_step", flags),), timeout_s=150, estimate_s=60
    )


def prepare_step(cfg: CheckConfig) -> Step:
    flags = f"--out {cfg.work} --device {cfg.device}" + (" --dry" if cfg.dry else "")
    return Step("prepare", (module(cfg, "genrec.studies.gpu.prepare", flags),), timeout_s=120, estimate_s=30)


def imported_step(cfg: CheckConfig) -> Step:
    """A Qwen3-0.6B-shaped bf16 checkpoint with SID tokens, built there and imported (issue 32)."""
    sized = (
        "--tiny --beams 8 16 --users 2 --repeats 2" if cfg.dry else "--beams 16 128 512 --users 8 --repeats 3"
    )
    flags = f"--device {cfg.device} {sized} --work {cfg.work / 'qwen3'} --out {cfg.raw('imported_qwen3')}"
    return Step("imported_qwen3", (module(cfg, "genrec.studies.beam.qwen3_shaped", flags),), 240, 120)


def plan(cfg: CheckConfig) -> list[Step]:
    """Every step, most important first (the budget cuts from the end)."""
    return [
        kernel_step(cfg),
        *xgr_steps(cfg),
        prepare_step(cfg),
        serving_step(cfg),
        atspeed_step(cfg),
        static_step(cfg),
        imported_step(cfg),
    ]


# every GPU target of the check, most important first (the summary's order)
TARGETS = (
    Target("compiled kernels equal their torch references (pytest, all pass)", "kernels", kernels_ok, 1.0),
    Target("xGR attention: SDPA copied / Triton at BW 512 >= 3x", "xgr_attention", attention_ratio(512), 3.0),
    Target("xGR attention: SDPA copied / Triton at BW 16 >= 1x", "xgr_attention", attention_ratio(16), 1.0),
    Target(
        "xGR decode peak memory: hf_beam / xgr at BW 512 >= 4x",
        "xgr_peak_memory",
        peak_ratio(512),
        4.0,
        cuda_only=True,
    ),
    Target("xGR selection: flat top-k / early top-BW at BW 512 >= 2x", "xgr_select", select_ratio, 2.0),
    Target(
        "serving BW 128: best xgr / best hf_beam items/s at P99 <= 200 ms >= 3x",
        "serving",
        serving_ratio("xgr", "hf_beam"),
        3.0,
    ),
    Target(
        "serving BW 128: xgr slo / xgr fixed >= 1.3x",
        "serving",
        serving_ratio("xgr/slo", "xgr/fixed"),
        1.3,
    ),
    Target(
        "AtSpeed strict WS@10 vs beam, batch 1 >= 1.5x",
        "atspeed",
        atspeed_ws("ws"),
        1.5,
        raw="atspeed_b1",
    ),
    Target(
        "AtSpeed strict WS@10 vs HF generate, batch 1 >= 2x",
        "atspeed",
        atspeed_ws("ws_vs_hf"),
        2.0,
        raw="atspeed_b1",
    ),
    Target(
        "AtSpeed strict WS@10 vs beam, batch 32 >= 1.5x",
        "atspeed",
        atspeed_ws("ws"),
        1.5,
        raw="atspeed_b32",
    ),
    Target(
        "AtSpeed strict WS@10 vs HF generate, batch 32 >= 2x",
        "atspeed",
        atspeed_ws("ws_vs_hf"),
        2.0,
        raw="atspeed_b32",
    ),
    Target("STATIC: CPU trie overhead / STATIC torch at |C| = 1e6 >= 20x", "static", trie_overhead, 20.0),
    Target("STATIC: CSR level-select kernel exact vs torch", "static", level_select_exact, 1.0),
    Target(
        "STATIC: CSR level-select kernel, torch / Triton (slowest level) >= 1x",
        "static",
        level_select_speedup,
        1.0,
    ),
    Target(
        "imported Qwen3-0.6B-shaped bf16: xgr / hf_beam users/s at the widest BW >= 1x",
        "imported_qwen3",
        imported_ratio,
        1.0,
    ),
)


def targets() -> list[Target]:
    return list(TARGETS)
