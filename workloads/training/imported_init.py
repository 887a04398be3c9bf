"""`genrec train --init MODEL | hf:DIR`: training that starts from a Hugging Face causal LM.

`--init MODEL` (a folder from `genrec model import hf`, or an earlier run of this) with `--objective
nezha|mtp`: a draft head on the imported checkpoint's frozen backbone. `--init hf:DIR` with next_item
(issue 32, item 5): the data set's SID tokens are added to the pretrained LM in DIR (models/hf_extend.py:
tokenizer tokens + resized embedding, new rows at the old rows' mean), the extended folder is imported as
any other, and next-item prediction fine-tunes all weights (`--train all`) or only the SID tokens'
embedding and LM-head rows (`--train new-rows`). Either way:

- the dataset's items must be spellable by the checkpoint's SID token table (LC-Rec tokenizers hold only
  the codes some item uses, so codebook sizes may differ from the dataset's); item tokens come from
  that table and prompts from the checkpoint's stored template and tokenizer, as decoding builds them;
- examples are one prompt per target (the packed layouts assume our BOS + SID prompt);
- the result is again an imported checkpoint (tokenizer, template and the dataset's item SIDs beside
  it) that `genrec eval` and `load_imported_context` load like an import; from hf:DIR it also holds
  `hf/`, the fine-tuned model exported back to an HF folder (hf_beam runs transformers on it).

A head's placeholders <SP_1>..<SP_L> are the checkpoint's pad id at every level: an imported vocabulary
has no tokens of ours and a frozen backbone cannot learn new ones; the placeholder states still differ
by position and by the earlier placeholders each one attends.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from genrec.workloads.data.dataset import Dataset, load_dataset
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.checkpoint import Checkpoint, load_checkpoint
from genrec.workloads.models.hf_cache import HF_PREFIX, resolve_model
from genrec.workloads.models.hf_checkpoint import (
    TOKENIZER_FILE,
    ImportedInputs,
    import_hf_checkpoint,
    imported_inputs,
    imported_prompts,
    is_imported,
    write_checkpoint_folder,
)
from genrec.workloads.models.hf_extend import export_hf_folder, extend_hf_folder
from genrec.workloads.models.inputs import IGNORE, left_pad
from genrec.workloads.models.nezha_head import DraftHead
from genrec.workloads.tokenize.prompt_template import TEMPLATE_FILE, PromptTemplate
from genrec.workloads.tokenize.sid_tokens import sid_pattern
from genrec.workloads.training.nezha_objective import FrozenBackbone, HeadObjective, head_examples

TRAIN_ROWS = ("all", "new-rows")
COMPUTE_DTYPES = ("float32", "bfloat16")  # bfloat16: autocast over fp32 master weights
SAVE_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class InitModel:
    """The imported checkpoint a run starts from, and how to prompt it; `work` is the scratch folder of
    an hf:DIR start (extended HF folder + its import), removed when training ends."""

    folder: Path
    ckpt: Checkpoint
    inputs: ImportedInputs
    work: Path | None = None
    save_dtype: torch.dtype | None = None  # from hf:DIR: the saved model's dtype (`--save-dtype`)

    @property
    def from_hf(self) -> bool:
        return self.work is not None

    def codec_for(self, ds: Dataset, data_dir: str | os.PathLike):
        """The checkpoint's codec, once its SID table is checked to spell every item of the dataset."""
        self.ckpt.codec.table.check_item_codes(ds.item_codes(), where=f"dataset {data_dir}")
        return self.ckpt.codec

    def meta(self, data_dir: str | os.PathLike, num_items: int) -> dict:
        return init_meta(self, data_dir, num_items)

    def save(self, out, head: DraftHead | None, max_items: int, meta: dict, item_codes: np.ndarray) -> Path:
        return save_from_init(out, self, head, max_items, meta, item_codes)


def init_problems(cfg: Any) -> list[str]:
    """TrainConfig.validate's part for --init, --train, --sid-pattern, --dtype and --save-dtype."""
    init, objective, train_rows, problems = cfg.init, cfg.objective, cfg.train_rows, []
    from_hf = init.startswith(HF_PREFIX)
    if train_rows not in TRAIN_ROWS:
        problems.append(f"--train must be one of {list(TRAIN_ROWS)}, got {train_rows!r}")
    elif train_rows != "all" and not from_hf:
        problems.append("--train new-rows applies to --init hf:DIR (the rows its SID tokens add)")
    if init and objective not in ("next_item", "nezha", "mtp"):
        problems.append(
            f"--init trains next_item (from hf:DIR) or a nezha / mtp head (on an imported checkpoint "
            f"or hf:DIR), not {objective!r}"
        )
    elif init and not from_hf and objective == "next_item":
        problems.append(
            "--init MODEL (an imported checkpoint) trains a draft head on its frozen backbone; "
            "use --objective nezha or mtp, or --init hf:DIR to fine-tune, not 'next_item'"
        )
    if cfg.init_sid_pattern and not from_hf:
        problems.append("--sid-pattern applies to --init hf:DIR (an imported MODEL has its SID table)")
    elif cfg.init_sid_pattern:
        try:
            sid_pattern(cfg.init_sid_pattern)
        except UserInputError as e:
            problems.append(f"--sid-pattern: {e}")
    for flag, value, allowed in (
        ("--dtype", cfg.init_dtype, COMPUTE_DTYPES),
        ("--save-dtype", cfg.init_save_dtype, SAVE_DTYPES),
    ):
        if value and not (from_hf and objective == "next_item"):
            problems.append(f"{flag} applies to --init hf:DIR with next_item (fine-tuning the LM)")
        elif value and value not in allowed:
            problems.append(f"{flag} must be one of {list(allowed)}, got {value!r}")
    return problems


