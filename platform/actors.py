"""DecoderHost / DecoderActor: a checkpoint and its decoders loaded once, serving `decode(batch)`.

`DecoderHost` is a plain class (testable without Ray): it loads the model, the dataset and (for
AtSpeed's decoders) a draft model once, pins torch threads, resolves each registered decoder's
parameters once, warms every decoder up, and then decodes batches of histories, returning
per-request items plus the batch's timings and counters (the same phase names and counters as a
result row).

Users of it:
* a DecoderActor (a `ray.remote(DecoderHost)` actor), started with `start_decoder_actor`, which asks
  for a GPU when the cluster has one;
* the Serve app (`genrec.platform.serve.app`): each replica owns one host;
* sweep trials (`genrec.platform.sweep.trial.run_trial`): `cached_host` keeps one host per worker process,
  because Tune reuses worker processes between trials and loading a model per trial would dominate
  short trials.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import torch

from genrec.platform.params import parse_decoder_params
from genrec.workloads.decoding.base import DecoderContext, decoder_names, get_decoder
from genrec.workloads.decoding.draft import draft_needed_message, needs_draft
from genrec.workloads.errors import UserInputError


@dataclass
class HostConfig:
    model: str  # checkpoint folder
    data: str | None = None  # dataset folder; None: the one recorded in the checkpoint
    draft: str | None = None  # AtSpeed's draft checkpoint (same codec), loaded beside the model; None: none
    device: str = "auto"  # auto: cuda when visible, else cpu
    threads: int = 0  # torch intra-op threads; 0: leave torch's default
    decoders: tuple[str, ...] = ("beam",)
    defaults: dict[str, dict[str, Any]] = field(default_factory=dict)  # per-decoder parameter defaults
    warmup_batches: int = 2
    warmup_batch_size: int = 4

    def validate(self) -> None:
        known = decoder_names()
        unknown = [d for d in self.decoders if d not in known]
        if not self.decoders or unknown:
            raise UserInputError(f"decoders {unknown or '[]'}: choose one or more of {known}")
        drafted = [d for d in self.decoders if needs_draft(d)]
        if drafted and not self.draft:
            raise UserInputError(draft_needed_message(drafted[0], "set HostConfig.draft to a checkpoint"))
        extra = sorted(set(self.defaults) - set(self.decoders))
        if extra:
            raise UserInputError(
                f"defaults given for decoders {extra} that are not served {list(self.decoders)}"
            )


@dataclass
class BatchItems:
    """One request's answer: the top-k items (best first)."""

    item_ids: list[int]
    sids: list[list[int]]
    scores: list[float]
    valid: list[bool]


@dataclass
class BatchOutput:
    items: list[BatchItems]
    decoder: str
    params: Any  # the decoder's Params the batch was decoded with
    decode_ms: float  # wall time of the decoder call for the whole batch
    timings_ms: dict[str, float]  # the decoder's phases for the batch
    counters: dict[str, float]
    batch_size: int


