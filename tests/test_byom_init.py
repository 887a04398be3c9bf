"""Start from a pretrained LM (issue 32, item 5): `genrec train --init hf:DIR --data D` on a tiny random
Llama built by transformers whose tokenizer has no SID tokens. The data set's SID tokens are added
(string order, rows at the old rows' mean), next-item fine-tuning runs (all weights, or `--train
new-rows`: nothing but the SID rows moves), and the result loads as an import does and exports to an
HF folder that transformers loads and scores identically; beam on it equals hf_beam on the export."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hf_models import build_hf, transformers_or_skip

tf = transformers_or_skip()

from test_hf_beam import assert_same_top_k  # noqa: E402

from genrec.platform.cli import main  # noqa: E402
from genrec.workloads.data.dataset import load_dataset  # noqa: E402
from genrec.workloads.decoding.base import get_decoder, make_params  # noqa: E402
from genrec.workloads.evaluation import load_imported_context  # noqa: E402
from genrec.workloads.models.checkpoint import model_tensors  # noqa: E402
from genrec.workloads.models.hf_extend import extend_hf_folder, used_sid_tokens  # noqa: E402
from genrec.workloads.models.hf_import import load_hf_model  # noqa: E402
from genrec.workloads.tokenize.sid_tokens import load_tokenizer, sid_pattern  # noqa: E402


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main(args)
    return int(e.value.code or 0), capsys.readouterr().err


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(root, dataset folder, its item codes, a pretrained Llama folder without SID tokens)."""
    root = tmp_path_factory.mktemp("init")
    synth = ["data", "synth", "--out", str(root / "d"), "--num-users", "50", "--num-items", "40"]
    synth += ["--levels", "3", "--codebook-size", "12", "--num-clusters", "12", "--num-subclusters", "2"]
    with pytest.raises(SystemExit) as e:
        main(synth)
    assert e.value.code in (0, None)
    build_hf("llama", root / "lm", layers=1, sid=[])  # sharded, untied head, q/k/v biases
    return root, root / "d", load_dataset(root / "d").item_codes(), root / "lm"


def train_args(data, src, out, *extra: str) -> list[str]:
    args = ["train", "--init", f"hf:{src}", "--data", str(data), "--out", str(out), "--epochs", "1"]
    return args + [
        "--max-steps",
        "4",
        "--batch-size",
        "16",
        "--lr",
        "1e-2",
        "--device",
        "cpu",
        "--quiet",
        *extra,
    ]


def test_extend_adds_the_used_tokens_in_string_order_with_mean_rows(world, tmp_path):
    _, _, codes, src = world
    pattern = sid_pattern("lcrec")
    report = extend_hf_folder(src, tmp_path / "x", codes, pattern)
    tokens = used_sid_tokens(codes, pattern)
    tok = load_tokenizer(tmp_path / "x")
    ids = [tok.token_to_id(t) for t in tokens]
    assert ids == sorted(ids), "added in string order, as LC-Rec does"
    # the tiny config pads its vocabulary by 2 rows past the tokenizer (as Qwen's does): the first added
    # tokens take those rows, the rest grow the matrix
    assert report.added == len(tokens) and report.new_vocab == max(report.old_vocab, ids[-1] + 1)
    before, _ = load_hf_model(src)
    after, _ = load_hf_model(tmp_path / "x")
    for layer in ("embed_tokens", "lm_head"):
        old, new = getattr(before, layer).weight, getattr(after, layer).weight
        kept = [i for i in range(len(old)) if i not in ids]
        assert torch.equal(new[kept], old[kept]), "the rows of the tokens that were there stay"
        mean = old.float().mean(dim=0)
        assert all(torch.allclose(new[i], mean) for i in ids), "a new token starts at the old rows' mean"


def test_fine_tuned_model_loads_as_an_import_and_exports_identically(world, tmp_path, capsys):
    root, data, codes, src = world
    code, err = run_cli(train_args(data, src, tmp_path / "m"), capsys)
    assert code == 0, err
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".m")], "no scratch left behind"
    ctx, ckpt = load_imported_context(tmp_path / "m", "cpu")
    assert np.array_equal(ctx.item_codes, codes)
    assert ckpt.meta["hf"]["path"] == str((tmp_path / "m" / "hf").resolve()), "hf_beam runs on the export"
    assert any(ctx.codec.table.contiguous_range(l) is None for l in range(3)), "string order: not contiguous"
    ref = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "m" / "hf").eval()
    tokens, mask = ctx.prompts([[0, 1, 2], [3], [4, 5]])
    with torch.no_grad():
        theirs = ref(input_ids=tokens, attention_mask=mask.long()).logits
        ours = ctx.model.lm_head(ctx.model.hidden_states(tokens, mask))
    torch.testing.assert_close(ours[mask], theirs[mask], atol=1e-4, rtol=1e-4)
    hist = [ex.history for ex in load_dataset(data).eval_examples("test")][:12]
    beam, hf = get_decoder("beam"), get_decoder("hf_beam")
    values = {"k": 5, "beam_width": 5}
    ours, theirs = (d.decode(ctx, hist, make_params(d, values)) for d in (beam, hf))
    assert_same_top_k(ours, theirs)


