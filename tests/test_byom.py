"""Bring your own model (issue 32): tiny random Qwen3- and Llama-family checkpoints built here by
transformers, with a tokenizer whose LC-Rec SID tokens were added in string order (`<a_10>` before
`<a_2>`, a code without a token), imported with `genrec model import hf` and decoded by every decoder:
`beam` == `hf_beam` (HF generate on the original folder) at beam widths 5, 20, 50 for every user; `xgr`
== `beam`; `atspeed_strict` == `beam` with a smaller imported checkpoint as draft; `constraint=cold_start`
returns only cold-start items; `level_softmax` equals exhaustive search over renormalised level scores;
the decoder contract on the imported models; and each bad input exits 2 with one line, writing nothing."""

from __future__ import annotations

import itertools
import json
import shutil
import sys

import numpy as np
import pytest
import torch
from hf_models import (  # noqa: E402
    FAMILIES,
    GAP,
    N_ITEMS,
    SIZES,
    build_and_import,
    build_hf,
    import_args,
    item_codes,
    transformers_or_skip,
    write_index,
)

tf = transformers_or_skip()  # before the imports below: the Triton interpreter is chosen first

from test_hf_beam import assert_same_top_k  # noqa: E402

from genrec.platform.cli import main  # noqa: E402
from genrec.studies.common.random_hf import save_tokenizer, word_tokenizer  # noqa: E402
from genrec.workloads.decoding.base import get_decoder, make_params  # noqa: E402
from genrec.workloads.evaluation import load_imported_context  # noqa: E402

