"""AtSpeed teacher data: the target model's top-K SIDs for every draft training example, cached once.

`genrec atspeed teacher` runs the target's beam search (or, with `sampling`, sampling beam search at
temperature 1; or, with a mixture draft, the beam search of the paper's D' below) once over the
training examples and stores the K SIDs with their sequence log-probabilities in one Parquet file, so
every draft objective (SeqKD, AtSpeed-S, AtSpeed-R) trains from the same cached data.

Which prompts. Draft training cuts each user's train sequence into next-item windows
(`inputs.training_windows(sequences, max_items)`, users in ascending id order, exactly as
`trainer.train` does). Teacher example i belongs to training window i: its prompt is the window
without its last item (the history before the window's last target, at most `max_items` items) and
`target_item` is that last item. The trainer checks row by row that the file's prompts are its own
windows' prompts, so a file built for other windows (another dataset, another `max_items`, rows
shifted by one) is refused instead of silently misaligning teacher and example.

The search is constrained to catalogue items (`constraint="all"`: the paper's constrained top-K),
with beam width K and k = K; rows keep the decoder's order (best first). For `sampling`, each batch
of `batch_size` examples is decoded with seed `seed + batch number`, so a file is reproducible for
the same seed and batch size (recorded in the manifest).

Mixture (kind "mixture", `TeacherMixture`): the paper's D' = {(x, TopK((1 - lambda) M_q(x) +
lambda M_p(x)))}, the beam search over the per-token mixture of a draft q and the target p
(decoding/mixture_model.py); lambda = 1 is kind "beam". The logprobs column still holds the target's
sequence log-probabilities: the chosen SIDs are rescored by the target with teacher forcing, and each
row is stored in the target's order (best first under p; `best_first` says why). The manifest adds
`mix_draft` and `mix_lambda`; files of the other kinds have neither and load as before.

File layout: one row per example, in example order,
    example      int64              the example (training window) index, 0..N-1
    user_id      int64
    prompt       list<int64>        the prompt's item ids, oldest first
    target_item  int64              the item the window predicts there (ground truth)
    codes        list<list<int64>>  [K][L] the teacher SIDs, best first (by target log-probability)
    logprobs     list<float64>      [K] their sequence log-probabilities under the target
    kind         string             beam | sample | mixture
and the manifest (target path, dataset, k, kind, seed, batch size, max_items, codec; for a mixture its
draft and lambda) as JSON in the Parquet schema metadata under `genrec.teacher`. Written to a
temporary sibling, then renamed.

All steps (`all_steps`, kinds "beam" and "sample"): the manifest's `all_steps` is true and a `step_codes`
column holds the target's beam after every level but the last (teacher_steps.py, the paper's Table 5
"w/ AD"); files without the key have no such column and load as before.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from genrec.workloads.data.dataset import Dataset
from genrec.workloads.decoding.base import DecoderContext, get_decoder, make_params
from genrec.workloads.decoding.mixture_model import check_mix_lambda, mixture_context
from genrec.workloads.errors import UserInputError
from genrec.workloads.io import write_parquet_atomic
from genrec.workloads.models.inputs import training_windows
from genrec.workloads.progress import bar_enabled
from genrec.workloads.sid_codec import SIDCodec
from genrec.workloads.training.align_context_tree import teacher_forced_log_probs
from genrec.workloads.training.teacher_steps import STEP_COLUMN, beam_with_steps, read_step_codes

MANIFEST_KEY = b"genrec.teacher"
FORMAT = "genrec-atspeed-teacher"
FORMAT_VERSION = 1
KINDS = ("beam", "sample", "mixture")
MIXTURE_KEYS = ("mix_draft", "mix_lambda")  # manifest keys of kind "mixture" only (v1 files lack them)
COLUMNS = ("example", "user_id", "prompt", "target_item", "codes", "logprobs", "kind")


@dataclass(frozen=True)
class TeacherExample:
    """One draft training example: training window `index`, its prompt and the item after it."""

    index: int
    user_id: int
    prompt: list[int]  # item ids, oldest first
    target_item: int


def teacher_examples(ds: Dataset, max_items: int) -> list[TeacherExample]:
    """One example per next-item training window, in the trainer's window order (see module doc)."""
    out: list[TeacherExample] = []
    for user, seq in ds.user_sequences(("train",)).items():  # ascending user id, as the trainer's
        for window, _ in training_windows([seq], max_items):
            out.append(TeacherExample(len(out), int(user), list(window[:-1]), int(window[-1])))
    return out