def test_training_moves_the_weights(world, tmp_path, capsys):
    _, data, codes, src = world
    assert run_cli(train_args(data, src, tmp_path / "m"), capsys)[0] == 0
    extend_hf_folder(src, tmp_path / "x", codes, sid_pattern("lcrec"))
    start, _ = load_hf_model(tmp_path / "x")
    trained, _ = load_imported_context(tmp_path / "m", "cpu")
    a, b = model_tensors(start), model_tensors(trained.model)
    moved = [k for k in a if not torch.equal(a[k], b[k])]
    assert len(moved) == len(a), f"--train all: every tensor moves; unchanged: {sorted(set(a) - set(moved))}"


def test_new_rows_trains_only_the_sid_rows(world, tmp_path, capsys):
    _, data, codes, src = world
    assert run_cli(train_args(data, src, tmp_path / "m", "--train", "new-rows"), capsys)[0] == 0
    extend_hf_folder(src, tmp_path / "x", codes, sid_pattern("lcrec"))
    start, _ = load_hf_model(tmp_path / "x")
    ctx, _ = load_imported_context(tmp_path / "m", "cpu")
    rows = np.concatenate([ctx.codec.table.level_present_ids(l) for l in range(3)])
    other = np.setdiff1d(np.arange(start.config.vocab_size), rows)
    a, b = model_tensors(start), model_tensors(ctx.model)
    for name in a:
        if name in ("embed_tokens.weight", "lm_head.weight"):
            assert torch.equal(a[name][other], b[name][other]), name
            assert not torch.equal(a[name][rows], b[name][rows]), f"{name}: the SID rows trained"
        else:
            assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--objective", "nezha"], "holds no SID tokens"),  # a head needs an SID checkpoint: none here
        (["--train", "some"], "--train must be one of"),
        (["--dtype", "float16"], "--dtype must be one of"),
        (["--save-dtype", "int8"], "--save-dtype must be one of"),
        (["--sid-pattern", "<nope>"], "--sid-pattern"),
        (["--objective", "nezha", "--dtype", "bfloat16"], "--dtype applies to --init hf:DIR with next_item"),
    ],
)
def test_bad_combinations_exit_2_with_one_line(world, tmp_path, capsys, monkeypatch, extra, needle):
    _, data, _, src = world
    monkeypatch.setenv("GENREC_HF_CACHE", str(tmp_path / "cache"))
    code, err = run_cli(train_args(data, src, tmp_path / "m", *extra), capsys)
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "m").exists()


def test_new_rows_needs_an_hf_start(world, tmp_path, capsys):
    _, data, _, _ = world
    args = [
        "train",
        "--data",
        str(data),
        "--out",
        str(tmp_path / "m"),
        "--train",
        "new-rows",
        "--device",
        "cpu",
    ]
    code, err = run_cli(args, capsys)
    assert code == 2 and "hf:DIR" in err, err


def test_a_folder_without_a_tokenizer_exits_2_and_leaves_no_scratch(world, tmp_path, capsys):
    _, data, _, _ = world
    (tmp_path / "lm").mkdir()
    code, err = run_cli(train_args(data, tmp_path / "lm", tmp_path / "m"), capsys)
    assert code == 2 and err.count("\n") == 1 and "tokenizer.json" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lm"], "nothing written, no scratch left"


