"""`hf:DIR` wherever a model is named (issue 32): the HF folder is imported once into a cache keyed by its
content (models/hf_cache.py), with the items' SIDs of the command's data set. Evaluating `hf:DIR` gives
the result rows of the same folder imported by hand; a second use reuses the cache, a rewritten weight
file invalidates it; bad `hf:` paths exit 2 with one line and leave no cache entry; serve, sweep
experiments, the benchmark drivers and `--init` resolve it through the same function."""

from __future__ import annotations

import argparse
import json
import re

import numpy as np
import pytest
from hf_models import build_hf, synth_with_hf, transformers_or_skip

transformers_or_skip()

from safetensors.torch import load_file, save_file  # noqa: E402

from genrec.platform.cli import main  # noqa: E402
from genrec.workloads.errors import UserInputError  # noqa: E402
from genrec.workloads.models.hf_cache import CACHE_ENV, cached_import  # noqa: E402

VOLATILE = (
    "model",
    "run_id",
    "created_at",
    "latency_ms",
    "timings_ms",
    "throughput_users_per_s",
    "env",
    "memory_peak_mb",
)


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(args)
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out, out.err


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(root, dataset folder, HF folder whose LC-Rec tokens spell the dataset, its import by hand)."""
    root = tmp_path_factory.mktemp("hfspec")
    _, _, used = synth_with_hf(root, users=40, items=30, codebook=8)
    build_hf("qwen3", root / "hf", layers=1, sid=used)
    build_hf("llama", root / "lm_plain", layers=1, sid=[])  # a pretrained LM: no SID tokens to find
    args = ["model", "import", "hf", "--path", str(root / "hf"), "--items", str(root / "d" / "items.parquet")]
    with pytest.raises(SystemExit) as e:
        main([*args, "--out", str(root / "m")])
    assert e.value.code in (0, None)
    return root, root / "d", root / "hf", root / "m"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def entries(cache) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def eval_rows(model: str, data, out, capsys) -> tuple[list[dict], str]:
    args = [
        "eval",
        "--model",
        model,
        "--data",
        str(data),
        "--max-users",
        "16",
        "--beam-width",
        "5",
        "--k",
        "5",
    ]
    args += ["--device", "cpu", "--quiet", "--output", str(out)]
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    return [json.loads(line) for line in out.read_text().splitlines()], err


def test_eval_on_hf_dir_gives_the_rows_of_the_pre_imported_model(world, cache, tmp_path, capsys):
    _, data, hf, pre = world
    ours, err = eval_rows(f"hf:{hf}", data, tmp_path / "a.jsonl", capsys)
    assert err.count("importing hf:") == 1 and "(first use)" in err, err
    theirs, _ = eval_rows(str(pre), data, tmp_path / "b.jsonl", capsys)
    assert len(ours) == len(theirs) == 2  # beam and the popular baseline
    for a, b in zip(ours, theirs):
        assert {k: v for k, v in a.items() if k not in VOLATILE} == {
            k: v for k, v in b.items() if k not in VOLATILE
        }
    assert ours[0]["backbone"]["family"] == "qwen3" and ours[0]["backbone"]["architecture"]
    assert ours[0]["quality"]["invalid_rate"] == 0.0


def test_the_cache_is_reused_and_a_rewritten_weight_file_invalidates_it(world, cache, tmp_path, capsys):
    import shutil

    _, data, hf, _ = world
    src = tmp_path / "hf"
    shutil.copytree(hf, src)
    first = cached_import(f"hf:{src}", data)
    assert first.imported and "importing hf:" in capsys.readouterr().err
    again = cached_import(f"hf:{src}", data)
    assert not again.imported and again.folder == first.folder, "unchanged folder: reused"
    assert "importing" not in capsys.readouterr().err, "no progress line when nothing is imported"
    weights = src / "model.safetensors"
    state = load_file(weights)
    name = sorted(state)[0]
    state[name] = state[name] + 1.0  # same size and header, new content (and mtime)
    save_file(state, str(weights), {"format": "pt"})
    changed = cached_import(f"hf:{src}", data)
    assert changed.imported and changed.folder != first.folder
    assert len(entries(cache)) == 2, entries(cache)


@pytest.mark.parametrize(
    ("model", "data", "needle"),
    [
        ("hf:{root}/nowhere", True, "no config.json"),
        ("hf:{hf}", False, "pass --data D"),
        ("hf:{lm}", True, "holds no SID tokens"),
    ],
)
def test_bad_hf_paths_exit_2_with_one_line(world, cache, capsys, model, data, needle):
    root, d, hf, _ = world
    lm = root / "lm_plain"
    capsys.readouterr()
    args = ["eval", "--model", model.format(root=root, hf=hf, lm=lm), "--device", "cpu", "--quiet"]
    code, _, err = run_cli(args + (["--data", str(d)] if data else []), capsys)
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert entries(cache) == [], "nothing cached"


def test_a_failed_import_leaves_no_cache_entry(world, cache, tmp_path, capsys):
    _, _, hf, _ = world
    other = ["data", "synth", "--out", str(tmp_path / "d2"), "--num-users", "30", "--num-items", "20"]
    other += ["--levels", "3", "--codebook-size", "12", "--num-clusters", "12", "--num-subclusters", "2"]
    assert run_cli(other, capsys)[0] == 0
    args = ["eval", "--model", f"hf:{hf}", "--data", str(tmp_path / "d2"), "--device", "cpu", "--quiet"]
    code, _, err = run_cli(args, capsys)
    progress, line = err.splitlines()  # the import started, then refused codes it cannot spell
    assert code == 2 and progress.startswith("importing hf:") and line.startswith("error: --model hf:"), err
    assert [p for p in cache.rglob("*") if not p.name.startswith(".")] == [], "nothing half-written"


def test_serve_sweep_drivers_and_init_resolve_through_the_cache(world, cache, tmp_path, capsys):
    from genrec.platform.commands.serve import resolve_served_models
    from genrec.platform.experiment_loading import experiment_from_dict
    from genrec.studies.common.options import resolve_model_flags

    _, data, hf, _ = world
    folder = cached_import(f"hf:{hf}", data).folder
    capsys.readouterr()
    overrides = {"model": None, "draft": f"hf:{hf}", "data": str(data)}
    args = {"model": f"hf:{hf}"}
    resolve_served_models(args, overrides)
    assert overrides["model"] == overrides["draft"] == str(folder)
    raw = {
        "name": "x",
        "dataset": {"path": str(data)},
        "model": {"checkpoint": f"hf:{hf}"},
        "decoder": "beam",
    }
    assert experiment_from_dict(raw, base_dir=tmp_path).model.checkpoint == folder
    ns = argparse.Namespace(model=f"hf:{hf}", data=str(data))
    resolve_model_flags(ns)
    assert ns.model == str(folder)
    with pytest.raises(UserInputError, match="pass --data D"):
        resolve_model_flags(argparse.Namespace(model=f"hf:{hf}", data=None))
    train = ["train", "--objective", "nezha", "--init", f"hf:{hf}", "--data", str(data), "--out"]
    train += [str(tmp_path / "h"), "--epochs", "1", "--max-steps", "2", "--device", "cpu", "--quiet"]
    code, _, err = run_cli(train, capsys)
    assert code == 0 and "importing" not in err, err  # the import above, reused
    meta = json.loads((tmp_path / "h" / "config.json").read_text())
    assert meta["init"] == str(folder) and meta["hf"]["family"] == "qwen3"
    assert np.isfinite(meta["best_val_loss"])


def test_serve_refuses_a_bad_hf_path_before_ray_starts(world, cache, capsys):
    _, data, _, _ = world
    code, _, err = run_cli(["serve", "--model", "hf:/nowhere/at/all", "--data", str(data)], capsys)
    assert code == 2 and err.count("\n") == 1 and "--model (or args.model) hf:/nowhere" in err, err
    assert entries(cache) == []


def test_a_sweep_checks_a_draft_against_an_imported_targets_sid_table(world, cache, tmp_path):
    """An imported target's SID table may skip codes no item uses, so its sizes differ from the data
    set's: a sweep's draft is checked against the table (an imported draft with the same SID tokens
    passes), not against the data set."""
    from genrec.platform.experiment_checks import check_inputs
    from genrec.platform.experiment_loading import experiment_from_dict

    _, data, _, imported = world
    table_sizes = json.loads((imported / "config.json").read_text())["codec"]["codebook_sizes"]
    data_sizes = json.loads((data / "manifest.json").read_text())["codebook_sizes"]
    assert table_sizes != data_sizes  # the case: 25 % of levels 2 and 3 used

    def experiment(draft) -> object:
        raw = {"name": "x", "dataset": {"path": str(data)}, "model": {"checkpoint": str(imported)}}
        return experiment_from_dict(
            {**raw, "decoder": "atspeed_strict", "draft": str(draft)}, base_dir=tmp_path
        )

    check_inputs(experiment(imported))  # the import as its own draft: same table
    foreign = tmp_path / "ours_on_data"  # a draft on the data set's sizes (config.json is all it reads)
    foreign.mkdir()
    (foreign / "model.safetensors").write_bytes(b"")
    (foreign / "config.json").write_text(json.dumps({"codec": {"codebook_sizes": data_sizes}}))
    with pytest.raises(UserInputError, match=re.escape(f"but the model {imported} has {table_sizes}")):
        check_inputs(experiment(foreign))


def test_the_key_reads_the_items_sids_not_their_file_layout(world, tmp_path):
    """The items' SIDs are keyed by content: the same table written with other row groups keeps the key,
    one changed code changes it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from genrec.workloads.models.hf_cache import cache_key

    _, data, hf, _ = world
    table = pq.read_table(data / "items.parquet")
    pq.write_table(table, tmp_path / "split.parquet", row_group_size=7)
    assert cache_key(hf, tmp_path / "split.parquet", "lcrec") == cache_key(
        hf, data / "items.parquet", "lcrec"
    )
    sids = table.column("sid").to_pylist()
    sids[3] = [sids[3][0], sids[3][1], sids[3][2] + 1]
    changed = table.set_column(
        table.schema.get_field_index("sid"), "sid", pa.array(sids, table.schema.field("sid").type)
    )
    pq.write_table(changed, tmp_path / "changed.parquet")
    assert cache_key(hf, tmp_path / "changed.parquet", "lcrec") != cache_key(
        hf, data / "items.parquet", "lcrec"
    )


def test_a_config_deployed_with_ray_serve_deploy_resolves_hf(world, cache):
    """Ray's own `serve deploy FILE` calls build_app with the file's args: hf:DIR resolves there too."""
    pytest.importorskip("ray.serve")
    from genrec.platform.serve.app import build_app

    _, data, hf, _ = world
    app = build_app({"model": f"hf:{hf}", "data": str(data), "device": "cpu"})
    bound = app._bound_deployment.init_args[0]
    assert bound["model"] == str(cached_import(f"hf:{hf}", data).folder)


def test_simultaneous_uses_import_once(world, cache, capsys):
    """Two users of one hf:DIR at once (threads here; flock holds between processes alike): one imports,
    the other waits for it and reuses the entry."""
    from concurrent.futures import ThreadPoolExecutor

    _, data, hf, _ = world
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda _: cached_import(f"hf:{hf}", data), range(2)))
    assert done[0].folder == done[1].folder
    assert sorted(d.imported for d in done) == [False, True]
    assert capsys.readouterr().err.count("importing") == 1
