"""Training and evaluation end to end on a small synthetic dataset, through the library and the CLI."""

import json
import math

import numpy as np
import pytest
from conftest import run_cli

from genrec.workloads.decoding.base import ItemIndex
from genrec.workloads.errors import UserInputError
from genrec.workloads.evaluation import EvalConfig, evaluate, load_context
from genrec.workloads.models.checkpoint import load_checkpoint
from genrec.workloads.training.train_config import TrainConfig
from genrec.workloads.training.trainer import lr_at, train


def test_training_lowers_validation_loss_and_keeps_the_best(tiny_model_dir):
    ckpt = load_checkpoint(tiny_model_dir)
    hist = ckpt.meta["history"]
    assert len(hist) >= 2 and hist[-1]["val_loss"] < hist[0]["val_loss"]
    assert ckpt.meta["best_val_loss"] == pytest.approx(min(h["val_loss"] for h in hist))
    assert ckpt.meta["train"]["model_size"] == "tiny" and ckpt.meta["train_seconds"] > 0


def test_trained_beam_search_beats_most_popular(tiny_model_dir):
    ctx, ds, _ = load_context(tiny_model_dir, None, "cpu")
    beam = evaluate(ctx, ds, EvalConfig(decoder="beam", params={"beam_width": 10}), progress=False).row
    pop = evaluate(ctx, ds, EvalConfig(decoder="popular"), progress=False).row
    assert beam.quality["hr@10"] > pop.quality["hr@10"] + 0.05
    assert beam.quality["recall@10"] > pop.quality["recall@10"]
    assert 0 <= beam.quality["invalid_rate"] < 0.5
    assert beam.latency_ms["p50"] > 0 and beam.users == len(ds.eval_examples("test"))
    flat = beam.to_flat()
    assert flat["param_beam_width"] == 10 and "time_prefill_ms" in flat and "torch_version" in flat


def test_eval_reports_invalid_rate_against_the_catalogue(tiny_model_dir):
    ctx, ds, _ = load_context(tiny_model_dir, None, "cpu")
    # keep only 20 items as valid SIDs: beams now often land on SIDs that are no longer items
    ctx.index = ItemIndex(ctx.codec, ctx.item_codes[:20])
    out = evaluate(ctx, ds, EvalConfig(params={"beam_width": 10}, max_users=20), progress=False)
    flags = np.array([[i >= 0 for i in r] for r in out.ranked])
    assert 0 < out.row.quality["invalid_rate"] == pytest.approx(1 - flags.mean())
    assert all(i < 20 for r in out.ranked for i in r)


def test_eval_counts_missing_slots_apart_from_invalid_ones(tiny_model_dir):
    from genrec.workloads.decoding import static as _static  # noqa: F401  (registers the decoder)

    ctx, ds, _ = load_context(tiny_model_dir, None, "cpu")
    # 3 allowed items but k = 10: STATIC returns 3 valid items per user and flags 7 slots missing
    params = {"beam_width": 10, "constraint": "random", "constraint_size": 3}
    row = evaluate(ctx, ds, EvalConfig(decoder="static", params=params, max_users=8), progress=False).row
    assert row.quality["invalid_rate"] == 0.0
    assert row.quality["missing_rate"] == pytest.approx(0.7)
    assert row.quality["users_with_k_valid"] == 0.0  # nobody can get 10 items out of 3


def test_learning_rate_schedule_warms_up_then_decays():
    cfg = TrainConfig(warmup_steps=10, min_lr_ratio=0.1)
    lrs = [lr_at(s, 100, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(0.1, abs=0.01) and math.isclose(max(lrs), 1.0)


def test_train_rejects_bad_config_without_writing(synth_dir, tmp_path):
    with pytest.raises(UserInputError, match="model_size"):
        train(synth_dir, tmp_path / "m", TrainConfig(model_size="huge"), progress=False)
    with pytest.raises(UserInputError, match="batch_size"):
        train(synth_dir, tmp_path / "m", TrainConfig(batch_size=0), progress=False)
    assert list(tmp_path.iterdir()) == []


def test_cli_train_and_eval(synth_dir, tmp_path, capsys):
    out = tmp_path / "m"
    assert run_cli(["train", "--data", str(synth_dir), "--out", str(out), "--epochs", "1", "--quiet"]) == 0
    assert (out / "model.safetensors").is_file()
    rows = tmp_path / "rows.jsonl"
    code = run_cli(
        ["eval", "--model", str(out), "--beam-width", "5", "--k", "1", "5", "--quiet", "--output", str(rows)]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "hr@5" in text and "popular" in text
    header = next(line for line in text.splitlines() if line.startswith("decoder "))
    assert header.index("recall@1") < header.index("hr@1") < header.index("p50 ms")  # quality first
    assert "beam_width=5" in text and "constraint=" not in text  # only what differs from the defaults
    assert len(max(text.splitlines(), key=len)) < 200
    lines = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [r["decoder"] for r in lines] == ["beam", "popular"] and lines[0]["decoder_params"][
        "beam_width"
    ] == 5


@pytest.mark.parametrize(
    "argv, message",
    [
        (["eval", "--model", "/nonexistent"], "not a genrec checkpoint"),
        (["train", "--data", "/nonexistent", "--out", "/tmp/x"], "no such dataset folder"),
    ],
)
def test_cli_bad_input_exits_2(argv, message, capsys):
    assert run_cli(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_eval_bad_decoder_and_params(tiny_model_dir, capsys):
    assert run_cli(["eval", "--model", str(tiny_model_dir), "--decoder", "nope"]) == 2
    assert "choose one of" in capsys.readouterr().err
    assert run_cli(["eval", "--model", str(tiny_model_dir), "--beam-width", "3", "--k", "5"]) == 2
    assert "is larger than the beam width (3)" in capsys.readouterr().err
    assert run_cli(["eval", "--model", str(tiny_model_dir), "--param", "nonsense"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err
