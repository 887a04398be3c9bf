"""Fault suite, bad inputs: corrupt checkpoints, dataset folders and AtSpeed files.

Each corrupt file must end the command with exit 2 and one message naming the file (no traceback),
before Ray starts: `genrec eval`, `genrec data info`, `genrec data import atspeed`, and the pre-flight
of `genrec sweep` and `genrec serve`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import run_cli
from experiment_files import cpu_sweep, write_experiment
from fault_helpers import corrupt_copy, edit_json, empty, random_bytes, truncate, write_bytes
from safetensors.torch import save_file

CHECKPOINT_FAULTS = {
    # model.safetensors
    "weights-truncated": ("model.safetensors", truncate, "model.safetensors: not a readable safetensors"),
    "weights-random": ("model.safetensors", random_bytes, "model.safetensors: not a readable safetensors"),
    "weights-empty": ("model.safetensors", empty, "model.safetensors: not a readable safetensors"),
    "weights-foreign": (
        "model.safetensors",
        lambda p: save_file({"other.weight": torch.zeros(3)}, str(p)),
        "model.safetensors does not match",
    ),
    # config.json
    "config-dim": ("config.json", edit_json(("model", "dim"), 32), "does not match"),
    "config-vocab-larger": (
        "config.json",
        edit_json(("model", "vocab_size"), lambda v: v + 5),
        "does not match",
    ),
    "config-vocab-smaller": ("config.json", edit_json(("model", "vocab_size"), 4), "smaller than the codec"),
    "config-no-codec": ("config.json", edit_json(("codec",), delete=True), "missing key(s) ['codec']"),
    "config-unknown-key": ("config.json", edit_json(("model", "colour"), "red"), "unknown key(s) ['colour']"),
    "config-codec-type": ("config.json", edit_json(("codec", "codebook_sizes"), "abc"), "`codec` must be"),
    "config-heads": ("config.json", edit_json(("model", "n_heads"), 3), "`model` is invalid"),
    "config-negative-dim": ("config.json", edit_json(("model", "dim"), -8), "config.json"),
    "config-max-items": ("config.json", edit_json(("max_items",), -1), "`max_items` must be a positive"),
    "config-version": ("config.json", edit_json(("format_version",), 99), "format_version 99"),
    "config-truncated": ("config.json", truncate, "config.json: not valid JSON"),
    "config-not-utf8": ("config.json", write_bytes(b'{"model": "\xff\xfe"}'), "config.json: not valid JSON"),
    "config-list": ("config.json", write_bytes(b"[1, 2]"), "expected a JSON object"),
    "config-empty": ("config.json", empty, "config.json: not valid JSON"),
}


@pytest.mark.parametrize("fault", sorted(CHECKPOINT_FAULTS))
def test_corrupt_checkpoint_exits_2_naming_the_file(fault, tiny_model_dir, synth_dir, tmp_path, capsys):
    name, corrupt, words = CHECKPOINT_FAULTS[fault]
    model = corrupt_copy(tiny_model_dir, tmp_path / "model", name, corrupt)
    code = run_cli(["eval", "--model", str(model), "--data", str(synth_dir), "--max-users", "2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert words in err and str(model) in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1  # one line, not a traceback


def write_parquet_of_other_columns(path: Path) -> None:
    pq.write_table(pa.table({"x": [1, 2]}), path)


DATASET_FAULTS = {
    "interactions-truncated": ("interactions.parquet", truncate, "not a readable Parquet file"),
    "interactions-garbage": ("interactions.parquet", random_bytes, "not a readable Parquet file"),
    "interactions-empty": ("interactions.parquet", empty, "not a readable Parquet file"),
    "interactions-columns": ("interactions.parquet", write_parquet_of_other_columns, "missing columns"),
    "items-truncated": ("items.parquet", truncate, "not a readable Parquet file"),
    "items-garbage": ("items.parquet", random_bytes, "not a readable Parquet file"),
    "items-empty": ("items.parquet", empty, "not a readable Parquet file"),
    "manifest-not-utf8": ("manifest.json", write_bytes(b'{"name": "\xff"}'), "not UTF-8 text"),
    "manifest-not-json": ("manifest.json", truncate, "not valid JSON"),
    "manifest-unknown-key": ("manifest.json", edit_json(("colour",), 1), "unexpected fields"),
}


@pytest.mark.parametrize("fault", sorted(DATASET_FAULTS))
def test_corrupt_dataset_exits_2_naming_the_file(fault, synth_dir, tmp_path, capsys):
    name, corrupt, words = DATASET_FAULTS[fault]
    data = corrupt_copy(synth_dir, tmp_path / "data", name, corrupt)
    assert run_cli(["data", "info", str(data)]) == 2
    err = capsys.readouterr().err
    assert words in err and name in err and "Traceback" not in err


def atspeed_folder(root: Path) -> Path:
    """A tiny valid AtSpeed/LC-Rec folder: 3 users, 4 items of 2 levels."""
    root.mkdir()
    (root / "sequential_train.txt").write_text("1 1 2 3\n2 2 3 4\n3 1 4 2\n")
    (root / "sequential_valid.txt").write_text("1 4\n2 1\n3 3\n")
    (root / "sequential_test.txt").write_text("1 2\n2 4\n3 1\n")
    index = {str(i): [f"<a_{i % 2}>", f"<b_{i}>"] for i in range(4)}
    (root / "index.json").write_text(json.dumps(index))
    return root


def test_the_atspeed_fixture_imports(tmp_path):
    assert (
        run_cli(
            [
                "data",
                "import",
                "atspeed",
                "--path",
                str(atspeed_folder(tmp_path / "src")),
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )


ATSPEED_FAULTS = {
    "train-latin1": ("sequential_train.txt", b"1 1 2 3\n2 2 \xe9 4\n", "sequential_train.txt:2: byte 0xe9"),
    "valid-nul-high": ("sequential_valid.txt", b"1 4\n\xff\xfe2 1\n", "sequential_valid.txt:2: byte 0xff"),
    "test-first-line": ("sequential_test.txt", b"\x80 2\n", "sequential_test.txt:1: byte 0x80"),
    "index-latin1": ("index.json", b'{"0": ["<a_0>", "<b_\xe90>"]}', "index.json: byte"),
}


@pytest.mark.parametrize("fault", sorted(ATSPEED_FAULTS))
def test_non_utf8_atspeed_file_exits_2_with_the_line(fault, tmp_path, capsys):
    name, data, words = ATSPEED_FAULTS[fault]
    src = atspeed_folder(tmp_path / "src")
    (src / name).write_bytes(data)
    code = run_cli(["data", "import", "atspeed", "--path", str(src), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert words in err and "UTF-8" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing half-written


def sweep_file(tmp_path: Path, model: Path, data: Path) -> Path:
    raw = cpu_sweep("preflight", data, model, tmp_path / "results", k=5, widths=[5, 10])
    raw |= {"metric": "recall@5", "eval": {"ks": [5], "max_users": 5, "threads": 1}}
    return write_experiment(tmp_path / "exp.yaml", raw)


@pytest.mark.parametrize("fault", ["weights-truncated", "config-dim", "config-no-codec"])
def test_sweep_preflight_refuses_a_corrupt_checkpoint_before_ray(
    fault, tiny_model_dir, synth_dir, tmp_path, capsys
):
    name, corrupt, words = CHECKPOINT_FAULTS[fault]
    model = corrupt_copy(tiny_model_dir, tmp_path / "model", name, corrupt)
    t0 = time.monotonic()
    code = run_cli(["sweep", str(sweep_file(tmp_path, model, synth_dir)), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert words in err and "Traceback" not in err
    assert time.monotonic() - t0 < 20  # no Ray start, no failing trials
    assert not (tmp_path / "results" / "parquet").exists() and not (tmp_path / "results" / "ray").exists()


def test_sweep_preflight_refuses_a_corrupt_dataset(tiny_model_dir, synth_dir, tmp_path, capsys):
    data = corrupt_copy(synth_dir, tmp_path / "data", "items.parquet", truncate)
    assert run_cli(["sweep", str(sweep_file(tmp_path, tiny_model_dir, data)), "--quiet"]) == 2
    assert "items.parquet: not a readable Parquet file" in capsys.readouterr().err


@pytest.mark.parametrize("fault", ["weights-random", "config-unknown-key"])
def test_serve_preflight_refuses_a_corrupt_checkpoint_before_ray(
    fault, tiny_model_dir, synth_dir, tmp_path, capsys
):
    name, corrupt, words = CHECKPOINT_FAULTS[fault]
    model = corrupt_copy(tiny_model_dir, tmp_path / "model", name, corrupt)
    code = run_cli(["serve", "--model", str(model), "--data", str(synth_dir), "--port", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert words in err and "deployment failed" not in err
