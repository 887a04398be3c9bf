"""Load a Hugging Face Llama / Mistral / Qwen2 / Qwen3 causal-LM folder into our GRTransformer.

The model code stays ours (the cached forward with prefill / extend / tree masks / the shared prompt
cache); only the weights come from the folder, renamed (HF's `model.` prefix dropped) the way
gpt-fast converts checkpoints. config.json is mapped and checked by hf_config.py. Weights are
`model.safetensors` or shards listed in `model.safetensors.index.json`; they keep their stored dtype
(bf16 / fp16 / fp32) unless a dtype is asked for. Needs only json and safetensors (no transformers).

Bad input is a UserInputError naming the file and the fix: a missing or unreadable shard, an unknown
architecture or config field, a vocabulary size that the embedding does not have, a tensor of the
wrong shape, a missing or foreign tensor. Nothing is written anywhere.

    model, info = load_hf_model("path/to/hf_folder", device="cpu")
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from genrec.workloads.errors import UserInputError
from genrec.workloads.models.hf_config import HFConfigSummary, hf_model_config
from genrec.workloads.models.transformer import GRTransformer, ModelConfig

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
# buffers some older checkpoints stored (recomputed from the config here, as transformers does)
DERIVED_SUFFIXES = (".rotary_emb.inv_freq",)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class HFModelInfo:
    """Where an imported model came from: for the import report and result rows' backbone fields."""

    path: str
    architecture: str  # e.g. "Qwen3ForCausalLM"
    family: str  # llama / mistral / qwen2 / qwen3
    dtype: str  # the weights' dtype as loaded, e.g. "bfloat16"
    vocab_size: int
    n_params: int  # distinct parameters (a tied head counts once)
    files: tuple[str, ...]  # the safetensors files read
    notes: tuple[str, ...]  # what the import adapted (e.g. a sliding window capping max_seq_len)

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def read_hf_config(path: str | os.PathLike) -> tuple[ModelConfig, HFConfigSummary]:
    """config.json of an HF folder -> (ModelConfig, summary); refused fields name themselves."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise UserInputError(f"{path}: no config.json; pass the folder `save_pretrained` wrote")
    return hf_model_config(_read_json(cfg_path), str(cfg_path))


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise UserInputError(f"{path}: not valid JSON ({e}); restore the file from the checkpoint") from None


def weight_files(path: str | os.PathLike) -> list[Path]:
    """The safetensors files of an HF folder: the single file, or every shard the index names."""
    path = Path(path)
    if (path / INDEX).is_file():
        index = _read_json(path / INDEX)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserInputError(f"{path / INDEX}: no `weight_map`; restore the index from the checkpoint")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise UserInputError(
                f"{path}: missing shard(s) {missing} listed in {INDEX}; copy every shard of the checkpoint"
            )
        return [path / s for s in shards]
    if (path / SINGLE).is_file():
        return [path / SINGLE]
    raise UserInputError(
        f"{path}: no {SINGLE} or {INDEX}; genrec imports safetensors weights "
        "(convert .bin files with transformers' save_pretrained(safe_serialization=True))"
    )


def read_hf_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """Every tensor of the files (HF names); a name in two shards is refused."""
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            part = load_file(f, device="cpu")
        except (SafetensorError, OSError, ValueError) as e:
            raise UserInputError(f"{f}: not a readable safetensors file ({e}); copy it again") from None
        twice = sorted(set(part) & set(state))
        if twice:
            raise UserInputError(f"{f}: tensor(s) {twice[:3]} also appear in another shard; re-save it")
        state.update(part)
    return state


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our parameter names and shapes for a config (built on the meta device: no memory)."""
    with torch.device("meta"):
        model = GRTransformer(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def to_our_names(hf_state: dict[str, torch.Tensor], cfg: ModelConfig, where: str) -> dict[str, torch.Tensor]:
    """HF tensor names -> ours, checked against the config: vocabulary, shapes, missing and extra."""
    state = {}
    for name, tensor in hf_state.items():
        if name.endswith(DERIVED_SUFFIXES):
            continue
        ours = name.removeprefix("model.") if name != "lm_head.weight" else name
        state[ours] = tensor
    shapes = expected_shapes(cfg)
    if cfg.tie_embeddings:  # the head is the embedding; a stored copy is what transformers ignores too
        state.pop("lm_head.weight", None)
        shapes.pop("lm_head.weight")
    emb = state.get("embed_tokens.weight")
    if emb is not None and emb.shape[0] != cfg.vocab_size:
        raise UserInputError(
            f"{where}: vocab_size {cfg.vocab_size} in config.json but the embedding has {emb.shape[0]} "
            "rows; the config and the weights come from different models (after resize_token_embeddings "
            "save the config too)"
        )
    missing, extra = sorted(set(shapes) - set(state)), sorted(set(state) - set(shapes))
    if missing or extra:
        raise UserInputError(
            f"{where}: weights do not match config.json (missing {missing[:4]}, unexpected {extra[:4]}); "
            "the folder mixes files of different models"
        )
    wrong = [f"{k} {list(state[k].shape)} != {list(s)}" for k, s in shapes.items() if state[k].shape != s]
    if wrong:
        raise UserInputError(f"{where}: tensor shapes do not match config.json ({'; '.join(wrong[:3])})")
    return state


def common_dtype(state: dict[str, torch.Tensor], where: str) -> torch.dtype:
    dtypes = {t.dtype for t in state.values()}
    if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
        raise UserInputError(
            f"{where}: weights mix dtypes {sorted(map(str, dtypes))}; pass dtype= to load them in one"
        )
    return dtypes.pop()


def load_hf_model(
    path: str | os.PathLike, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None
) -> tuple[GRTransformer, HFModelInfo]:
    """An HF folder as our GRTransformer (eval mode) and what it was imported from.

    dtype None keeps the stored dtype; "float32" / "bfloat16" / "float16" (or a torch dtype) converts."""
    path = Path(path)
    cfg, summary = read_hf_config(path)
    files = weight_files(path)
    state = to_our_names(read_hf_tensors(files), cfg, str(path))
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise UserInputError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
        dtype = DTYPES[dtype]
    if dtype is None:
        dtype = common_dtype(state, str(path))
    state = {k: v.to(dtype) for k, v in state.items()}
    with torch.device("meta"):  # no random init of weights about to be replaced (GBs for 7B models)
        model = GRTransformer(cfg)
    if cfg.tie_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    model = model.to(device).eval()
    info = HFModelInfo(
        path=str(path),
        architecture=summary.architecture,
        family=summary.family,
        dtype=str(dtype).removeprefix("torch."),
        vocab_size=cfg.vocab_size,
        n_params=model.num_parameters(),
        files=tuple(f.name for f in files),
        notes=summary.notes,
    )
    return model, info
