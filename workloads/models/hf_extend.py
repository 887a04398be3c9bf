"""Start from a pretrained causal LM (issue 32, item 5): add a data set's SID tokens to an HF folder, and
write one of our models back out as an HF folder.

`extend_hf_folder` adds the token of every (level, code) some item uses to tokenizer.json, sorted as
strings as LC-Rec does (`tokenizer.add_tokens`), grows the embedding (and an untied LM head) to the
new vocabulary (`resize_token_embeddings`), and initialises the rows of the added tokens to the mean of
the rows that were there before (a new token starts as the "average" token, not as noise). The result
is an ordinary HF folder: `genrec model import hf` reads it with every check it applies to any other.

`export_hf_folder` is the inverse of hf_import's renaming (our names are HF's without `model.`): the
weights of a model that came from an HF folder go back under HF's names, beside that folder's
config.json (vocab_size set to ours) and the given tokenizer.json, so transformers loads the folder and
scores exactly as our model does (tests/test_byom_init.py).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from genrec.workloads.errors import UserInputError
from genrec.workloads.models.hf_import import read_hf_tensors, weight_files
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.tokenize.sid_tokens import SIDPattern, load_tokenizer, tokenizer_size

RESIZED = ("model.embed_tokens.weight", "lm_head.weight")
GENERATION_FILE = "generation_config.json"


@dataclass(frozen=True)
class ExtendReport:
    added: int  # SID tokens new to the tokenizer
    old_vocab: int  # embedding rows before
    new_vocab: int  # after


def used_sid_tokens(codes: np.ndarray, pattern: SIDPattern) -> list[str]:
    """The token of every (level, code) an item uses, sorted as strings (`<a_10>` before `<a_2>`)."""
    codes = np.asarray(codes, dtype=np.int64)
    return sorted({pattern.token(level, int(c)) for level in range(codes.shape[1]) for c in codes[:, level]})


def extend_hf_folder(
    src: str | os.PathLike, dst: str | os.PathLike, codes: np.ndarray, pattern: SIDPattern
) -> ExtendReport:
    """Write `dst`: `src` with the items' SID tokens added and the embedding resized (module doc)."""
    src, dst = Path(src), Path(dst)
    tok = load_tokenizer(src)
    new = [t for t in used_sid_tokens(codes, pattern) if tok.token_to_id(t) is None]
    from tokenizers import AddedToken

    tok.add_tokens([AddedToken(t, normalized=False) for t in new])
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    state = read_hf_tensors(weight_files(src))
    emb = state.get(RESIZED[0])
    if emb is None:
        raise UserInputError(
            f"{src}: no {RESIZED[0]} in the weights; pass a Llama/Mistral/Qwen2/Qwen3 folder"
        )
    old = emb.shape[0]
    vocab = max(old, tokenizer_size(tok))
    added = torch.as_tensor([tok.token_to_id(t) for t in new], dtype=torch.long)
    for name in RESIZED:
        if name in state:
            state[name] = with_mean_rows(state[name], vocab, added, old)
    config["vocab_size"] = vocab
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(dst / "model.safetensors"), {"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tok.save(str(dst / "tokenizer.json"))
    if (src / GENERATION_FILE).is_file():
        shutil.copyfile(src / GENERATION_FILE, dst / GENERATION_FILE)
    return ExtendReport(len(new), old, vocab)


def with_mean_rows(weight: torch.Tensor, rows: int, added: torch.Tensor, old: int) -> torch.Tensor:
    """[rows, D]: `weight`'s rows, grown to `rows`; every added token's row = the mean of the old rows
    (computed in fp32, stored in the weight's dtype)."""
    out = torch.zeros(rows, weight.shape[1], dtype=weight.dtype)
    out[: len(weight)] = weight
    out[added] = weight[:old].float().mean(dim=0).to(weight.dtype)
    return out


def export_hf_folder(
    model: GRTransformer, hf_config: str | os.PathLike, tokenizer: str | os.PathLike, dst: str | os.PathLike
) -> Path:
    """`dst` as an HF folder: our weights under HF's names, `hf_config`'s config.json with our vocabulary,
    `tokenizer` (a tokenizer.json) beside them (module doc). A tied head is stored once, as HF does."""
    from genrec.workloads.models.checkpoint import model_tensors

    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    state = {k if k == "lm_head.weight" else f"model.{k}": v for k, v in model_tensors(model).items()}
    config = json.loads((Path(hf_config) / "config.json").read_text(encoding="utf-8"))
    config["vocab_size"] = model.config.vocab_size
    dtype = str(model.embed_tokens.weight.dtype).removeprefix("torch.")  # what the weights now are
    config["dtype" if "dtype" in config else "torch_dtype"] = dtype
    save_file(state, str(dst / "model.safetensors"), {"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    shutil.copyfile(tokenizer, dst / "tokenizer.json")
    if (Path(hf_config) / GENERATION_FILE).is_file():
        shutil.copyfile(Path(hf_config) / GENERATION_FILE, dst / GENERATION_FILE)
    return dst
