"""Random Hugging Face checkpoints with SID tokens, built locally (no network): what the bring-your-own-model
tests and the GPU check's Qwen3-0.6B-shaped measurement import.

A checkpoint is a transformers model of the given family and shape with random weights, saved with
safetensors, and a `tokenizers` WordLevel tokenizer whose added tokens are the SID tokens in LC-Rec's
string order (`<a_10>` before `<a_2>`), plus the items' LC-Rec index JSON. transformers is imported
inside the functions (the GPU machine has it; this module must import without it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from genrec.workloads.errors import UserInputError, run_main

WORDS = ["<unk>", "<s>", "</s>", "<pad>", "the", "user", "bought", "items", "next", "item", ":", ",", "."]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
# Qwen3 shapes (transformers config fields): the published 0.6B model's, and a tiny one of the same kind
QWEN3_0_6B = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
    rope_theta=1e6,
    max_position_embeddings=4096,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=True,
    max_position_embeddings=512,
)
SHAPES = {"tiny": TINY, "qwen3-0.6b": QWEN3_0_6B}
PROMPT = {"text": "the user bought {history} . next item :"}


def lcrec_token_strings(sizes: tuple[int, ...], template: str = "<{level}_{code}>") -> list[str]:
    """Every (level, code) token, sorted as strings, as LC-Rec adds them (`<a_10>` before `<a_2>`)."""
    return sorted(template.format(level=LETTERS[lv], code=c) for lv, t in enumerate(sizes) for c in range(t))


def word_tokenizer(sid_tokens: list[str], words: list[str] = WORDS, bos: bool = True):
    """A WordLevel tokenizer on `words` (whitespace/punctuation split) with `sid_tokens` added after them,
    in the given order; with `bos`, encoding prepends <s> as LLaMA's tokenizer does."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    split = [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    tok.pre_tokenizer = pre_tokenizers.Sequence(split)
    tok.add_special_tokens([AddedToken(w, special=True) for w in ("<s>", "</s>", "<pad>")])
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.add_tokens([AddedToken(t, normalized=False) for t in sid_tokens])
    return tok


def save_tokenizer(tok, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def write_index(codes: np.ndarray, path: Path) -> Path:
    """LC-Rec's index JSON: item id -> its SID token strings."""
    index = {str(i): [f"<{LETTERS[lv]}_{c}>" for lv, c in enumerate(row)] for i, row in enumerate(codes)}
    path.write_text(json.dumps(index))
    return path


def random_items(sizes: tuple[int, ...], n: int, seed: int) -> np.ndarray:
    """`n` distinct random SIDs (codes [n, L]) over codebooks of `sizes`."""
    rng = np.random.default_rng(seed)
    keys = rng.choice(int(np.prod(sizes)), size=n, replace=False)
    return np.stack(np.unravel_index(keys, sizes), axis=1)


def build_random_hf(
    folder: Path,
    family_config: str,
    model_class: str,
    shape: dict,
    sizes: tuple[int, ...],
    dtype: str = "float32",
    seed: int = 0,
    vocab: int | None = None,
) -> Path:
    """A random `model_class` checkpoint (e.g. Qwen3ForCausalLM of a Qwen3Config with `shape`) whose
    tokenizer holds every SID token of `sizes`; `vocab` pads the embedding past the tokenizer (as
    published checkpoints do: Qwen3's 151,936 rows)."""
    import transformers as tf

    tok = word_tokenizer(lcrec_token_strings(sizes))
    save_tokenizer(tok, folder)
    size = tok.get_vocab_size(with_added_tokens=True)
    cfg = getattr(tf, family_config)(**shape, vocab_size=max(vocab or 0, size))
    torch.manual_seed(seed)
    model = getattr(tf, model_class)(cfg).to(getattr(torch, dtype)).eval()
    model.save_pretrained(folder)
    return folder


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m genrec.studies.common.random_hf",
        description="Build a random Qwen3 checkpoint with LC-Rec SID tokens, its item index and prompt "
        "template: the input of `genrec model import hf` for trying it without a model of your own.",
    )
    p.add_argument("--out", type=Path, required=True, help="folder to create (must not exist)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--sizes", type=int, nargs="+", default=[32, 32, 32], help="codebook size per level")
    p.add_argument("--items", type=int, default=2000, help="catalogue size (distinct random SIDs)")
    p.add_argument("--vocab", type=int, default=None, help="embedding rows, padded past the tokenizer")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    sizes = tuple(args.sizes)
    if args.out.exists():
        raise UserInputError(f"{args.out} exists: pick a new --out folder (nothing was written)")
    if not 0 < args.items <= int(np.prod(sizes)):
        raise UserInputError(
            f"--items {args.items}: give 1..{int(np.prod(sizes))} for codebooks {list(sizes)}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{args.out.name}.", dir=args.out.parent))
    try:  # built aside and renamed, so an error or Ctrl-C leaves no half checkpoint at --out
        shape = SHAPES[args.shape]
        build_random_hf(
            tmp, "Qwen3Config", "Qwen3ForCausalLM", shape, sizes, args.dtype, args.seed, args.vocab
        )
        write_index(random_items(sizes, args.items, args.seed), tmp / "items.index.json")
        (tmp / "prompt.json").write_text(json.dumps(PROMPT) + "\n")
        tmp.rename(args.out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"random Qwen3 ({args.shape}, {args.dtype}) with {sum(sizes)} SID tokens and {args.items} items "
        f"-> {args.out} (items.index.json, prompt.json)"
    )
    return {"out": str(args.out)}


if __name__ == "__main__":
    run_main(main)