def test_openonerec_tokens_are_added_and_trained(world, tmp_path, capsys):
    """`--sid-pattern openonerec`: `<s_a_N>` tokens join the tokenizer, the import finds them, and
    fine-tuning moves their rows."""
    import json

    _, data, codes, src = world
    code, err = run_cli(train_args(data, src, tmp_path / "m", "--sid-pattern", "openonerec"), capsys)
    assert code == 0, err
    ctx, ckpt = load_imported_context(tmp_path / "m", "cpu")
    assert ckpt.meta["imported"]["sid_pattern"]["name"] == "openonerec"
    tok = load_tokenizer(tmp_path / "m" / "hf")
    for level, letter in enumerate("abc"):
        for c in np.unique(codes[:, level]):
            tid = ctx.codec.table.ids[level][int(c)]
            assert tok.id_to_token(tid) == f"<s_{letter}_{c}>"
    assert np.array_equal(ctx.item_codes, codes)
    pattern = sid_pattern("openonerec", allow_gaps=True)
    extend_hf_folder(src, tmp_path / "x", codes, pattern)
    start, _ = load_hf_model(tmp_path / "x")
    rows = np.concatenate([ctx.codec.table.level_present_ids(l) for l in range(3)])
    before, after = start.embed_tokens.weight[rows], ctx.model.embed_tokens.weight[rows]
    assert not torch.equal(before, after), "the <s_a_N> rows trained"
    assert (
        json.loads((tmp_path / "m" / "config.json").read_text())["train"]["init_sid_pattern"] == "openonerec"
    )


def bf16_copy(src, dst):
    """`src` with its weights stored in bf16 (every shard, same names), as a bf16 release ships."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    for file in dst.glob("*.safetensors"):
        save_file({k: v.bfloat16() for k, v in load_file(file).items()}, str(file), {"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg["dtype" if "dtype" in cfg else "torch_dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def first_step_loss(folder) -> float:
    import json

    return json.loads((folder / "config.json").read_text())["history"][0]["train_loss"]


def test_bf16_autocast_trains_close_to_fp32_and_its_bf16_export_loads(world, tmp_path, capsys):
    """`--dtype bfloat16` on CPU: the first step's loss is finite and within 2 % of the fp32 run's (bf16
    keeps 8 mantissa bits: ~0.4 % per rounding, a few roundings deep in this 1-layer model); the master
    weights stay fp32; `--save-dtype bfloat16` saves and exports bf16 weights that transformers loads
    as bf16 and, upcast, scores as our upcast model does (fp32 atol 1e-4)."""
    _, data, _, src = world
    one = ("--max-steps", "1")
    assert run_cli(train_args(data, src, tmp_path / "f32", *one), capsys)[0] == 0
    code, err = run_cli(
        train_args(data, src, tmp_path / "bf", *one, "--dtype", "bfloat16", "--save-dtype", "bfloat16"),
        capsys,
    )
    assert code == 0, err
    fp32, bf16 = first_step_loss(tmp_path / "f32"), first_step_loss(tmp_path / "bf")
    assert np.isfinite(bf16) and abs(bf16 - fp32) <= 0.02 * abs(fp32), (bf16, fp32)
    assert fp32 != bf16, "the bf16 run really ran under autocast"
    saved32, _ = load_imported_context(tmp_path / "f32", "cpu")
    assert saved32.model.embed_tokens.weight.dtype == torch.float32, "default: the checkpoint's dtype"
    lm16 = bf16_copy(src, tmp_path / "lm16")
    for name, extra in (("m16", ()), ("master", ("--save-dtype", "float32"))):
        args = train_args(data, lm16, tmp_path / name, *one, "--dtype", "bfloat16", *extra)
        assert run_cli(args, capsys)[0] == 0
    saved16, _ = load_imported_context(tmp_path / "m16", "cpu")
    assert saved16.model.embed_tokens.weight.dtype == torch.bfloat16, "default: the checkpoint's dtype"
    master, _ = load_imported_context(tmp_path / "master", "cpu")
    w = master.model.embed_tokens.weight
    assert w.dtype == torch.float32 and not torch.equal(w, w.bfloat16().float()), "fp32 master weights"
    ctx, ckpt = load_imported_context(tmp_path / "bf", "cpu")
    assert ctx.model.embed_tokens.weight.dtype == torch.bfloat16 and ckpt.meta["hf"]["dtype"] == "bfloat16"
    ref = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "bf" / "hf").eval()
    assert ref.model.embed_tokens.weight.dtype == torch.bfloat16
    tokens, mask = ctx.prompts([[0, 1, 2], [3], [4, 5]])
    ref.float(), ctx.model.float()  # the same bf16 values, scored in fp32: the round trip is exact
    with torch.no_grad():
        theirs = ref(input_ids=tokens, attention_mask=mask.long()).logits
        ours = ctx.model.lm_head(ctx.model.hidden_states(tokens, mask))
    torch.testing.assert_close(ours[mask], theirs[mask], atol=1e-4, rtol=1e-4)
