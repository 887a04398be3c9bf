"""Fault suite, hostile files: checkpoint configs, dataset folders and experiment files built to exhaust
memory or time are refused with a UserInputError naming the problem, each within 5 s and 500 MB of
RSS, in a child process whose address space is capped at what it maps after its imports + 500 MB
(hostile_probe.py: what `prlimit --as` does), so a regression fails the test instead of the machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fault_helpers import corrupt_copy, edit_json, write_bytes

PROBE = Path(__file__).with_name("hostile_probe.py")
SECONDS, MEGABYTES = 5.0, 500

CHECKPOINTS = {
    "n-layers-100000": (edit_json(("model", "n_layers"), 100_000), "`model.n_layers` must be"),
    "n-heads-0": (edit_json(("model", "n_heads"), 0), "`model.n_heads` must be"),
    "max-seq-len-0": (edit_json(("model", "max_seq_len"), 0), "`model.max_seq_len` must be"),
    "dim-1e9": (edit_json(("model", "dim"), 10**9), "`model.dim` must be"),
    "dim-string": (edit_json(("model", "dim"), "64"), "`model.dim` must be"),
    "rope-nan": (edit_json(("model", "rope_theta"), float("nan")), "`model.rope_theta`"),
    "max-items-1e12": (edit_json(("max_items",), 10**12), "beyond the model's max_seq_len"),
    "wide-and-deep": (
        lambda p: (edit_json(("model", "n_layers"), 1000)(p), edit_json(("model", "dim"), 4096)(p)),
        "model.safetensors does not match its config",
    ),
}


def string_item_ids(path: Path) -> None:
    table = pq.read_table(path)
    i = table.schema.get_field_index("item_id")
    pq.write_table(
        table.set_column(i, "item_id", pa.array([str(x) for x in table["item_id"].to_pylist()])), path
    )


DATASETS = {
    "levels-three": ("manifest.json", edit_json(("levels",), "three"), "`levels` must be the integer 3"),
    "codebooks-huge": ("manifest.json", edit_json(("codebook_sizes",), [10**12] * 3), "`codebook_sizes`"),
    "num-items-string": ("manifest.json", edit_json(("num_items",), "200"), "`num_items` must be"),
    "manifest-list": ("manifest.json", write_bytes(b"[1, 2]"), "expected a JSON object"),
    "string-item-ids": ("interactions.parquet", string_item_ids, "column `item_id` holds"),
}


def run_probe(cases: list[list[str]], tmp_path: Path) -> dict[str, dict]:
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps(cases))
    out = subprocess.run(
        [sys.executable, str(PROBE), str(spec)], capture_output=True, text=True, timeout=300, check=False
    )
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == len(cases), out.stderr[-3000:]
    return {r["name"]: r for r in rows}


def assert_refused(row: dict, words: str) -> None:
    assert row["error"] in ("UserInputError", "DatasetError"), row
    assert words in row["message"], row
    assert row["s"] < SECONDS and row["mb"] < MEGABYTES, row


def test_hostile_checkpoints_and_datasets_are_refused_within_limits(tiny_model_dir, synth_dir, tmp_path):
    cases = []
    for name, (corrupt, _) in CHECKPOINTS.items():
        cases.append(
            [name, "checkpoint", str(corrupt_copy(tiny_model_dir, tmp_path / name, "config.json", corrupt))]
        )
    for name, (file, corrupt, _) in DATASETS.items():
        cases.append([name, "dataset", str(corrupt_copy(synth_dir, tmp_path / name, file, corrupt))])
    rows = run_probe(cases, tmp_path)
    for name, (_, words) in CHECKPOINTS.items():
        assert_refused(rows[name], words)
    for name, (_, _, words) in DATASETS.items():
        assert_refused(rows[name], words)


@pytest.mark.parametrize("name", ["tiny"])
def test_the_probe_loads_a_good_checkpoint(name, tiny_model_dir, synth_dir, tmp_path):
    rows = run_probe(
        [["model", "checkpoint", str(tiny_model_dir)], ["data", "dataset", str(synth_dir)]], tmp_path
    )
    assert rows["model"]["error"] is None and rows["data"]["error"] is None, rows


def experiment_yaml(
    space: str = "beam_width: {grid: [10, 20]}", seeds: str = "[0]", params: str = "{k: 10}"
) -> str:
    return (
        "name: hostile\ndataset: {path: data}\nmodel: {checkpoint: model}\ndecoder: beam\n"
        f"params: {params}\nsearch_space:\n  {space}\nseeds: {seeds}\n"
    )


LAUGHS = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]\n"
    for i in range(1, 10)
)
EXPERIMENTS = {
    "range-to-1e12": (experiment_yaml("beam_width: {range: {low: 1, high: 1.0e12}}"), "the limit is 10000"),
    "step-1e-12": (
        experiment_yaml("beam_width: {range: {low: 10, high: 20, step: 1.0e-12}}"),
        "the limit is",
    ),
    "cross-product": (
        experiment_yaml("beam_width: {range: {low: 10, high: 9000}}", seeds=str(list(range(5000)))),
        "the limit is 10,000: narrow the search space or pass --max-trials",
    ),
    "billion-laughs": (LAUGHS + experiment_yaml(), "expands to more than"),
    "deep-params": (experiment_yaml(params="[" * 5000 + "]" * 5000), "nests"),
    "not-utf8": (experiment_yaml().replace("hostile", "host\udcffile"), "not UTF-8"),
    "too-large": (experiment_yaml() + "#" + "x" * (2 << 20) + "\n", "-byte limit for a YAML experiment file"),
}


def test_hostile_experiment_files_are_refused_within_limits(tmp_path):
    cases = []
    for name, (text, _) in EXPERIMENTS.items():
        path = tmp_path / f"{name}.yaml"
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        cases.append([name, "experiment", str(path)])
    rows = run_probe(cases, tmp_path)
    for name, (_, words) in EXPERIMENTS.items():
        assert_refused(rows[name], words)


def test_max_trials_raises_the_trial_limit(tmp_path):
    from genrec.platform.experiment_loading import load_experiment
    from genrec.workloads.errors import UserInputError

    path = tmp_path / "wide.yaml"
    path.write_text(experiment_yaml("beam_width: {range: {low: 10, high: 4009}}", seeds="[0, 1, 2]"))
    with pytest.raises(UserInputError, match="makes 12,000 trials"):
        load_experiment(path, tmp_path, check_files=False)
    assert load_experiment(path, tmp_path, check_files=False, max_trials=12_000).num_trials() == 12_000