@dataclass
class TeacherData:
    """A loaded teacher file: arrays indexed by example (= training window) number."""

    path: Path
    manifest: dict[str, Any]
    user_id: np.ndarray  # [N]
    prompts: list[list[int]]
    target_item: np.ndarray  # [N]
    codes: np.ndarray  # [N, K, L] int64, best first
    logprobs: np.ndarray  # [N, K] float64
    # [N, L - 1, K, L] the target's beam after each level but the last (teacher_steps.py), or None
    step_codes: np.ndarray | None = None

    @property
    def k(self) -> int:
        return int(self.codes.shape[1])

    @property
    def kind(self) -> str:
        return str(self.manifest["kind"])

    @property
    def mix_lambda(self) -> float | None:
        """The target's weight in the mixture the SIDs came from (kind "mixture"; None otherwise)."""
        value = self.manifest.get("mix_lambda")
        return None if value is None else float(value)

    def __len__(self) -> int:
        return len(self.prompts)


@dataclass(frozen=True)
class TeacherMixture:
    """Build the paper's D': decode the token-level mixture (1 - mix_lambda) q + mix_lambda p of the
    context's draft q (`DecoderContext.draft_model`) and its target p instead of p alone."""

    mix_lambda: float  # the target's weight, in [0, 1]
    draft_path: str = ""  # the draft checkpoint, recorded (resolved) in the manifest

    def __post_init__(self) -> None:
        check_mix_lambda(self.mix_lambda)


def check_mixture_kind(mixture: TeacherMixture | None, sampling: bool) -> None:
    """A teacher file is one kind: the target's sampling beam search or the mixture's beam top-K."""
    if mixture is not None and sampling:
        raise UserInputError(
            "--sampling and --mix-draft build different teacher data (sampling beam search of the "
            "target, or the beam top-K of the mixture); drop one of them"
        )


def build_teacher_data(
    target_ctx: DecoderContext,
    dataset: Dataset,
    k: int,
    out_path: str | os.PathLike,
    sampling: bool = False,
    seed: int = 0,
    batch_size: int = 64,
    max_items: int | None = None,
    target_path: str | os.PathLike = "",
    progress: bool = True,
    mixture: TeacherMixture | None = None,
    all_steps: bool = False,
) -> Path:
    """Decode every training example with the target (or the mixture) and write the teacher file.

    `max_items` is the draft's prompt window (default: the target's); it may not exceed the
    target's, or the target would see a shorter history than the draft is trained on. `all_steps`
    also stores the target's beams after every level (not for a mixture; teacher_steps.py).
    """
    out_path = Path(out_path)
    max_items = target_ctx.max_items if max_items is None else max_items
    check_build_args(target_ctx, dataset, k, out_path, batch_size, max_items)
    check_mixture_kind(mixture, sampling)
    if all_steps and mixture is not None:
        raise UserInputError("--all-steps stores the target's own beams after every level; drop --mix-draft")
    examples = teacher_examples(dataset, max_items)
    if not examples:
        raise UserInputError(
            f"{dataset.root}: no user has two or more train interactions, so there are no training "
            "examples to build teacher data for"
        )
    kind = "mixture" if mixture is not None else "sample" if sampling else "beam"
    ctx = mixture_context(target_ctx, mixture.mix_lambda) if mixture is not None else target_ctx
    codes, logprobs, steps = [], [], []
    batches = decode_batches(ctx, examples, k, kind, seed, batch_size, progress, all_steps)
    for chunk, top, scores, step in batches:
        if mixture is not None:  # the logprobs column means "under the target" for every kind
            top, scores = best_first(top, target_log_probs(target_ctx, chunk, top, max_items))
        codes.append(top)
        logprobs.append(scores)
        steps.append(step)
    manifest = teacher_manifest(dataset, target_path, k, kind, seed, batch_size, max_items, len(examples))
    manifest["codebook_sizes"] = list(ctx.codec.codebook_sizes)  # the target's codes (an import's table)
    if mixture is not None:
        draft = str(Path(mixture.draft_path).resolve()) if mixture.draft_path else ""
        manifest.update(mix_draft=draft, mix_lambda=mixture.mix_lambda)
    if all_steps:
        manifest["all_steps"] = True
    step_codes = np.concatenate(steps) if all_steps else None
    table = teacher_table(
        examples, np.concatenate(codes), np.concatenate(logprobs), kind, manifest, step_codes
    )
    return write_parquet_atomic(table, out_path)


