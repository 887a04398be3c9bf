"""`genrec eval`: run a registered decoder over a split and produce a result row.

Quality (HR/NDCG/Recall@K, the shares of invalid and of missing SIDs) over every evaluated user;
latency per batch after warm-up batches that are decoded but not timed. The same function
evaluates the most-popular baseline, so it is measured exactly like the model decoders.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from genrec.workloads.data.dataset import Dataset, load_dataset
from genrec.workloads.decoding.base import DecoderContext, get_decoder, make_params
from genrec.workloads.decoding.draft import checkpoint_codebook_sizes, load_draft
from genrec.workloads.decoding.needs import require_needs
from genrec.workloads.errors import UserInputError
from genrec.workloads.metrics import latency_summary, ranking_metrics
from genrec.workloads.models.checkpoint import Checkpoint, load_checkpoint
from genrec.workloads.models.hf_checkpoint import imported_inputs, imported_item_codes, is_imported
from genrec.workloads.progress import bar_enabled
from genrec.workloads.results import ResultRow, current_environment, peak_memory_mb
from genrec.workloads.training.trainer import resolve_device


@dataclass
class EvalConfig:
    decoder: str = "beam"
    # the decoder's Params (typed and validated, e.g. by genrec.platform.params.eval_params), or a dict
    # of values for workloads-internal callers, e.g. {"beam_width": 10}
    params: Any = field(default_factory=dict)
    split: str = "test"
    ks: tuple[int, ...] = (5, 10)
    batch_size: int = 64
    warmup_batches: int = 2
    max_users: int = 0  # 0 = every user with a target in the split
    device: str = "auto"
    threads: int = 0
    seed: int = 0
    experiment: str = "adhoc"
    # timed passes over the split: quality comes from the first, latency is the median over passes
    # with the smallest and largest pass beside it (a shared machine moves single runs 20-50x)
    repeats: int = 1

    def validate(self) -> None:
        if self.split not in ("valid", "test"):
            raise UserInputError(f"split must be valid or test, got {self.split!r}")
        if not self.ks or min(self.ks) < 1:
            raise UserInputError(f"--k values must be >= 1, got {list(self.ks)}")
        if self.batch_size < 1:
            raise UserInputError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.repeats < 1:
            raise UserInputError(f"repeats must be >= 1, got {self.repeats}")


@dataclass
class EvalOutput:
    row: ResultRow
    ranked: list[list[int]]  # item ids per user, best first (-1 = invalid SID)
    targets: list[list[int]]
    user_ids: list[int]
    batch_size: int = 1
    batch_latency_ms: list[float] = field(default_factory=list)  # the first timed pass, per decode call

    def per_user(self):
        """The per-user outcomes (genrec.workloads.per_user) as an Arrow table."""
        from genrec.workloads.per_user import per_user_table

        return per_user_table(
            self.user_ids, self.ranked, self.targets, self.batch_size, self.batch_latency_ms
        )


def load_context(
    model_dir: str | os.PathLike,
    data_dir: str | os.PathLike | None,
    device: str = "auto",
    draft_dir: str | os.PathLike | None = None,
) -> tuple[DecoderContext, Dataset, Checkpoint]:
    """Load a checkpoint and the dataset it was trained on (or `data_dir`), checking they fit; with
    `draft_dir`, also AtSpeed's draft model (same codec, same device) as `ctx.draft_model`."""
    if draft_dir is not None:  # a missing draft folder fails before the target's weights are read
        checkpoint_codebook_sizes(draft_dir)
    ckpt = load_checkpoint(model_dir, resolve_device(device))
    data_dir = data_dir or ckpt.meta.get("dataset")
    if not data_dir:
        raise UserInputError(f"{model_dir}: the checkpoint names no dataset; pass --data DIR")
    ds = load_dataset(data_dir)
    if is_imported(ckpt):  # the SID table, not codebook sizes, says which items the tokenizer can spell
        ckpt.codec.table.check_item_codes(ds.item_codes(), where=f"dataset {data_dir}")
    elif tuple(ds.codec.codebook_sizes) != ckpt.codec.codebook_sizes:
        raise UserInputError(
            f"dataset {data_dir} has codebook sizes {ds.codec.codebook_sizes}, but the model was trained "
            f"for {ckpt.codec.codebook_sizes}; evaluate on the dataset the model was trained on"
        )
    draft, draft_codec = load_draft(draft_dir, ckpt, model_dir) if draft_dir is not None else (None, None)
    ctx = DecoderContext(
        ckpt.model,
        ckpt.codec,
        ds.item_codes(),
        ckpt.max_items,
        ds.item_popularity("train"),
        ckpt.head,
        draft_model=draft,
        imported=imported_inputs(ckpt) if is_imported(ckpt) else None,
        draft_codec=draft_codec,
    )
    return ctx, ds, ckpt