USERS = 100


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main(args)
    return int(e.value.code or 0), capsys.readouterr().err


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Original HF folders, the items file, the template and the imported checkpoints."""
    root = tmp_path_factory.mktemp("byom")
    build_and_import(root)
    return root, item_codes()


def popularity() -> np.ndarray:
    pop = np.ones(N_ITEMS, dtype=np.int64)
    pop[::9] = 0  # the cold-start items
    return pop


def context(world, family: str, draft: bool = False):
    root, _ = world
    d = root / "ours_draft" if draft else None
    return load_imported_context(root / f"ours_{family}", "cpu", d, popularity())[0]


def histories(n: int = USERS, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, N_ITEMS, size=int(rng.integers(1, 6))).tolist() for _ in range(n)]


def decode(ctx, name: str, hist, **values):
    dec = get_decoder(name)
    return dec.decode(ctx, hist, make_params(dec, values))


# --- the import -------------------------------------------------------------------------------------
def test_import_stores_codec_template_items_and_backbone(world):
    root, codes = world
    ctx = context(world, "qwen3")
    meta = json.loads((root / "ours_qwen3" / "config.json").read_text())
    assert meta["hf"]["family"] == "qwen3" and meta["hf"]["dtype"] == "float32"
    assert meta["hf"]["n_params"] == ctx.model.num_parameters() and meta["hf"]["vocab_size"] > 0
    assert meta["imported"]["generation_config"]["do_sample"] is True  # recorded, never obeyed
    assert np.array_equal(ctx.item_codes, codes)
    table = ctx.codec.table
    assert table.ids[0][10] < table.ids[0][2], "string order: <a_10> before <a_2>"
    assert table.ids[GAP[0]][GAP[1]] == -1
    with pytest.raises(ValueError, match="contiguous"):
        ctx.codec.level_range(0)
    tokens, mask = ctx.prompts([[0, 1]])
    tok = ctx.imported.encoder.tokenizer
    text = tok.decode(tokens[0][mask[0]].tolist(), skip_special_tokens=False)
    assert text.startswith("<s>") and "bought" in text and text.endswith(":")


def test_result_rows_record_the_backbone(world):
    from genrec.workloads.evaluation import backbone_of
    from genrec.workloads.results import ResultRow, current_environment

    ctx = context(world, "llama")
    backbone = backbone_of(ctx)
    assert backbone["family"] == "llama" and backbone["architecture"] == "LlamaForCausalLM"
    assert backbone["n_params"] == ctx.model.num_parameters() and backbone["dtype"] == "float32"
    row = ResultRow("beam", {}, "d", "m", "test", current_environment(ctx.device), backbone=backbone)
    assert row.to_flat()["backbone_vocab_size"] == ctx.model.config.vocab_size


# --- exactness against HF generate -----------------------------------------------------------------
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize(("width", "k"), [(5, 5), (20, 10), (50, 10)])
def test_beam_equals_hf_beam_on_the_original_checkpoint(world, family, width, k):
    ctx, hist = context(world, family), histories()
    ours = decode(ctx, "beam", hist, beam_width=width, k=k)
    ref = decode(ctx, "hf_beam", hist, beam_width=width, k=k)
    assert bool(torch.isfinite(ref.scores).all())
    assert_same_top_k(ours, ref)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_xgr_equals_beam(world, family):
    ctx, hist = context(world, family), histories(40, seed=1)
    ref = decode(ctx, "beam", hist, beam_width=20, k=10)
    for reorder in ("index", "copy"):
        assert_same_top_k(decode(ctx, "xgr", hist, beam_width=20, k=10, reorder=reorder), ref)
    ref = decode(ctx, "beam", hist, beam_width=20, k=10, level_softmax=True)
    assert_same_top_k(decode(ctx, "xgr", hist, beam_width=20, k=10, level_softmax=True), ref)


def test_atspeed_strict_equals_beam_with_an_imported_draft(world):
    ctx, hist = context(world, "qwen3", draft=True), histories(30, seed=2)
    ref = decode(ctx, "beam", hist, beam_width=10, k=10)
    got = decode(ctx, "atspeed_strict", hist, beam_width=10, k=10, draft_beams=10, gamma=2)
    assert_same_top_k(got, ref)


def test_level_softmax_equals_exhaustive_search_over_renormalised_levels(world):
    """Width >= every 2-level prefix keeps the search exact: its top-K is the exhaustive top-K of the
    sum over levels of the log-softmax over each level's own tokens."""
    ctx, hist = context(world, "qwen3"), histories(4, seed=3)
    res = decode(ctx, "beam", hist, beam_width=SIZES[0] * SIZES[1], k=10, level_softmax=True)
    every = torch.tensor([c for c in itertools.product(*map(range, SIZES)) if c[GAP[0]] != GAP[1]])
    sid_tokens = ctx.codec.codes_to_tokens(every)
    for b, h in enumerate(hist):
        tokens, _ = ctx.prompts([h])
        seq = torch.cat([tokens.expand(len(every), -1), sid_tokens[:, :-1]], dim=1)
        with torch.no_grad():
            logits, _ = ctx.model(seq)
        p = tokens.shape[1]
        total = torch.zeros(len(every))
        for level in range(len(SIZES)):
            ids = ctx.codec.level_ids_tensor(level, "cpu")
            level_logits = logits[:, p - 1 + level].float()[:, ids.clamp(min=0)]
            lp = torch.log_softmax(level_logits.masked_fill(ids < 0, float("-inf")), dim=-1)  # gap: no token
            total += lp.gather(1, every[:, level : level + 1])[:, 0]
        top = torch.argsort(total, descending=True, stable=True)[:10]
        torch.testing.assert_close(res.scores[b], total[top], atol=1e-4, rtol=1e-4)
    default = decode(ctx, "beam", hist, beam_width=10, k=10)
    assert not torch.allclose(default.scores, res.scores[:, :10]), "a different score, as documented"


# --- every decoder on an imported model: the decoder contract (test_decoder_contract.py) runs on both
# families, the head decoders' refusal included


# --- bad input: exit 2, one line, nothing written --------------------------------------------------
def bad_import(capsys, src, items, out, template=None, *needles):
    capsys.readouterr()  # what building the inputs printed
    code, err = run_cli(import_args(src, items, out, template), capsys)
    assert code == 2, err
    assert err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")], "temp left behind"


def copy_src(world, family, tmp_path):
    root, _ = world
    dst = tmp_path / "src"
    shutil.copytree(root / f"hf_{family}", dst)
    return root, dst


def test_missing_shard(world, tmp_path, capsys):
    root, src = copy_src(world, "llama", tmp_path)
    shard = sorted(src.glob("model-*.safetensors"))[0]
    shard.unlink()
    bad_import(capsys, src, root / "index.json", tmp_path / "out", None, shard.name, "missing shard")