def teacher_manifest(
    dataset: Dataset,
    target_path: str | os.PathLike,
    k: int,
    kind: str,
    seed: int,
    batch_size: int,
    max_items: int,
    examples: int,
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "target": str(Path(target_path).resolve()) if target_path else "",
        "dataset": str(Path(dataset.root).resolve()),
        "dataset_name": dataset.manifest.name,
        "k": k,
        "kind": kind,
        "seed": seed,
        "batch_size": batch_size,
        "max_items": max_items,
        "constraint": "all",
        "codebook_sizes": list(dataset.codec.codebook_sizes),
        "examples": examples,
    }


def decode_batches(
    ctx: DecoderContext,
    examples: list[TeacherExample],
    k: int,
    kind: str,
    seed: int,
    batch_size: int,
    progress: bool,
    all_steps: bool = False,
) -> Iterator[tuple[list[TeacherExample], np.ndarray, np.ndarray, np.ndarray | None]]:
    """(examples, codes [B, K, L], scores [B, K], steps) per batch of `ctx`'s constrained top-K at
    beam K: beam search, or sampling beam search seeded `seed + batch number` for kind "sample";
    `steps` the beam after every level ([B, L - 1, K, L], teacher_steps.py) with `all_steps`, else None."""
    sampling = kind == "sample"
    decoder = get_decoder("beam_sample" if sampling else "beam")
    base = {"beam_width": k, "k": k, "constraint": "all"}
    starts = range(0, len(examples), batch_size)
    bar = tqdm(
        starts,
        disable=not bar_enabled(progress),
        desc=f"teacher {kind} K={k}",
        unit="batch",
        dynamic_ncols=True,
    )
    for number, start in enumerate(bar):
        chunk = examples[start : start + batch_size]
        params = make_params(decoder, {**base, "seed": seed + number} if sampling else base)
        steps = None
        if all_steps:
            res, steps = beam_with_steps(ctx, [ex.prompt for ex in chunk], params)
        else:
            res = decoder.decode(ctx, [ex.prompt for ex in chunk], params)
        valid = res.valid.cpu().numpy()
        if not valid.all():
            row = chunk[int(np.argwhere(~valid.all(axis=1))[0, 0])].index
            who = "mixture" if kind == "mixture" else "target"
            raise UserInputError(
                f"the {who} returned fewer than {k} catalogue items for example {row}; lower --k"
            )
        codes = res.codes.cpu().numpy().astype(np.int64)
        yield chunk, codes, res.scores.float().cpu().numpy().astype(np.float64), steps


def target_log_probs(
    ctx: DecoderContext, chunk: list[TeacherExample], codes: np.ndarray, max_items: int
) -> np.ndarray:
    """[B, K] the target's teacher-forced sequence log-probabilities of `codes` [B, K, L]."""
    prompts = [ex.prompt for ex in chunk]
    scores = teacher_forced_log_probs(ctx.model, prompts, codes, ctx.item_tokens, ctx.codec, max_items)
    return scores.double().cpu().numpy()


