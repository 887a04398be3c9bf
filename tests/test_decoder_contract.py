"""The contract every registered decoder keeps, parametrised over the registry (not a hand list) and over
the backbone: our tiny random model, and tiny random Qwen3- and Llama-family checkpoints imported with
`genrec model import hf` (hf_models.py; LC-Rec SID tokens in string order, a code without a token).

On each backbone (with the draft model / heads each decoder declares in `needs`): result shapes and
order, missing-slot flags, `constraint=cold_start` honoured (every returned SID a cold-start item), the
same output for the same parameters (seeds included), and a decoder refusing a context that lacks
something it declares with that need's one message (an imported checkpoint as imported has no NEZHA / MTP
head: those decoders refuse it so; with a head on its frozen backbone, fed placeholder ids its vocabulary
already has, they keep the whole contract). Params round-trip
through the YAML / CLI / HTTP parsers with the same message for the same bad value."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hf_models import FAMILIES, build_and_import, item_codes, transformers_or_skip

from genrec.platform.commands.model import decoder_runs
from genrec.platform.experiment_loading import load_experiment
from genrec.platform.params import parse_decoder_params
from genrec.platform.serve.config import ConstraintFields
from genrec.platform.serve.requests import Limits, RequestError, parse_recommend
from genrec.workloads.decoding.base import DecoderContext, decoder_class, decoder_names
from genrec.workloads.decoding.draft import needs_draft
from genrec.workloads.decoding.needs import DRAFT_MODEL, MTP_HEAD, NEZHA_HEAD, POPULARITY, Need
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.checkpoint import load_checkpoint
from genrec.workloads.models.nezha_head import HeadConfig, build_head
from genrec.workloads.models.transformer import GRTransformer, ModelConfig
from genrec.workloads.sid_codec import SIDCodec

CODEC = SIDCodec((4, 4, 4))
DIM, K, HISTORY = 16, 4, 4
HISTORIES = [[0, 1, 2], [3], [4, 5]]
COLD = (1, 6)  # the only items without a train interaction: fewer than K, so slots go missing
KS = (K,)


def random_model(seed: int, dim: int = DIM) -> GRTransformer:
    torch.manual_seed(seed)
    model = GRTransformer(ModelConfig(vocab_size=CODEC.vocab_size, dim=dim, n_layers=1, n_heads=2))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return model.eval()


def random_head(kind: str, bb: Backbone):
    """A head for `bb`; on an imported backbone it names the placeholder ids (its pad id per level)."""
    torch.manual_seed(3)
    sizes = bb.codec.codebook_sizes
    sp = () if bb.imported is None else (bb.imported.pad_id,) * len(sizes)
    head = build_head(HeadConfig(kind, bb.model().config.dim, sizes, placeholder_ids=sp)).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.7)
    return head


@dataclass(frozen=True)
class Backbone:
    """One model the contract runs on, with the catalogue its codec can spell and its AtSpeed draft."""

    kind: str  # "ours" or an HF family
    model: Callable[[], GRTransformer]
    codec: SIDCodec
    items: np.ndarray  # [24, L] item codes
    draft: Callable[[], GRTransformer]
    imported: object = None  # ImportedInputs of an imported checkpoint; None for ours


BACKBONES = ("ours", *FAMILIES)


def ours() -> Backbone:
    rng = np.random.default_rng(0)
    items = CODEC.keys_to_codes(rng.choice(CODEC.num_sids, size=24, replace=False))
    return Backbone("ours", lambda: random_model(0), CODEC, np.asarray(items), lambda: random_model(1, dim=8))


def imported(folders: dict, family: str) -> Backbone:
    from genrec.workloads.models.hf_checkpoint import imported_inputs

    ckpt, draft = load_checkpoint(folders[family], "cpu"), load_checkpoint(folders["draft"], "cpu").model
    items = item_codes(n=24)  # spelled by the SID table (no item at the gap code)
    return Backbone(family, lambda: ckpt.model, ckpt.codec, items, lambda: draft, imported_inputs(ckpt))


@pytest.fixture(scope="module")
def imported_folders(tmp_path_factory):
    transformers_or_skip()
    return build_and_import(tmp_path_factory.mktemp("contract"), layers=1)


@pytest.fixture(scope="module", params=BACKBONES)
def backbone(request) -> Backbone:
    """Each backbone built once per module (the imported ones share one build of their folders)."""
    if request.param == "ours":
        return ours()
    return imported(request.getfixturevalue("imported_folders"), request.param)


# how the test supplies each need a decoder may declare: a new kind of need must be added here
SUPPLY = {
    DRAFT_MODEL: {"draft_model": lambda bb: bb.draft()},
    NEZHA_HEAD: {"draft_head": lambda bb: random_head("nezha", bb)},
    MTP_HEAD: {"draft_head": lambda bb: random_head("mtp", bb)},
    POPULARITY: {},  # every context here has popularity (cold_start reads it); see make_ctx
}


def make_ctx(bb: Backbone, needs: tuple[Need, ...], without: Need | None = None) -> DecoderContext:
    """A context on backbone `bb` with every need in `needs` but `without`."""
    popularity = np.ones(len(bb.items), dtype=np.int64)
    popularity[list(COLD)] = 0
    extra = {}
    for need in needs:
        assert need in SUPPLY, f"no way to supply need {need.key!r} here: add it to SUPPLY"
        if need is not without:
            extra.update({field: make(bb) for field, make in SUPPLY[need].items()})
    if without is POPULARITY:
        popularity = None
    return DecoderContext(bb.model(), bb.codec, bb.items, HISTORY, popularity, imported=bb.imported, **extra)


def has_field(name: str, field: str) -> bool:
    return field in {f.name for f in fields(decoder_class(name).Params)}


def contract_params(name: str, constraint: str | None = None):
    values = {"k": K}
    if has_field(name, "beam_width"):
        values["beam_width"] = K
    if constraint is not None:
        values["constraint"] = constraint
    return parse_decoder_params(name, values)


def decode(bb: Backbone, name: str, params, ctx: DecoderContext | None = None):
    ctx = ctx or make_ctx(bb, decoder_class(name).needs)
    return decoder_class(name)().decode(ctx, HISTORIES, params)


def check_missing_flags(res) -> torch.Tensor:
    """Slots without an SID: score -inf, codes -1, item -1, not valid, counted as missing."""
    missing = ~torch.isfinite(res.scores)
    assert bool((res.codes[missing] == -1).all()) and bool((res.item_ids[missing] == -1).all())
    assert not bool(res.valid[missing].any())
    assert res.counters.get("missing", 0) == int(missing.sum())
    return missing


NAMES = decoder_names()


@pytest.mark.parametrize("name", NAMES)
def test_result_shapes_order_and_missing_flags(backbone, name):
    res = decode(backbone, name, contract_params(name))
    b, levels = len(HISTORIES), CODEC.levels
    assert res.codes.shape == (b, K, levels) and res.scores.shape == (b, K)
    assert res.item_ids.shape == (b, K) and res.valid.shape == (b, K) and res.valid.dtype == torch.bool
    assert all(isinstance(v, float) and v >= 0 for v in res.timings_ms.values())
    missing = check_missing_flags(res)
    found = res.scores.masked_fill(missing, float("-inf"))
    assert bool((found[:, :-1] >= found[:, 1:]).all()), "best first, missing slots last"
    valid_items = res.item_ids[res.valid]
    assert bool((valid_items >= 0).all())
    looked_up = torch.from_numpy(backbone.items)[valid_items]
    assert torch.equal(looked_up, res.codes[res.valid])


@pytest.mark.parametrize("name", NAMES)
def test_cold_start_constraint_is_honoured_or_refused(backbone, name):
    if not has_field(name, "constraint"):
        with pytest.raises(UserInputError, match=f"decoder '{name}' has no parameter 'constraint'"):
            contract_params(name, "cold_start")
        return
    res = decode(backbone, name, contract_params(name, "cold_start"))
    missing = check_missing_flags(res)
    assert torch.equal(res.valid, ~missing), "invalid rate 0: every returned SID is an item"
    assert set(res.item_ids[res.valid].tolist()) <= set(COLD)
    assert int(missing.sum()) >= len(HISTORIES) * (K - len(COLD))


@pytest.mark.parametrize("name", NAMES)
def test_the_same_parameters_give_the_same_output(backbone, name):
    params = contract_params(name)
    a, b = decode(backbone, name, params), decode(backbone, name, params)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scores, b.scores)
    assert torch.equal(a.item_ids, b.item_ids)


@pytest.mark.parametrize("name", NAMES)
def test_a_missing_need_fails_with_its_message(backbone, name):
    needs = decoder_class(name).needs
    params = contract_params(name)
    for need in needs:
        ctx = make_ctx(backbone, needs, without=need)
        with pytest.raises(UserInputError) as e:
            decode(backbone, name, params, ctx)
        assert str(e.value) == need.message(name, ctx)
        assert f"{name}" in str(e.value) and "needs" in str(e.value)
    if not needs:  # nothing beyond the backbone: a bare context decodes
        bare = make_ctx(backbone, (), without=POPULARITY)
        assert decode(backbone, name, params, bare).codes.shape[1] == K


# ---- one parameter path: YAML, CLI and HTTP ----------------------------------------------------------
def yaml_params(tmp_path: Path, name: str, values: dict):
    raw = {
        "name": "contract",
        "dataset": {"path": str(tmp_path / "data")},
        "model": {"checkpoint": str(tmp_path / "model")},
        "decoder": name,
        "params": values,
        "eval": {"ks": list(KS)},
        "metric": f"recall@{K}",
        "tracking": {"results_dir": str(tmp_path / "results")},
    }
    if needs_draft(name):
        raw["draft"] = str(tmp_path / "draft")
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_experiment(path, check_files=False).trial_spec(1, "cpu").decoder_params({})


def yaml_text(value) -> str:
    """A value as a user types it after --param NAME= (its YAML scalar)."""
    return yaml.safe_dump(value).removesuffix("...\n").strip()


def cli_params(name: str, values: dict):
    pairs = [f"{k}={yaml_text(v)}" for k, v in values.items()]
    return decoder_runs(name, pairs, None, False, KS)[0][1]


def http_params(name: str, values: dict):
    limits = Limits(
        num_items=100,
        max_history=5,
        max_k=100,
        history_policy="truncate",
        decoders=(name,),
        default_decoder=name,
        defaults={name: parse_decoder_params(name, {})},
        constraint_sets={rule: ConstraintFields(rule) for rule in ("all", "cold_start")},
    )
    body = json.dumps({"history": [1, 2], "decoder": name, "params": values}).encode()
    return parse_recommend(body, limits).params


@pytest.mark.parametrize("name", NAMES)
def test_params_round_trip_through_yaml_cli_and_http(name, tmp_path):
    params = contract_params(name, "cold_start" if has_field(name, "constraint") else None)
    values = asdict(params)
    assert yaml_params(tmp_path, name, values) == params
    assert cli_params(name, values) == params
    # a client sends what differs from the defaults (a named set fixes the other constraint fields)
    defaults = asdict(decoder_class(name).Params())
    assert http_params(name, {k: v for k, v in values.items() if v != defaults[k]}) == params


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [{"k": "ten"}, {"k": 0}, {"colour": 1}])
def test_the_same_bad_value_gets_the_same_message_everywhere(name, bad, tmp_path):
    with pytest.raises(RequestError) as http:
        http_params(name, bad)
    message = http.value.message
    with pytest.raises(UserInputError) as cli:
        cli_params(name, bad)
    with pytest.raises(UserInputError) as from_yaml:
        yaml_params(tmp_path, name, bad)
    assert str(cli.value) == message
    assert message in str(from_yaml.value)
