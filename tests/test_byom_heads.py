"""NEZHA / MTP heads on an imported frozen backbone (issue 32, item 4): `genrec train --objective nezha
--init MODEL --data D` on a tiny imported Qwen3-family checkpoint whose LC-Rec tokens spell the dataset's
items (string order, so no level is a contiguous id range). Only the head trains: the backbone tensors
are the import's, bit for bit; the result loads as an imported checkpoint (template prompts, SID table)
and the head decoder returns only cold-start items under `constraint=cold_start`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hf_models import build_hf, import_args, synth_with_hf, transformers_or_skip, write_index

transformers_or_skip()

from genrec.platform.cli import main  # noqa: E402
from genrec.workloads.decoding.base import get_decoder, make_params  # noqa: E402
from genrec.workloads.evaluation import load_context  # noqa: E402
from genrec.workloads.models.checkpoint import load_checkpoint, model_tensors  # noqa: E402


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main(args)
    return int(e.value.code or 0), capsys.readouterr().err


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(root, dataset folder, imported checkpoint folder): LC-Rec tokens for the dataset's used codes."""
    root = tmp_path_factory.mktemp("heads")
    _, codes, used = synth_with_hf(root, users=60, items=50, codebook=12)
    build_hf("qwen3", root / "hf", layers=1, sid=used)
    write_index(codes, root / "index.json")
    with pytest.raises(SystemExit) as e:
        main(import_args(root / "hf", root / "index.json", root / "m"))
    assert e.value.code in (0, None)
    return root, root / "d", root / "m"


def train_args(data, init, out, objective: str = "nezha") -> list[str]:
    args = ["train", "--objective", objective, "--init", str(init), "--data", str(data), "--out", str(out)]
    return args + ["--epochs", "1", "--max-steps", "6", "--batch-size", "16", "--device", "cpu", "--quiet"]


@pytest.mark.parametrize("objective", ["nezha", "mtp"])
def test_a_head_trains_on_the_frozen_backbone_and_decodes_cold_start(imported, tmp_path, capsys, objective):
    root, data, init = imported
    assert not init.joinpath("config.json").read_text().count('"head"')
    code, err = run_cli(train_args(data, init, tmp_path / "h", objective), capsys)
    assert code == 0, err
    before, after = load_checkpoint(init), load_checkpoint(tmp_path / "h")
    assert after.head is not None and after.head.config.kind == objective
    old, new = model_tensors(before.model), model_tensors(after.model)
    assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old), "backbone frozen"
    meta = json.loads((tmp_path / "h" / "config.json").read_text())
    assert meta["hf"]["family"] == "qwen3" and meta["train"]["head_batching"] == "per_example"
    assert meta["num_parameters"] == sum(p.numel() for p in after.head.parameters()), "the head only"
    ctx, ds, _ = load_context(tmp_path / "h", None, "cpu")  # the dataset the run names
    assert ctx.imported is not None and ctx.codec.table.contiguous_range(0) is None
    hist = [ex.history for ex in ds.eval_examples("test")][:8]
    cold = set(np.flatnonzero(ctx.popularity == 0).tolist())
    assert cold, "the synthetic data has cold-start items"
    dec = get_decoder(objective)
    res = dec.decode(ctx, hist, make_params(dec, {"k": 5, "beam_width": 8, "constraint": "cold_start"}))
    found = torch.isfinite(res.scores)
    assert bool(found.any()) and torch.equal(res.valid, found), "invalid rate 0"
    assert set(res.item_ids[res.valid].tolist()) <= cold
    plain = dec.decode(ctx, hist, make_params(dec, {"k": 5, "beam_width": 8}))
    assert torch.equal(plain.valid, torch.isfinite(plain.scores)), "verified: every returned SID an item"
    assert_decoding_reads_the_states_training_read(ctx, hist, plain, tmp_path / "h")


def assert_decoding_reads_the_states_training_read(ctx, hist, res, folder) -> None:
    """The decoder's scores are the head's log p(SID) on the states training computes (its prompts and
    placeholders), so training and decoding feed the backbone the same tokens."""
    from genrec.workloads.models.nezha_head import append_placeholders, head_states, sid_log_prob
    from genrec.workloads.training.imported_init import frozen_backbone, load_init

    head, cfg = ctx.draft_head, ctx.draft_head.config
    assert cfg.placeholder_ids == (ctx.imported.pad_id,) * ctx.codec.levels or cfg.kind == "mtp"
    fb = frozen_backbone(load_init(folder, torch.device("cpu")), ctx.item_codes, ctx.max_items)
    tokens, mask = fb.prompts(hist)
    if cfg.needs_placeholders:
        tokens, mask = append_placeholders(tokens, mask, list(fb.placeholder_ids))
    with torch.no_grad():
        states = head_states(ctx.model.hidden_states(tokens, mask), cfg).float()
        found = torch.isfinite(res.scores[:, 0])  # a user whose drafts all failed verification: none
        want = sid_log_prob(head, states[found], res.codes[found, 0])
    assert bool(found.any())
    torch.testing.assert_close(res.scores[found, 0], want, atol=1e-4, rtol=1e-4)


def test_the_head_learns_from_the_history(imported, tmp_path, capsys):
    """More steps lower the head's validation loss below where it started (the head reads states)."""
    root, data, init = imported
    args = train_args(data, init, tmp_path / "h")
    for flag, value in (("--max-steps", "0"), ("--epochs", "3"), ("--batch-size", "64")):
        args[args.index(flag) + 1] = value
    args += ["--warmup-steps", "0", "--patience", "3"]
    assert run_cli(args, capsys)[0] == 0
    history = json.loads((tmp_path / "h" / "config.json").read_text())["history"]
    assert len(history) >= 2 and history[-1]["val_loss"] < history[0]["val_loss"], history


@pytest.mark.parametrize(
    ("objective", "init_of", "needle"),
    [("next_item", "m", "--objective nezha or mtp"), ("nezha", "d", "config.json")],
)
def test_init_refusals_exit_2_with_one_line(imported, tmp_path, capsys, objective, init_of, needle):
    root, data, _ = imported
    code, err = run_cli(train_args(data, root / init_of, tmp_path / "h", objective), capsys)
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "h").exists()


def test_init_refuses_a_dataset_the_sid_table_cannot_spell(imported, tmp_path, capsys):
    root, _, init = imported
    synth = ["data", "synth", "--out", str(tmp_path / "d"), "--num-users", "30", "--num-items", "40"]
    synth += ["--levels", "3", "--codebook-size", "9", "--num-clusters", "3", "--num-subclusters", "2"]
    assert run_cli(synth, capsys)[0] == 0
    code, err = run_cli(train_args(tmp_path / "d", init, tmp_path / "h"), capsys)
    assert code == 2 and err.count("\n") == 1 and "dataset" in err, err