def test_unknown_architecture(world, tmp_path, capsys):
    root, src = copy_src(world, "qwen3", tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (src / "config.json").write_text(json.dumps(cfg))
    bad_import(capsys, src, root / "index.json", tmp_path / "out", None, "GPT2LMHeadModel")


def test_tokenizer_without_sid_tokens(world, tmp_path, capsys):
    root, src = copy_src(world, "qwen3", tmp_path)
    save_tokenizer(word_tokenizer([]), src)
    bad_import(capsys, src, root / "index.json", tmp_path / "out", None, "tokenizer.json")


def test_sid_table_that_does_not_match_the_items(world, tmp_path, capsys):
    root, codes = world
    bad = codes.copy()
    bad[7, GAP[0]] = GAP[1]  # an item at a code the tokenizer has no token for
    write_index(bad, tmp_path / "index.json")
    out = tmp_path / "out"
    bad_import(capsys, root / "hf_qwen3", tmp_path / "index.json", out, None, "item row 7", "items file")


@pytest.mark.parametrize(
    ("template", "needle"),
    [({"text": "the user bought ."}, "{history}"), ({"text": "the user bought <a_1> {history}"}, "SID")],
)
def test_prompt_template_that_does_not_render(world, tmp_path, capsys, template, needle):
    root, _ = world
    (tmp_path / "t.json").write_text(json.dumps(template))
    bad_import(capsys, root / "hf_qwen3", root / "index.json", tmp_path / "out", tmp_path / "t.json", needle)


def test_vocabulary_and_tokenizer_disagree(world, tmp_path, capsys):
    root, _ = world
    src = build_hf("qwen3", tmp_path / "src", layers=1, vocab=20)  # SID tokens added without a resize
    bad_import(capsys, src, root / "index.json", tmp_path / "out", None, "vocab_size is 20", "resiz")


def test_side_by_side_driver_checks_identity_and_reports_both_comparisons(world, monkeypatch):
    import importlib.util
    from pathlib import Path

    # by path: genrec.studies is mapped into the package by the studies move (another branch)
    file = Path(__file__).resolve().parents[1] / "studies" / "beam" / "byom_vs_hf.py"
    spec = importlib.util.spec_from_file_location("byom_vs_hf", file)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    driver = module.main
    root, _ = world
    args = ["--model", str(root / "ours_qwen3"), "--users", "4", "--batch-size", "2", "--repeats", "2"]
    out = driver(args + ["--warmup", "0", "--beam-width", "5", "--k", "5", "--threads", "0"])
    assert out["top_k_agreement_with_hf"] == 1.0 and out["users"] == 4
    assert out["timed_batches_per_arm"] == 4 and out["backbone"]["family"] == "qwen3"
    assert 0.0 <= out["level_softmax_keeps_of_full_top_k"] <= 1.0
    assert set(out["latency_ms"]) == {"beam", "hf_beam", "level_softmax"}


def test_genrec_eval_on_an_imported_checkpoint_with_a_dataset(tmp_path, capsys):
    """`genrec eval --model IMPORTED --data DIR`: the dataset's items need only be spellable by the SID
    table (LC-Rec's tokenizer has tokens for the used codes only), and the rows carry the backbone."""
    from genrec.workloads.data.dataset import load_dataset

    synth = ["data", "synth", "--out", str(tmp_path / "d"), "--num-users", "40", "--num-items", "60"]
    synth += ["--levels", "3", "--codebook-size", "6", "--num-clusters", "4", "--num-subclusters", "2"]
    assert run_cli(synth, capsys)[0] == 0
    codes = load_dataset(tmp_path / "d").item_codes()
    used = sorted({f"<{'abc'[l]}_{c}>" for row in codes for l, c in enumerate(row)})  # string order
    build_hf("qwen3", tmp_path / "hf", layers=1, sid=used)
    write_index(codes, tmp_path / "index.json")
    assert run_cli(import_args(tmp_path / "hf", tmp_path / "index.json", tmp_path / "m"), capsys)[0] == 0
    rows = tmp_path / "rows.jsonl"
    args = ["eval", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "d"), "--max-users", "8"]
    args += ["--beam-width", "5", "--k", "5", "--quiet", "--output", str(rows)]
    code, err = run_cli(args, capsys)
    assert code == 0, err
    row = json.loads(rows.read_text().splitlines()[0])
    assert row["decoder"] == "beam" and row["backbone"]["family"] == "qwen3" and row["users"] == 8
