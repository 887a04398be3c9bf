"""Experiment files for sweep tests: the beam-width sweep they start from, and writing it as YAML.

Each test adds its own keys (metric, eval, seeds, ...) to the dict these return."""

from __future__ import annotations

from pathlib import Path

import yaml


def beam_sweep(name: str, data: Path, model: Path, results_dir: Path, *, k: int, widths: list[int]) -> dict:
    """The raw experiment NAME: the beam decoder (`k` = K) on DATA with the checkpoint MODEL, its
    `beam_width` swept over the grid WIDTHS, results under RESULTS_DIR; nothing else set."""
    return {
        "name": name,
        "dataset": {"path": str(data)},
        "model": {"checkpoint": str(model)},
        "decoder": "beam",
        "params": {"k": k},
        "search_space": {"beam_width": {"grid": widths}},
        "tracking": {"results_dir": str(results_dir)},
    }


def cpu_sweep(name: str, data: Path, model: Path, results_dir: Path, *, k: int, widths: list[int]) -> dict:
    """`beam_sweep` as the tests run it: each trial on one CPU and no GPU, and no report page written."""
    raw = beam_sweep(name, data, model, results_dir, k=k, widths=widths)
    raw["resources"] = {"cpu": 1, "gpu": 0}
    raw["tracking"]["report"] = False
    return raw


def write_experiment(path: Path, raw: dict) -> Path:
    """RAW written as YAML to PATH; PATH."""
    path.write_text(yaml.safe_dump(raw))
    return path