def best_first(codes: np.ndarray, logprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's SIDs sorted by target log-probability, best first (ties keep the search's order).

    Mixture rows are stored in the target's order, not the mixture's, so every file reads alike: the
    logprobs column descends, the top-1 SID (the trainer's --top1) is the target's favourite of the
    set, and AtSpeed-S's y_K (the K-th SID) is the set's K-th in p, as the paper's p(y_K) reads."""
    order = np.argsort(-logprobs, axis=1, kind="stable")
    return np.take_along_axis(codes, order[..., None], axis=1), np.take_along_axis(logprobs, order, axis=1)


def check_build_args(
    ctx: DecoderContext, ds: Dataset, k: int, out_path: Path, batch_size: int, max_items: int
) -> None:
    if k < 1:
        raise UserInputError(f"--k must be >= 1, got {k}")
    if k > len(ctx.item_codes):
        raise UserInputError(f"--k {k} exceeds the catalogue's {len(ctx.item_codes)} items; lower --k")
    if batch_size < 1:
        raise UserInputError(f"--batch-size must be >= 1, got {batch_size}")
    if not 1 <= max_items <= ctx.max_items:
        raise UserInputError(
            f"--max-items {max_items} must be in 1..{ctx.max_items} (the target's prompt window)"
        )
    if out_path.suffix != ".parquet":
        raise UserInputError(f"--out {out_path}: name a .parquet file")
    if ctx.imported is None and tuple(ds.codec.codebook_sizes) != tuple(ctx.codec.codebook_sizes):
        # (an imported target's SID table was checked to spell every item when the context loaded)
        raise UserInputError(
            f"dataset {ds.root} has codebook sizes {ds.codec.codebook_sizes}, the target "
            f"{ctx.codec.codebook_sizes}; build teacher data on the target's dataset"
        )


def teacher_table(
    examples: list[TeacherExample],
    codes: np.ndarray,
    logprobs: np.ndarray,
    kind: str,
    manifest: dict,
    step_codes: np.ndarray | None = None,
) -> pa.Table:
    n, k, levels = codes.shape
    if n != len(examples) or logprobs.shape != (n, k):
        raise ValueError(f"{len(examples)} examples but codes {codes.shape} and logprobs {logprobs.shape}")
    columns = {
        "example": pa.array([ex.index for ex in examples], pa.int64()),
        "user_id": pa.array([ex.user_id for ex in examples], pa.int64()),
        "prompt": pa.array([ex.prompt for ex in examples], pa.list_(pa.int64())),
        "target_item": pa.array([ex.target_item for ex in examples], pa.int64()),
        "codes": _lists(_lists(pa.array(codes.reshape(-1), pa.int64()), levels), k),
        "logprobs": _lists(pa.array(logprobs.reshape(-1), pa.float64()), k),
        "kind": pa.array([kind] * n, pa.string()),
    }
    if step_codes is not None:
        if step_codes.shape != (n, levels - 1, k, levels):
            raise ValueError(f"step codes {step_codes.shape}, expected {(n, levels - 1, k, levels)}")
        flat = pa.array(step_codes.reshape(-1), pa.int64())
        columns[STEP_COLUMN] = _lists(_lists(_lists(flat, levels), k), levels - 1)
    table = pa.table(columns)
    return table.replace_schema_metadata({MANIFEST_KEY: json.dumps(manifest, sort_keys=True).encode()})


def _lists(values: pa.Array, size: int) -> pa.ListArray:
    """Equal-length lists of `size` consecutive values (plain lists: any Parquet reader takes them)."""
    offsets = pa.array(np.arange(len(values) // size + 1, dtype=np.int32) * size, pa.int32())
    return pa.ListArray.from_arrays(offsets, values)


def load_teacher(path: str | os.PathLike) -> TeacherData:
    """Read a teacher file, checking its layout (every row K SIDs of L codes, rows in example order)."""
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"{path}: no such teacher file; build one with `genrec atspeed teacher`")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise UserInputError(
            f"{path}: not a Parquet file ({e}); rebuild it with `genrec atspeed teacher`"
        ) from e
    raw = (table.schema.metadata or {}).get(MANIFEST_KEY)
    missing = [c for c in COLUMNS if c not in table.column_names]
    if raw is None or missing:
        raise UserInputError(
            f"{path}: not a teacher file (missing {missing or 'its manifest'}); "
            "build one with `genrec atspeed teacher`"
        )
    manifest = json.loads(raw)
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise UserInputError(
            f"{path}: teacher format {manifest.get('format')!r} v{manifest.get('format_version')}, "
            f"expected {FORMAT!r} v{FORMAT_VERSION}; rebuild it"
        )
    check_kind(path, manifest)
    n, k, levels = table.num_rows, int(manifest["k"]), len(manifest["codebook_sizes"])
    example = table.column("example").to_numpy()
    if not np.array_equal(example, np.arange(n)):
        raise UserInputError(f"{path}: rows are not in example order 0..{n - 1}; rebuild the file")
    codes_col = table.column("codes").combine_chunks()
    inner = codes_col.flatten()
    lp_col = table.column("logprobs").combine_chunks()
    shapes_ok = (
        n > 0
        and pc.all(pc.equal(pc.list_value_length(codes_col), k)).as_py()
        and pc.all(pc.equal(pc.list_value_length(inner), levels)).as_py()
        and pc.all(pc.equal(pc.list_value_length(lp_col), k)).as_py()
    )
    if not shapes_ok:
        raise UserInputError(f"{path}: every row must hold {k} SIDs of {levels} codes and {k} log-probs")
    return TeacherData(
        path=path,
        manifest=manifest,
        user_id=table.column("user_id").to_numpy(),
        prompts=table.column("prompt").to_pylist(),
        target_item=table.column("target_item").to_numpy(),
        codes=inner.flatten().to_numpy().astype(np.int64).reshape(n, k, levels),
        logprobs=lp_col.flatten().to_numpy().astype(np.float64).reshape(n, k),
        step_codes=read_step_codes(table, n, k, levels, path) if manifest.get("all_steps") else None,
    )


def check_kind(path: Path, manifest: dict[str, Any]) -> None:
    """A known kind; a mixture file names its draft and lambda (files of the other kinds, older than
    the mixture, have no such keys and need none)."""
    kind = manifest.get("kind")
    if kind not in KINDS:
        raise UserInputError(f"{path}: teacher kind {kind!r}, expected one of {list(KINDS)}; rebuild it")
    missing = [key for key in MIXTURE_KEYS if key not in manifest]
    if kind == "mixture" and missing:
        raise UserInputError(f"{path}: a mixture teacher file without {missing} in its manifest; rebuild it")


def check_teacher_matches(
    teacher: TeacherData,
    windows: list[tuple[list[int], int]],
    codec: SIDCodec,
    item_codes: np.ndarray,
    max_items: int,
    target: str | os.PathLike = "",
) -> None:
    """Refuse a teacher file that was not built for these training windows, codec, items or target.

    Row i must hold the prompt of window i (the window without its last item) and that last item:
    checked for every row, so a shifted file (the off-by-one of the reference code) cannot train.
    Every teacher SID must be a catalogue item (`item_codes` [num_items, L]).
    """
    m, where = teacher.manifest, teacher.path
    if tuple(m["codebook_sizes"]) != codec.codebook_sizes:
        raise UserInputError(
            f"{where}: built for codebook sizes {m['codebook_sizes']}, the dataset has "
            f"{list(codec.codebook_sizes)}; rebuild the teacher file on this dataset"
        )
    if int(m["max_items"]) != max_items:
        raise UserInputError(
            f"{where}: built with max_items {m['max_items']}, the draft trains with {max_items}; "
            f"pass --max-items {m['max_items']} or rebuild the teacher file"
        )
    if len(teacher) != len(windows):
        raise UserInputError(
            f"{where}: {len(teacher)} rows, but the dataset has {len(windows)} training windows; "
            "rebuild the teacher file on this dataset"
        )
    for i, (window, _) in enumerate(windows):
        if teacher.prompts[i] != list(window[:-1]) or int(teacher.target_item[i]) != window[-1]:
            raise UserInputError(
                f"{where}: row {i} holds another example's prompt than training window {i} "
                "(rows shifted or another dataset); rebuild the teacher file"
            )
    if not np.isin(codec.codes_to_keys(teacher.codes), codec.codes_to_keys(item_codes)).all():
        raise UserInputError(f"{where}: holds SIDs that are no catalogue item; rebuild it on this dataset")
    if target and m.get("target") and Path(target).resolve() != Path(m["target"]):
        raise UserInputError(
            f"{where}: built from target {m['target']}, but --target is {target}; "
            "pass that target or rebuild the teacher file"
        )
