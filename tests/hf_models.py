"""Tiny random Hugging Face checkpoints (Qwen3 and Llama families) built here by transformers, with a
tokenizer whose LC-Rec SID tokens were added in string order (`<a_10>` before `<a_2>`, one code without a
token), and their import with `genrec model import hf`. Shared by test_byom.py and the decoder contract
(test_decoder_contract.py); transformers is imported by the caller (a test skips without it) and its
classes are looked up only when a checkpoint is built (see TRITON_INTERPRET in test_byom.py)."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest
import torch

from genrec.studies.common.random_hf import lcrec_token_strings, save_tokenizer, word_tokenizer

SIZES = (12, 6, 5)
GAP = (0, 4)  # (level, code) without a token: LC-Rec adds only the codes some item uses
N_ITEMS = 120
PAD_ID = 3  # "<pad>" in random_hf.WORDS
TEMPLATE = {"text": "the user bought {history} .", "response_prefix": " next item :"}
BASE = dict(
    hidden_size=32,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=PAD_ID,
)
FAMILIES = {  # class names, looked up when a checkpoint is built (not at collection: see TRITON_INTERPRET)
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16, tie_word_embeddings=True)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True, tie_word_embeddings=False)),
}


def transformers_or_skip():
    """transformers with the Triton interpreter chosen first (its model classes import triton)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return pytest.importorskip("transformers", reason="the peers extra builds the reference checkpoints")


def sid_token_strings() -> list[str]:
    gap = "<{}_{}>".format("abc"[GAP[0]], GAP[1])
    return [t for t in lcrec_token_strings(SIZES) if t != gap]  # string order: <a_10> before <a_2>


def item_codes(seed: int = 0, n: int = N_ITEMS) -> np.ndarray:
    rng = np.random.default_rng(seed)
    every = np.array([c for c in itertools.product(*map(range, SIZES)) if c[GAP[0]] != GAP[1]])
    return every[rng.choice(len(every), size=n, replace=False)]


def write_index(codes: np.ndarray, path) -> None:
    """LC-Rec's index JSON: item id -> its SID token strings."""
    index = {str(i): [f"<{'abc'[l]}_{c}>" for l, c in enumerate(row)] for i, row in enumerate(codes)}
    path.write_text(json.dumps(index))


def build_hf(family: str, folder, layers: int = 2, seed: int = 0, vocab: int | None = None, sid=None):
    """A random HF checkpoint (weights far from uniform, so searches have real choices) + tokenizer."""
    tf = transformers_or_skip()
    tok = word_tokenizer(sid_token_strings() if sid is None else sid)
    save_tokenizer(tok, folder)
    size = tok.get_vocab_size(with_added_tokens=True)
    config_name, model_name, extra = FAMILIES[family]
    config_cls, model_cls = getattr(tf, config_name), getattr(tf, model_name)
    cfg = config_cls(**BASE, **extra, num_hidden_layers=layers, vocab_size=vocab or size + 2)
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    model.generation_config = tf.GenerationConfig(do_sample=True, temperature=0.3, top_k=2)  # ignored
    model.save_pretrained(folder, **(dict(max_shard_size="40KB") if family == "llama" else {}))
    return folder


def import_args(src, items, out, template=None) -> list[str]:
    args = ["model", "import", "hf", "--path", str(src), "--items", str(items), "--out", str(out)]
    return args + (["--prompt-template", str(template)] if template else [])


def build_and_import(root, layers: int = 2) -> dict:
    """Original HF folders for each family and a 1-layer Qwen3 draft, imported beside them with the
    items index and the template: {name: imported folder}, names = FAMILIES + "draft"."""
    from genrec.platform.cli import main

    write_index(item_codes(), root / "index.json")
    (root / "template.json").write_text(json.dumps(TEMPLATE))
    src = {f: build_hf(f, root / f"hf_{f}", layers=layers, seed=i) for i, f in enumerate(FAMILIES)}
    src["draft"] = build_hf("qwen3", root / "hf_draft", layers=1, seed=7)
    out = {}
    for name, folder in src.items():
        out[name] = root / f"ours_{name}"
        with pytest.raises(SystemExit) as e:
            main(import_args(folder, root / "index.json", out[name], root / "template.json"))
        assert e.value.code in (0, None)
    return out


def synth_with_hf(root, users: int, items: int, codebook: int):
    """A synth data set at root/d (3 levels of `codebook` codes) and the LC-Rec token strings of the codes
    its items use, in the tokenizer's string order: (data folder, item codes [N, 3], token strings)."""
    from genrec.platform.cli import main
    from genrec.workloads.data.dataset import load_dataset

    synth = ["data", "synth", "--out", str(root / "d"), "--num-users", str(users), "--num-items", str(items)]
    synth += ["--levels", "3", "--codebook-size", str(codebook), "--num-clusters", str(codebook)]
    with pytest.raises(SystemExit) as e:
        main([*synth, "--num-subclusters", "2"])
    assert e.value.code in (0, None)
    codes = load_dataset(root / "d").item_codes()
    used = sorted({f"<{'abc'[lv]}_{c}>" for row in codes for lv, c in enumerate(row)})  # string order
    return root / "d", codes, used
