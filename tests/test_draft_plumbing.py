"""AtSpeed's draft model reaches every place a decoder runs: `load_context` (eval, trials, replicas),
`genrec eval --draft`, an experiment's `draft:`, Serve's `draft:` / `genrec serve --draft`; a draft
that does not fit its target is refused with a message naming both. No Ray here.

The plumbing is exercised with `beam` plus a draft (the draft is loaded and recorded, not read) and with
the atspeed decoders, which declare the draft they need on their class (decoding/needs.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from genrec.workloads.errors import UserInputError

# a draft on another codec than the synth fixture's (3 levels of 8 codes)
OTHER_CODEC = (8, 8, 16)


def make_draft(out: Path, target_dir: Path, size: str = "tiny", codec=None, max_seq_len=None) -> Path:
    """An untrained checkpoint beside the target (weights do not matter to the plumbing): `size`,
    `codec` and `max_seq_len` default to the target's."""
    from genrec.workloads.models.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
    from genrec.workloads.models.model_config import model_config_for
    from genrec.workloads.models.transformer import GRTransformer
    from genrec.workloads.sid_codec import SIDCodec

    target = load_checkpoint(target_dir)
    codec = SIDCodec(codec) if codec is not None else target.codec
    seq = max_seq_len or target.model.config.max_seq_len
    model = GRTransformer(model_config_for(size, codec.vocab_size, seq))
    meta = {"dataset": target.meta["dataset"], "target": str(target_dir)}
    return save_checkpoint(out, Checkpoint(model, codec, target.max_items, meta))


# ---- load_context ------------------------------------------------------------------------------
def test_load_context_loads_a_draft_on_the_same_codec(tiny_model_dir, synth_dir):
    from genrec.workloads.decoding.draft import require_draft
    from genrec.workloads.evaluation import load_context

    ctx, _, _ = load_context(tiny_model_dir, synth_dir, "cpu", draft_dir=tiny_model_dir)
    draft = ctx.draft_model
    assert draft is not None and draft is not ctx.model  # its own copy, even from the same folder
    assert not draft.training and draft.device == ctx.device
    assert require_draft(ctx, "atspeed_strict") is draft
    plain, _, _ = load_context(tiny_model_dir, synth_dir, "cpu")
    assert plain.draft_model is None
    with pytest.raises(UserInputError) as e:
        require_draft(plain, "atspeed_strict")
    assert str(e.value) == (
        "decoder 'atspeed_strict' needs a draft model; pass --draft DIR (any next_item checkpoint on the "
        "same codec, e.g. `genrec train --model tiny ...`)"
    )


def test_a_draft_larger_than_its_target_is_allowed(tiny_model_dir, synth_dir, tmp_path):
    from genrec.workloads.evaluation import load_context

    big = make_draft(tmp_path / "small", tiny_model_dir, size="small")
    ctx, _, _ = load_context(tiny_model_dir, synth_dir, "cpu", draft_dir=big)
    assert ctx.draft_model.config.dim > ctx.model.config.dim


def test_a_draft_on_another_codec_is_refused_naming_both(tiny_model_dir, synth_dir, tmp_path):
    from genrec.workloads.evaluation import load_context

    other = make_draft(tmp_path / "other", tiny_model_dir, codec=OTHER_CODEC)
    with pytest.raises(UserInputError) as e:
        load_context(tiny_model_dir, synth_dir, "cpu", draft_dir=other)
    msg = str(e.value)
    assert str(other) in msg and str(tiny_model_dir) in msg
    assert "codebook sizes [8, 8, 16]" in msg and "[8, 8, 8]" in msg
    assert "train the draft on the same dataset and tokenisation" in msg


def test_a_draft_whose_window_is_shorter_than_the_prompts_is_refused(tiny_model_dir, synth_dir, tmp_path):
    from genrec.workloads.evaluation import load_context

    short = make_draft(tmp_path / "short", tiny_model_dir, max_seq_len=16)
    # refused when the draft checkpoint loads (its own config is checked before any weights)
    with pytest.raises(UserInputError, match="beyond the model.s max_seq_len 16"):
        load_context(tiny_model_dir, synth_dir, "cpu", draft_dir=short)


def test_a_missing_draft_folder_is_named(tiny_model_dir, tmp_path):
    from genrec.workloads.evaluation import load_context

    with pytest.raises(UserInputError, match=r"draft .*nope: not a genrec checkpoint"):
        load_context(tiny_model_dir, None, "cpu", draft_dir=tmp_path / "nope")