def load_init(path: str | os.PathLike, device: torch.device, work: Path | None = None) -> InitModel:
    ckpt = load_checkpoint(path, device)
    if not is_imported(ckpt):
        raise UserInputError(
            f"--init {path}: not an imported checkpoint; import one with `genrec model import hf` "
            "(a head for one of our models trains with the backbone: drop --init)"
        )
    return InitModel(Path(path), ckpt, imported_inputs(ckpt), work)


def start(cfg: Any, data_dir: str | os.PathLike, out_dir: str | os.PathLike, device: torch.device):
    """(cfg, InitModel) for a run with --init: per_example examples. A head trains on an imported
    checkpoint (hf:DIR: its cached import, models/hf_cache.py); next_item extends hf:DIR by the
    dataset's SID tokens and imports it in a scratch folder beside `out_dir` first."""
    cfg = replace(cfg, head_batching="per_example")
    if cfg.objective != "next_item":
        return cfg, load_init(
            resolve_model(cfg.init, data_dir, "--init", cfg.init_sid_pattern or None), device
        )
    from genrec.workloads.io import temp_sibling_dir

    src, work = Path(cfg.init[len(HF_PREFIX) :]), temp_sibling_dir(Path(out_dir))
    # only the codes items use are added (LC-Rec's way), so any pattern may leave codes without a token
    pattern = sid_pattern(cfg.init_sid_pattern or "lcrec", allow_gaps=True)
    try:
        codes = load_dataset(data_dir).item_codes()
        extend_hf_folder(src, work / "hf", codes, pattern)
        index = {str(i): [pattern.token(l, int(c)) for l, c in enumerate(row)] for i, row in enumerate(codes)}
        (work / "index.json").write_text(json.dumps(index))
        import_hf_checkpoint(
            work / "hf", work / "index.json", work / "init", pattern, max_items=cfg.max_items
        )
        if cfg.train_rows == "new-rows":  # decoupled decay would move the frozen rows too
            cfg = replace(cfg, weight_decay=0.0)
        init = load_init(work / "init", device, work)
        stored = init.ckpt.model.embed_tokens.weight.dtype  # the HF checkpoint's dtype (import keeps it)
        save = getattr(torch, cfg.init_save_dtype) if cfg.init_save_dtype else stored
        init.ckpt.model.float()  # master weights in fp32 whatever the checkpoint holds
        return cfg, replace(init, save_dtype=save)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def finish(init: InitModel | None) -> None:
    if init is not None and init.work is not None:
        shutil.rmtree(init.work, ignore_errors=True)