def backbone_of(ctx: DecoderContext) -> dict[str, object]:
    """What result rows record of the model: an imported checkpoint's HF backbone, or ours."""
    model = ctx.model
    if ctx.imported is not None:
        return dict(ctx.imported.backbone)
    dtype = str(model.embed_tokens.weight.dtype).removeprefix("torch.")
    vocab = model.config.vocab_size
    return {"family": "genrec", "n_params": model.num_parameters(), "dtype": dtype, "vocab_size": vocab}


def load_imported_context(
    model_dir: str | os.PathLike,
    device: str = "auto",
    draft_dir: str | os.PathLike | None = None,
    popularity: np.ndarray | None = None,
) -> tuple[DecoderContext, Checkpoint]:
    """A checkpoint from `genrec model import hf` with the catalogue stored beside it (no dataset folder):
    prompts from its template and tokenizer, hf_beam on its original folder, AtSpeed's draft if given
    (an imported checkpoint with the same SID tokens). `popularity` (train interactions per item) enables
    the popular baseline and `constraint=cold_start`."""
    ckpt = load_checkpoint(model_dir, resolve_device(device))
    if not is_imported(ckpt):
        fix = "import one with `genrec model import hf` (or use load_context for our checkpoints)"
        raise UserInputError(f"{model_dir}: not an imported checkpoint; {fix}")
    draft, draft_codec = load_draft(draft_dir, ckpt, model_dir) if draft_dir is not None else (None, None)
    codes = imported_item_codes(ckpt)
    ctx = DecoderContext(
        ckpt.model, ckpt.codec, codes, ckpt.max_items, popularity, ckpt.head, draft, imported_inputs(ckpt),
        draft_codec,
    )  # fmt: skip
    return ctx, ckpt


def eval_defaults(params_type: type, ks: tuple[int, ...]) -> dict[str, Any]:
    """Defaults derived from the cut-offs: k = the largest K, and a beam at least that wide. Only
    defaults: a k the caller gives is checked against the beam width, never widened past it."""
    defaults = {f.name: f.default for f in fields(params_type)}
    out: dict[str, Any] = {}
    if "k" in defaults:
        out["k"] = max(ks)
    if "beam_width" in defaults:
        out["beam_width"] = max(max(ks), defaults["beam_width"])
    return out


def resolve_params(decoder_name: str, params: Any, ks: tuple[int, ...]) -> Any:
    """The decoder's Params for an evaluation with cut-offs `ks`: a Params object as given (typed by
    the platform's adapter), or a dict of values over `eval_defaults`; its k must cover every K."""
    decoder = get_decoder(decoder_name)
    if isinstance(params, Mapping):
        params = make_params(decoder, {**eval_defaults(decoder.Params, ks), **params})
    elif type(params) is not decoder.Params:
        raise UserInputError(
            f"decoder {decoder_name!r} takes {decoder.Params.__name__}, got {type(params).__name__}"
        )
    k = getattr(params, "k", None)
    if k is not None and k < max(ks):
        raise UserInputError(f"decoder k={k} is smaller than the largest --k {max(ks)}")
    return params