# ---- genrec eval --draft -----------------------------------------------------------------------
def test_eval_with_a_draft_records_it_in_the_row(tiny_model_dir, tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    argv = ["eval", "--model", str(tiny_model_dir), "--draft", str(tiny_model_dir), "--max-users", "20"]
    assert run_cli([*argv, "--quiet", "--output", str(rows)]) == 0
    assert f"draft {tiny_model_dir.name}" in capsys.readouterr().out
    lines = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [r["decoder"] for r in lines] == ["beam", "popular"]
    assert {r["draft"] for r in lines} == {tiny_model_dir.name}  # a label, like `model`


def test_rows_without_a_draft_have_an_empty_draft_column(tiny_model_dir, synth_dir):
    from genrec.workloads.evaluation import EvalConfig, evaluate, load_context

    ctx, ds, _ = load_context(tiny_model_dir, synth_dir, "cpu")
    row = evaluate(ctx, ds, EvalConfig(max_users=8, warmup_batches=0), "tiny", progress=False).row
    assert row.draft == "" and row.to_flat()["draft"] == ""


def test_eval_draft_errors_exit_2(tiny_model_dir, tmp_path, capsys):
    model = ["eval", "--model", str(tiny_model_dir)]
    assert run_cli([*model, "--draft", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "nope: not a genrec checkpoint" in err and "genrec train --model tiny" in err
    assert run_cli([*model, "--decoder", "atspeed_strict"]) == 2
    assert "decoder 'atspeed_strict' needs a draft model; pass --draft DIR" in capsys.readouterr().err


# ---- the decoder host (Serve replicas, sweep trials) -------------------------------------------
def test_host_loads_the_draft_and_refuses_atspeed_without_one(tiny_model_dir, synth_dir):
    from genrec.platform.actors import DecoderHost, HostConfig, cached_host

    with pytest.raises(UserInputError, match="'atspeed_strict' needs a draft model"):
        HostConfig(model=str(tiny_model_dir), decoders=("atspeed_strict",)).validate()
    host = DecoderHost(
        HostConfig(
            model=str(tiny_model_dir), data=str(synth_dir), draft=str(tiny_model_dir), warmup_batches=0
        )
    )
    assert host.ctx.draft_model is not None and host.describe()["draft"] == str(tiny_model_dir)
    # a reused trial worker: the same model with another draft (or none) is a different host
    drafted = cached_host(str(tiny_model_dir), str(synth_dir), "cpu", draft=str(tiny_model_dir))
    assert drafted.ctx.draft_model is not None
    assert cached_host(str(tiny_model_dir), str(synth_dir), "cpu", draft=str(tiny_model_dir)) is drafted
    plain = cached_host(str(tiny_model_dir), str(synth_dir), "cpu")
    assert plain is not drafted and plain.ctx.draft_model is None and plain.describe()["draft"] is None


# ---- Serve config ------------------------------------------------------------------------------
def test_serve_config_refuses_atspeed_without_a_draft_and_resolves_the_draft(tmp_path, monkeypatch):
    from genrec.platform.serve.config import parse_serve_config

    with pytest.raises(UserInputError) as e:
        parse_serve_config({"model": "m", "decoders": ["beam", "atspeed_strict"], "defaults": {}})
    assert "decoder 'atspeed_strict' needs a draft model; set `draft: DIR`" in str(e.value)
    monkeypatch.chdir(tmp_path)
    cfg = parse_serve_config({"model": "m", "draft": "d"}).resolved()
    assert cfg.draft == tmp_path / "d"
    assert parse_serve_config({"model": "m"}).resolved().draft is None


def test_serve_checks_the_draft_before_ray_starts(tiny_model_dir, tmp_path, capsys):
    from genrec.platform.serve.config import ServeConfig, check_model_dir

    check_model_dir(ServeConfig(model=tiny_model_dir, draft=tiny_model_dir))
    other = make_draft(tmp_path / "other", tiny_model_dir, codec=OTHER_CODEC)
    with pytest.raises(UserInputError, match=r"codebook sizes \[8, 8, 16\].*same dataset"):
        check_model_dir(ServeConfig(model=tiny_model_dir, draft=other))
    assert run_cli(["serve", "--model", str(tiny_model_dir), "--draft", str(tmp_path / "nope")]) == 2
    assert "nope: not a genrec checkpoint" in capsys.readouterr().err


def test_serve_command_names_the_missing_draft_and_the_serve_keys(tiny_model_dir, capsys):
    # --decoders without a config file keeps only the built-in defaults of the decoders it serves
    assert run_cli(["serve", "--model", str(tiny_model_dir), "--decoders", "atspeed_strict"]) == 2
    assert "'atspeed_strict' needs a draft model; set `draft: DIR` in the config or pass --draft DIR" in (
        capsys.readouterr().err
    )
    from genrec.platform.serve.config import parse_serve_config

    with pytest.raises(
        UserInputError, match=r"unknown key `drafts`; valid keys here: \['model', 'data', 'draft'"
    ):
        parse_serve_config({"model": "m", "drafts": "d"})


def test_shipped_serve_yaml_mentions_the_draft_key():
    from conftest import REPO

    assert "draft:" in (REPO / "serve.yaml").read_text()


# ---- experiment YAML ---------------------------------------------------------------------------
@pytest.fixture
def exp(synth_dir, tiny_model_dir, tmp_path) -> dict:
    return {
        "name": "drafted",
        "dataset": {"path": str(synth_dir)},
        "model": {"checkpoint": str(tiny_model_dir)},
        "draft": str(tiny_model_dir),
        "decoder": "beam",
        "params": {"k": 10},
        "search_space": {"beam_width": {"grid": [10, 20]}},
        "eval": {"max_users": 20},
        "tracking": {"results_dir": str(tmp_path / "results")},
    }


def write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_experiment_with_a_draft_parses_and_reaches_the_trials(exp, tmp_path, tiny_model_dir, monkeypatch):
    from genrec.platform.experiment_loading import experiment_from_dict, load_experiment

    cfg = load_experiment(write(tmp_path, exp))
    assert cfg.draft == tiny_model_dir.resolve() and cfg.num_trials() == 2
    assert cfg.trial_spec(1.0, "cpu").draft == str(tiny_model_dir.resolve())
    plain = copy.deepcopy(exp)
    del plain["draft"]
    plain_cfg = experiment_from_dict(plain)
    assert plain_cfg.trial_spec(1.0, "cpu").draft == ""
    # a changed draft changes every trial (no resume); a draft-free fingerprint keeps its old form
    assert cfg.fingerprint() != plain_cfg.fingerprint() and '"draft":' not in plain_cfg.fingerprint()
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "d").symlink_to(tiny_model_dir)
    monkeypatch.chdir(tmp_path)
    assert experiment_from_dict({**exp, "draft": "models/d"}).draft == tiny_model_dir.resolve()


def test_experiment_dry_run_shows_the_draft(exp, tmp_path, tiny_model_dir, capsys):
    assert run_cli(["sweep", str(write(tmp_path, exp)), "--dry-run"]) == 0
    assert f"draft    {tiny_model_dir.resolve()}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            {"draft": "/nonexistent/draft"},
            ["`draft`", "not a genrec checkpoint", "genrec train --model tiny"],
        ),
        ({"draft": "OTHER"}, ["`draft`", "codebook sizes [8, 8, 16]", "same dataset and tokenisation"]),
        ({"draft": None, "decoder": "atspeed_strict"}, ["`draft`", "needs a draft model", "`draft: DIR`"]),
    ],
    ids=["missing", "other-codec", "atspeed-without-draft"],
)
def test_bad_drafts_fail_validation_with_exit_2(exp, tmp_path, tiny_model_dir, capsys, change, expected):
    raw = copy.deepcopy(exp)
    raw.update(change)
    if raw["draft"] == "OTHER":
        raw["draft"] = str(make_draft(tmp_path / "other", tiny_model_dir, codec=OTHER_CODEC))
    if raw["draft"] is None:
        del raw["draft"]
    assert run_cli(["sweep", str(write(tmp_path, raw))]) == 2
    err = capsys.readouterr().err
    for part in expected:
        assert part in err, (part, err)
    assert not (tmp_path / "results").exists()  # nothing written


def test_benchmark_experiments_take_no_draft():
    from genrec.platform.experiment_loading import experiment_from_dict

    with pytest.raises(UserInputError, match=r"remove \['draft'\]"):
        experiment_from_dict({"name": "b", "benchmark": "static_step", "draft": "d"}, check_files=False)


def test_atspeed_decoders_validate_once_a_draft_is_named(exp, tmp_path, tiny_model_dir):
    from genrec.platform.experiment_loading import experiment_from_dict
    from genrec.platform.serve.config import parse_serve_config
    from genrec.workloads.decoding.base import decoder_names

    if "atspeed_strict" not in decoder_names():
        pytest.skip("the atspeed decoders are not registered in this checkout")
    cfg = parse_serve_config(
        {"model": "m", "draft": "d", "decoders": ["atspeed_strict", "beam"], "defaults": {}}
    )
    assert cfg.decoders[0] == "atspeed_strict"
    raw = {**exp, "decoder": "atspeed_strict", "search_space": {"gamma": {"grid": [1, 2]}}}
    assert experiment_from_dict(raw).trial_spec(1.0, "cpu").draft == str(tiny_model_dir.resolve())