def frozen_backbone(init: InitModel, item_codes: np.ndarray, max_items: int) -> FrozenBackbone:
    """Prompts of the dataset's items through the checkpoint's template; the pad id as placeholders."""
    device, inputs = init.ckpt.model.device, init.inputs

    def prompts(histories: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return imported_prompts(inputs, item_codes, histories, max_items, device)

    return FrozenBackbone(prompts, (inputs.pad_id,) * init.ckpt.codec.levels)


def init_objective(cfg: Any, data: Any, device: torch.device, autocast: bool):
    """The objective of a run with --init: a head on the frozen backbone, or next-item fine-tuning."""
    codes = data.ds.item_codes()
    if data.init.from_hf:
        bf16 = cfg.init_dtype == "bfloat16" or (not cfg.init_dtype and autocast)  # --dtype, else CUDA's
        return NextItemOnImported(
            data.init, codes, data.item_tokens, data.seqs, data.val_windows, cfg, device, bf16
        )
    frozen = frozen_backbone(data.init, codes, cfg.max_items)
    return HeadObjective(
        cfg.objective, cfg.head_variant, data.init.ckpt.model, data.codec, data.item_tokens, codes,
        data.seqs, data.val_windows, cfg.max_items, device, autocast, cfg.head_batching, frozen,
    )  # fmt: skip


class NextItemOnImported:
    """Next-item fine-tuning of an imported model on template prompts: (history, target) examples, the
    loss on the target's L SID tokens (full-vocabulary cross-entropy, as next_item)."""

    head = None

    def __init__(
        self, init: InitModel, item_codes, item_tokens, seqs, val_windows, cfg, device, bf16: bool = False
    ) -> None:
        self.init, self.item_codes, self.item_tokens = init, np.asarray(item_codes), item_tokens
        self.bf16 = bf16  # forward and backward under bf16 autocast; the weights stay fp32
        self.max_items, self.device, self.model = cfg.max_items, device, init.ckpt.model
        self.examples = head_examples(seqs, cfg.max_items)
        self.val_examples = [(list(w[:-1]), int(w[-1])) for w in val_windows]
        self.model.train()
        self.trainable = self.model
        if cfg.train_rows == "new-rows":
            freeze_all_but_sid_rows(self.model, init.ckpt.codec)

    def lengths(self) -> list[int]:
        return [len(h) for h, _ in self.examples]

    def batch(self, pairs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Left-padded template prompt + target SID tokens; labels on the positions that predict them."""
        codes = [self.item_codes[np.asarray(h[-self.max_items :], dtype=np.int64)] for h, _ in pairs]
        prompts = self.init.inputs.encoder.encode_batch(codes)
        rows = [list(p) + self.item_tokens[t].tolist() for p, (_, t) in zip(prompts, pairs)]
        tokens, mask = left_pad(rows, self.init.inputs.pad_id, self.device)
        levels = self.item_tokens.shape[1]
        labels = torch.full_like(tokens, IGNORE)
        labels[:, -levels - 1 : -1] = tokens[:, -levels:]
        return tokens, mask, labels

    def token_losses(self, pairs) -> torch.Tensor:
        """[N, L] cross-entropy of each target SID token."""
        tokens, mask, labels = self.batch(pairs)
        sel = labels != IGNORE
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.model.lm_head(self.model.hidden_states(tokens, mask)[sel]).float()
        return F.cross_entropy(logits, labels[sel], reduction="none").view(len(pairs), -1)

    def loss(self, batch_idx: np.ndarray) -> torch.Tensor:
        return self.token_losses([self.examples[i] for i in batch_idx]).mean()

    @torch.no_grad()
    def val_losses(self, batch_size: int) -> tuple[float, list[float]]:
        self.model.eval()
        parts = [
            self.token_losses(self.val_examples[i : i + batch_size])
            for i in range(0, len(self.val_examples), batch_size)
        ]
        self.model.train()
        per_level = torch.cat(parts).mean(dim=0)
        return float(per_level.mean()), per_level.tolist()

    def history_blind_val_loss(self) -> float:
        return float("nan")  # a head objective's reference; next-item loss is per token, not per SID


def freeze_all_but_sid_rows(model: torch.nn.Module, codec) -> None:
    """`--train new-rows`: only the SID tokens' rows of the embedding and LM head get a gradient."""
    rows = np.concatenate([codec.table.level_present_ids(l) for l in range(codec.levels)])
    keep = torch.zeros(model.config.vocab_size, 1, dtype=torch.bool, device=model.device)
    keep[torch.as_tensor(rows, device=model.device)] = True
    model.requires_grad_(False)
    for p in {id(p): p for p in (model.embed_tokens.weight, model.lm_head.weight)}.values():
        p.requires_grad_(True)
        p.register_hook(lambda g: g * keep.to(g.dtype))


def init_meta(init: InitModel, data_dir: str | os.PathLike, num_items: int) -> dict:
    """The init's backbone and import records, with the dataset's catalogue as the items."""
    imported = dict(init.ckpt.meta["imported"])
    imported |= {"items_path": str(Path(data_dir).resolve()), "item_ids": [str(i) for i in range(num_items)]}
    hf = dict(init.ckpt.meta["hf"])
    source = {} if init.from_hf else {"init": str(init.folder.resolve())}  # hf:DIR's scratch import is gone
    return {"hf": hf, "imported": imported, **source}


def save_from_init(
    out: str | os.PathLike,
    init: InitModel,
    head: DraftHead | None,
    max_items: int,
    meta: dict,
    item_codes: np.ndarray,
) -> Path:
    """The model (+ head) with its tokenizer, template and the items, atomically; from hf:DIR also the
    HF export in hf/."""
    if init.from_hf:  # hf_beam runs transformers on the export of this very model, in the saved dtype
        init.ckpt.model.to(init.save_dtype or torch.float32)
        dtype = str(init.save_dtype or torch.float32).removeprefix("torch.")
        meta = meta | {"hf": meta["hf"] | {"path": str(Path(out).resolve() / "hf"), "dtype": dtype}}
    ckpt = Checkpoint(init.ckpt.model, init.ckpt.codec, max_items, meta, head=head)
    template = PromptTemplate.load(init.folder / TEMPLATE_FILE)
    tokenizer = init.folder / TOKENIZER_FILE

    def export(folder: Path) -> None:
        export_hf_folder(init.ckpt.model, init.work / "hf", tokenizer, folder / "hf")

    extra = export if init.from_hf else None
    return write_checkpoint_folder(Path(out), ckpt, init.folder, template, item_codes, extra)
