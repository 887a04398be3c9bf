"""One typed parameter path: the same bad decoder parameter gets the same message from a YAML
experiment, `genrec eval --param` and POST /recommend (parsed directly: no Ray, no model)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from genrec.platform.experiment_loading import load_experiment
from genrec.platform.params import (
    ParamError,
    cli_values,
    describe_parameters,
    eval_params,
    parse_decoder_params,
)
from genrec.platform.serve.config import ConstraintFields
from genrec.platform.serve.requests import Limits, RequestError, parse_recommend
from genrec.workloads.decoding.params import CONSTRAINT_RULES, BackboneBeamParams
from genrec.workloads.errors import UserInputError

BEAM_NAMES = sorted(f.name for f in fields(BackboneBeamParams))  # beam's Params

# (values, the message every entry point gives); k and beam_width default to 10 everywhere below:
# the eval defaults for K in [5, 10] and the deployment's served defaults
BAD = [
    ({"k": 50}, "`k` (50) is larger than the beam width (10); ask for beam_width >= 50"),
    ({"beam_width": 0}, "`beam_width` must be >= 1, got 0"),
    ({"colour": "red"}, f"decoder 'beam' has no parameter 'colour'; valid: {BEAM_NAMES}"),
    ({"beam_width": "ten"}, "`beam_width` takes an int, got 'ten' (str)"),
    (
        {"constraint": "bogus"},
        f"`constraint` 'bogus' is not a constraint rule; choose one of {list(CONSTRAINT_RULES)}",
    ),
    ({"constraint": "random"}, "`constraint` 'random' needs constraint_size >= 1"),
]


def limits(**kw) -> Limits:
    base = {
        "num_items": 100,
        "max_history": 5,
        "max_k": 100,
        "history_policy": "truncate",
        "decoders": ("beam", "popular"),
        "default_decoder": "beam",
        "defaults": {
            "beam": parse_decoder_params("beam", {}),
            "popular": parse_decoder_params("popular", {}),
        },
        "constraint_sets": {"cold": ConstraintFields("cold_start")},
        "unavailable_sets": {"all": "no GPU memory left"},
    }
    return Limits(**{**base, **kw})


def http_message(body: dict, lim: Limits | None = None) -> str:
    with pytest.raises(RequestError) as e:
        parse_recommend(json.dumps(body).encode(), lim or limits())
    assert e.value.status == 422
    return e.value.message


def yaml_message(tmp_path: Path, values: dict) -> str:
    raw = {
        "name": "params",
        "dataset": {"path": str(tmp_path / "data")},
        "model": {"checkpoint": str(tmp_path / "model")},
        "decoder": "beam",
        "params": values,
        "eval": {"ks": [5, 10]},
        "tracking": {"results_dir": str(tmp_path / "results")},
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserInputError) as e:
        load_experiment(path, check_files=False)
    return str(e.value)


def cli_message(tmp_path: Path, values: dict, capsys) -> str:
    argv = ["eval", "--model", str(tmp_path / "no-model"), "--no-baseline"]
    for name, value in values.items():
        argv += ["--param", f"{name}={value}"]  # the YAML text of the value, as a user types it
    capsys.readouterr()
    assert run_cli(argv) == 2  # refused before the model is loaded (there is none)
    captured = capsys.readouterr()
    return captured.err + captured.out


@pytest.mark.parametrize("values,message", BAD, ids=[json.dumps(v) for v, _ in BAD])
def test_same_bad_parameter_same_message_from_yaml_cli_and_http(tmp_path, capsys, values, message):
    assert http_message({"history": [1, 2], "params": values}) == message
    assert message in yaml_message(tmp_path, values)
    assert message in cli_message(tmp_path, values, capsys)


def test_top_level_shorthands_are_the_same_parameters():
    assert http_message({"history": [1], "k": 50}) == BAD[0][1]
    assert http_message({"history": [1], "constraint": "random"}) == BAD[-1][1]
    assert "given twice" in http_message({"history": [1], "k": 5, "params": {"k": 6}})
    # typed by the adapter, not pydantic's request model: the same words as YAML and CLI
    assert http_message({"history": [1], "beam_width": "ten"}) == "`beam_width` takes an int, got 'ten' (str)"


def test_k_above_the_default_beam_width_is_never_widened_silently():
    job = parse_recommend(b'{"history": [1], "k": 20, "beam_width": 20}', limits())
    assert (job.k, job.params.beam_width) == (20, 20)
    wide = limits(defaults={"beam": parse_decoder_params("beam", {"beam_width": 30})})
    assert parse_recommend(b'{"history": [1], "k": 20}', wide).params.beam_width == 30
    with pytest.raises(ParamError, match="larger than the beam width"):
        eval_params("beam", {"k": 50}, (5, 10))


def test_strict_types_and_yaml_scalars_on_the_command_line():
    assert cli_values(["k=50", "constraint=cold_start", "verify=none", "constraint_path=a=b.npy"]) == {
        "k": 50,
        "constraint": "cold_start",
        "verify": "none",
        "constraint_path": "a=b.npy",
    }
    for bad in (["k"], ["=3"], ["k=1", "k=2"]):
        with pytest.raises(UserInputError, match="--param"):
            cli_values(bad)
    for value in (True, 5.0, "5", None):  # no silent coercion, whatever the entry point
        with pytest.raises(ParamError, match="`k` takes an int") as e:
            parse_decoder_params("beam", {"k": value})
        assert e.value.param == "k"


@pytest.mark.parametrize("decoder", ["beam", "nezha", "mtp", "static"])
def test_every_beam_based_decoder_takes_a_constraint(decoder):
    params = eval_params(decoder, cli_values(["constraint=cold_start"]), (5, 10))
    assert params.constraint == "cold_start" and (params.k, params.beam_width) == (10, 10)
    with pytest.raises(AttributeError):  # frozen: what was validated is what is decoded
        params.k = 3
    assert "constraint" in [p.name for p in describe_parameters(decoder)]


def test_named_sets_and_unbuilt_constraints_over_http():
    job = parse_recommend(b'{"history": [1], "constraint": "cold"}', limits())
    assert (job.decoder, job.params.constraint) == ("beam", "cold_start")
    same = parse_recommend(b'{"history": [3], "params": {"constraint": "cold_start"}}', limits())
    assert same.group == job.group  # the set and its rule are the same Params: one batch group
    assert "unavailable here: no GPU memory left" in http_message({"history": [1], "constraint": "all"})
    assert "not built on this deployment" in http_message(
        {"history": [1], "constraint": "random", "params": {"constraint_size": 5}}
    )
    assert "fixes ['constraint_seed']" in http_message(
        {"history": [1], "constraint": "cold", "params": {"constraint_seed": 3}}
    )
    assert "has no parameter 'constraint'" in http_message(
        {"history": [1], "decoder": "popular", "constraint": "cold"}
    )
    assert "renamed `constraint`" in http_message({"history": [1], "constraint_set": "cold"})
    assert "`k` must be between 1 and 100" in http_message({"history": [1], "k": 200, "beam_width": 200})


def test_genrec_decoders_lists_types_and_defaults(capsys):
    assert run_cli(["decoders"]) == 0
    out = capsys.readouterr().out
    assert "constraint: str = 'none'" in out and "k: int = 10" in out


@pytest.fixture(scope="module")
def nezha_model_dir(synth_dir, tmp_path_factory) -> Path:
    from genrec.workloads.training.train_config import TrainConfig
    from genrec.workloads.training.trainer import train

    out = tmp_path_factory.mktemp("models") / "nezha"
    cfg = TrainConfig(
        model_size="tiny", epochs=1, batch_size=64, warmup_steps=10, max_items=5, objective="nezha"
    )
    train(synth_dir, out, cfg, progress=False)
    return out


@pytest.mark.parametrize("decoder", ["beam", "nezha"])
def test_eval_cli_decodes_with_a_constraint(decoder, tiny_model_dir, nezha_model_dir, synth_dir, capsys):
    from genrec.workloads.data.dataset import load_dataset

    model = tiny_model_dir if decoder == "beam" else nezha_model_dir
    out_file = model.parent / f"{decoder}-cold.jsonl"
    argv = ["eval", "--model", str(model), "--decoder", decoder, "--param", "constraint=cold_start"]
    argv += ["--max-users", "8", "--no-baseline", "--quiet", "--device", "cpu", "--output", str(out_file)]
    assert run_cli(argv) == 0, capsys.readouterr().err
    row = json.loads(out_file.read_text().splitlines()[0])
    assert row["decoder"] == decoder and row["decoder_params"]["constraint"] == "cold_start"
    assert row["quality"]["invalid_rate"] == 0.0  # every returned SID is a (cold-start) catalogue item
    cold = int((load_dataset(synth_dir).item_popularity("train") == 0).sum())
    assert cold > 0