class DecoderHost:
    """Loads a checkpoint once and decodes batches with any of its configured decoders."""

    def __init__(self, cfg: HostConfig) -> None:
        from genrec.workloads.evaluation import load_context

        cfg.validate()
        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        t0 = time.perf_counter()
        self.ctx, self.ds, self.ckpt = load_context(cfg.model, cfg.data, cfg.device, draft_dir=cfg.draft)
        self.decoders = {name: get_decoder(name) for name in cfg.decoders}
        # resolve defaults once: bad defaults fail at start, not on the first request
        self.defaults = {name: self._default_params(name) for name in cfg.decoders}
        self.load_s = time.perf_counter() - t0
        self.warmup_s = self.warm_up()

    # ---- description -----------------------------------------------------------------------------
    @property
    def context(self) -> DecoderContext:
        return self.ctx

    @property
    def num_items(self) -> int:
        return len(self.ctx.item_codes)

    @property
    def max_history(self) -> int:
        return int(self.ctx.max_items)

    def describe(self) -> dict[str, Any]:
        return {
            "model": str(self.cfg.model),
            "draft": str(self.cfg.draft) if self.ctx.draft_model is not None else None,
            "dataset": str(self.ds.root.resolve()),
            "device": str(self.ctx.device),
            "threads": torch.get_num_threads(),
            "num_items": self.num_items,
            "max_history": self.max_history,
            "sid_levels": self.ctx.codec.levels,
            "decoders": {name: asdict(p) for name, p in self.defaults.items()},
            "load_s": self.load_s,
            "warmup_s": self.warmup_s,
        }

    def parameter_names(self, decoder: str) -> list[str]:
        return [f.name for f in fields(self.decoders[decoder].Params)]

    # ---- decoding --------------------------------------------------------------------------------
    def _default_params(self, decoder: str) -> Any:
        from genrec.platform.capabilities import check_capabilities

        try:
            params = parse_decoder_params(decoder, self.cfg.defaults.get(decoder, {}))
            check_capabilities(params, str(self.ctx.device), self.ctx.codec.levels)
            return params
        except UserInputError as e:
            raise UserInputError(f"defaults of decoder {decoder!r}: {e}") from None

    def resolve(self, decoder: str | None, overrides: dict[str, Any] | None = None) -> tuple[str, Any]:
        """(decoder name, Params): `overrides` over the served defaults, through the one parameter
        adapter (no silent widening: a k above the default beam width is an error, as in YAML and CLI)."""
        name = decoder or self.cfg.decoders[0]
        if name not in self.decoders:
            raise UserInputError(f"decoder {name!r} is not served here; choose one of {list(self.decoders)}")
        return name, parse_decoder_params(name, overrides or {}, base=self.defaults[name])

    def decode(
        self, histories: list[list[int]], decoder: str | None = None, params: Any | None = None
    ) -> BatchOutput:
        """Decode one batch; `params` is the decoder's Params (from `resolve` or a parsed request) or a
        dict of overrides of the served defaults."""
        if not histories:
            raise UserInputError("decode: empty batch")
        if params is None or isinstance(params, dict):
            name, p = self.resolve(decoder, params)
        else:
            name, p = decoder or self.cfg.decoders[0], params
            if type(p) is not self.decoders[name].Params:
                raise UserInputError(
                    f"decoder {name!r} takes {self.decoders[name].Params.__name__}, got {p!r}"
                )
        t0 = time.perf_counter_ns()
        with torch.inference_mode():
            res = self.decoders[name].decode(self.ctx, histories, p)
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize()
        decode_ms = (time.perf_counter_ns() - t0) / 1e6
        codes = res.codes.cpu().numpy()
        scores = res.scores.float().cpu().numpy()
        ids = res.item_ids.cpu().numpy()
        valid = res.valid.cpu().numpy()
        items = [
            BatchItems(ids[i].tolist(), codes[i].tolist(), scores[i].tolist(), valid[i].tolist())
            for i in range(len(histories))
        ]
        return BatchOutput(
            items=items,
            decoder=name,
            params=p,
            decode_ms=decode_ms,
            timings_ms=dict(res.timings_ms),
            counters={k: float(v) for k, v in res.counters.items()},
            batch_size=len(histories),
        )

    def warm_up(self) -> float:
        """Run every decoder a few times on real histories (allocator, kernels, constraint caches)."""
        t0 = time.perf_counter()
        examples = (
            self.ds.eval_examples("test")[: self.cfg.warmup_batch_size] if self.cfg.warmup_batches else []
        )
        histories = [ex.history for ex in examples] or [[0]]
        for _ in range(self.cfg.warmup_batches):
            for name in self.decoders:
                self.decode(histories, name, self.defaults[name])
        return time.perf_counter() - t0

    def sample_histories(self, n: int, seed: int = 0, split: str = "test") -> list[list[int]]:
        """n histories drawn from the dataset's split (for load generators and smoke tests)."""
        examples = self.ds.eval_examples(split)
        pick = np.random.default_rng(seed).choice(len(examples), size=n, replace=len(examples) < n)
        return [examples[i].history for i in pick]


# ---- Ray ------------------------------------------------------------------------------------------
def actor_resources(cluster: dict[str, float], threads: int, gpu: float | str = "auto") -> dict[str, float]:
    """Ray resources for one host: `threads` CPUs, and a GPU (auto: one whole GPU if the cluster has any)."""
    num_gpus = (1.0 if cluster.get("GPU", 0) >= 1 else 0.0) if gpu == "auto" else float(gpu)
    return {"num_cpus": float(max(1, threads)), "num_gpus": num_gpus}


def start_decoder_actor(cfg: HostConfig, gpu: float | str = "auto"):
    """Start a DecoderActor with resources fitted to the cluster; returns the actor handle."""
    import ray

    res = actor_resources(ray.cluster_resources(), cfg.threads, gpu)
    if res["num_gpus"] and cfg.device == "auto":
        cfg = HostConfig(**{**vars(cfg), "device": "cuda"})
    return ray.remote(DecoderHost).options(**res).remote(cfg)


_HOSTS: dict[tuple, DecoderHost] = {}


def cached_host(
    model: str, data: str | None, device: str, threads: int = 0, draft: str | None = None
) -> DecoderHost:
    """One host per process (sweep trials on a reused Tune worker): a different model or draft replaces it."""
    key = (model, data, device, draft)
    if key not in _HOSTS:
        _HOSTS.clear()
        _HOSTS[key] = DecoderHost(
            HostConfig(model=model, data=data, device=device, threads=threads, warmup_batches=0, draft=draft)
        )
    elif threads:
        torch.set_num_threads(threads)
    return _HOSTS[key]