def pass_quality(first, targets: list, ks: tuple[int, ...]) -> dict[str, float]:
    """Ranking metrics of a timed pass's lists, plus the shares of all returned slots that were invalid
    (an SID outside the catalogue) or missing (no SID at all), and of users with K valid items."""
    quality = ranking_metrics(first.ranked, targets, ks)
    valid, missing = np.concatenate(first.valid_flags), np.concatenate(first.missing_flags)
    quality["invalid_rate"] = float((~valid & ~missing).mean())
    quality["missing_rate"] = float(missing.mean())
    quality["users_with_k_valid"] = float(np.concatenate(first.full_lists).mean())
    return quality


def evaluate(
    ctx: DecoderContext,
    ds: Dataset,
    cfg: EvalConfig,
    model_name: str = "",
    progress: bool = True,
    draft_name: str = "",
) -> EvalOutput:
    """Decode `cfg.split` with `cfg.decoder` and build its result row; `draft_name` labels the draft
    model loaded into `ctx` (`model_label(draft_dir)`), recorded in the row's `draft` column."""
    cfg.validate()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    decoder = get_decoder(cfg.decoder)
    params = resolve_params(cfg.decoder, cfg.params, cfg.ks)
    require_needs(type(decoder), ctx)  # a missing draft / head fails before any batch is decoded
    examples = ds.eval_examples(cfg.split)
    if cfg.max_users:
        examples = examples[: cfg.max_users]
    if not examples:
        raise UserInputError(f"{ds.root}: no user has both history and a {cfg.split} target")
    batches = [examples[i : i + cfg.batch_size] for i in range(0, len(examples), cfg.batch_size)]

    for batch in batches[: cfg.warmup_batches]:  # warm-up: allocator, kernels, caches; not timed
        decoder.decode(ctx, [ex.history for ex in batch], params)

    passes = [_timed_pass(decoder, ctx, batches, params, cfg, progress, keep=True)]
    for r in range(1, cfg.repeats):  # more timed passes: only their clocks are kept
        passes.append(_timed_pass(decoder, ctx, batches, params, cfg, progress, keep=False, repeat=r))
    first = passes[0]
    ranked = first.ranked

    targets = [ex.targets for ex in examples]
    quality = pass_quality(first, targets, cfg.ks)
    row = ResultRow(
        decoder=cfg.decoder,
        decoder_params=asdict(params),
        dataset=ds.manifest.name,
        model=model_name,
        draft=draft_name,
        backbone=backbone_of(ctx),
        split=cfg.split,
        env=current_environment(ctx.device),
        quality=quality,
        latency_ms=latency_over_passes([p.latencies for p in passes]),
        timings_ms={k: v / len(batches) for k, v in first.phase_totals.items()},
        counters={k: v / len(batches) for k, v in first.counter_totals.items()},
        users=len(examples),
        batch_size=cfg.batch_size,
        throughput_users_per_s=float(np.median([len(examples) / p.wall_s for p in passes])),
        repeats=cfg.repeats,
        memory_peak_mb=peak_memory_mb(ctx.device),
        seed=cfg.seed,
        experiment=cfg.experiment,
    )
    user_ids = [ex.user_id for ex in examples]
    return EvalOutput(row, ranked, targets, user_ids, cfg.batch_size, list(first.latencies))


@dataclass
class TimedPass:
    """One timed pass over the evaluation batches; a kept pass also holds what was decoded."""

    latencies: list[float] = field(default_factory=list)  # ms per batch
    wall_s: float = 0.0
    ranked: list[list[int]] = field(default_factory=list)
    valid_flags: list[np.ndarray] = field(default_factory=list)
    missing_flags: list[np.ndarray] = field(default_factory=list)
    full_lists: list[np.ndarray] = field(default_factory=list)
    phase_totals: dict[str, float] = field(default_factory=dict)
    counter_totals: dict[str, float] = field(default_factory=dict)


def _timed_pass(
    decoder: Any,
    ctx: DecoderContext,
    batches: list,
    params: Any,
    cfg: EvalConfig,
    progress: bool,
    keep: bool,
    repeat: int = 0,
) -> TimedPass:
    out = TimedPass()
    desc = f"eval {cfg.decoder}" + (f" (repeat {repeat + 1}/{cfg.repeats})" if repeat else "")
    t_start = time.perf_counter()
    for batch in tqdm(
        batches, disable=not bar_enabled(progress), desc=desc, unit="batch", dynamic_ncols=True
    ):
        t0 = time.perf_counter_ns()
        res = decoder.decode(ctx, [ex.history for ex in batch], params)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        out.latencies.append((time.perf_counter_ns() - t0) / 1e6)
        if not keep:
            continue
        out.ranked += res.item_ids.cpu().tolist()
        out.valid_flags.append(res.valid.cpu().numpy().reshape(-1))
        # a slot with score -inf holds no SID (e.g. STATIC found fewer valid completions than k)
        out.missing_flags.append((~torch.isfinite(res.scores)).cpu().numpy().reshape(-1))
        out.full_lists.append(res.valid.all(dim=1).cpu().numpy())  # users given k items, all valid
        for k, v in res.timings_ms.items():
            out.phase_totals[k] = out.phase_totals.get(k, 0.0) + v
        for k, v in res.counters.items():
            out.counter_totals[k] = out.counter_totals.get(k, 0.0) + v
    out.wall_s = time.perf_counter() - t_start
    return out


def latency_over_passes(passes: list[list[float]]) -> dict[str, float]:
    """Per-batch latency statistics of each pass, then their median over passes; with two or more
    passes also `<stat>_lo` / `<stat>_hi`, the smallest and largest pass (the run-to-run spread)."""
    per_pass = [latency_summary(lat) for lat in passes]
    out = {k: float(np.median([s[k] for s in per_pass])) for k in per_pass[0]}
    if len(per_pass) > 1:
        for k in ("mean", "p50", "p90", "p99"):
            out[f"{k}_lo"] = min(s[k] for s in per_pass)
            out[f"{k}_hi"] = max(s[k] for s in per_pass)
    return out


def shown_params(row: ResultRow, all_params: bool = False) -> dict[str, Any]:
    """The parameters a table shows for a row: those set away from the decoder's defaults (what the
    user chose, or eval derived from --k), or every one with all_params."""
    if all_params:
        return dict(row.decoder_params)
    try:
        defaults = {f.name: f.default for f in fields(get_decoder(row.decoder).Params)}
    except Exception:  # noqa: BLE001 - an unregistered decoder: show everything
        return dict(row.decoder_params)
    return {k: v for k, v in row.decoder_params.items() if k not in defaults or defaults[k] != v}


def format_table(rows: list[ResultRow], ks: tuple[int, ...], all_params: bool = False) -> str:
    """A plain-text table, one line per result row: quality first (recall, hr, ndcg at each K), the
    invalid and missing shares, latency; parameters only where they differ from the defaults
    (all_params: all)."""
    rates = ["invalid_rate", "missing_rate"]
    metric_cols = [f"{m}@{k}" for m in ("recall", "hr", "ndcg") for k in ks] + rates
    header = ["decoder", "params", *metric_cols, "p50 ms", "p99 ms", "users/s"]
    lines = []
    for r in rows:
        params = ",".join(f"{k}={v}" for k, v in shown_params(r, all_params).items()) or "defaults"
        lines.append(
            [r.decoder, params]
            + [f"{r.quality.get(c, float('nan')):.4f}" for c in metric_cols]
            + [
                f"{r.latency_ms.get('p50', 0):.2f}" + _range_text(r.latency_ms, "p50"),
                f"{r.latency_ms.get('p99', 0):.2f}",
                f"{r.throughput_users_per_s:.1f}",
            ]
        )
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(
        [fmt.format(*header), fmt.format(*("-" * w for w in widths)), *(fmt.format(*l) for l in lines)]
    )


def _range_text(latency_ms: dict[str, float], stat: str) -> str:
    """' [lo-hi]' over repeated passes, '' for one pass."""
    if f"{stat}_lo" not in latency_ms:
        return ""
    return f" [{latency_ms[f'{stat}_lo']:.2f}-{latency_ms[f'{stat}_hi']:.2f}]"


def model_label(model_dir: str | os.PathLike) -> str:
    return Path(model_dir).resolve().name
