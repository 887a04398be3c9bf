"""What every decoder shares: the context it decodes with, its result, timing, and the registry.

A decoder is a class with a name, a typed `Params` dataclass and
    decode(ctx: DecoderContext, histories: list[list[int]], params) -> DecodeResult.
Decoders derive from `RegisteredDecoder`: defining the class registers it by name (every module of
this package is imported on the first registry lookup, so there is no list of built-ins to keep), and
its `needs` say what it decodes with beyond the backbone (needs.py). Sweeps, the CLI and the Serve app
pick a decoder by string.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import torch

from genrec.workloads.decoding.buffer_pool import BufferPool
from genrec.workloads.decoding.constraint_store import ConstraintStore
from genrec.workloads.decoding.needs import Need, require_needs
from genrec.workloads.decoding.params import DecoderParams
from genrec.workloads.decoding.prefix_keys import PrefixKeySets
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.inputs import build_prompts, item_token_table
from genrec.workloads.models.nezha_head import DraftHead
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec

if TYPE_CHECKING:  # pragma: no cover - typing only
    from genrec.workloads.models.hf_checkpoint import ImportedInputs

PHASES = ("prefill", "draft", "verify", "decode", "system")


class ItemIndex:
    """SID -> item id lookup on the decoding device: a sorted int64 tensor of mixed-radix keys.

    `lookup` is one searchsorted per batch, so validity checks never leave the device.
    """

    def __init__(self, codec: SIDCodec, item_codes: np.ndarray, device: torch.device | str = "cpu") -> None:
        keys = np.asarray(codec.codes_to_keys(codec.validate_codes(item_codes, "item SIDs")), dtype=np.int64)
        order = np.argsort(keys, kind="stable")
        if len(keys) > 1 and (np.diff(keys[order]) == 0).any():
            raise UserInputError("two items share a semantic ID; resolve collisions before decoding")
        self.codec = codec
        self.keys = torch.from_numpy(keys[order]).to(device)
        self.item_ids = torch.from_numpy(order.astype(np.int64)).to(device)
        self._prefix_sets: PrefixKeySets | None = None

    def prefix_sets(self) -> PrefixKeySets:
        """Every valid SID prefix (NEZHA's verification set), built on first use and kept."""
        if self._prefix_sets is None:
            self._prefix_sets = PrefixKeySets(self.codec, self.keys)
        return self._prefix_sets

    def __len__(self) -> int:
        return len(self.keys)

    def lookup(self, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """codes [..., L] -> (item ids [...] with -1 where invalid, valid mask [...])."""
        keys = self.codec.codes_to_keys(codes)
        pos = torch.searchsorted(self.keys, keys).clamp(max=len(self.keys) - 1)
        valid = self.keys[pos] == keys
        return torch.where(valid, self.item_ids[pos], torch.full_like(pos, -1)), valid


@dataclass
class DecoderContext:
    """Everything a decoder needs, loaded once per process (a trial, an actor, an eval run)."""

    model: GRTransformer
    codec: SIDCodec
    item_codes: np.ndarray  # [num_items, L]
    max_items: int  # history items per prompt
    popularity: np.ndarray | None = None  # train interactions per item (popularity baseline, cold_start)
    draft_head: DraftHead | None = None  # NEZHA / MTP head trained on this backbone, if any
    draft_model: GRTransformer | None = None  # AtSpeed's draft: a smaller model on the same codec
    # an imported HF checkpoint's prompting (its template + tokenizer) and origin; None for our models
    imported: ImportedInputs | None = None
    # AtSpeed's draft when it is one of ours beside an imported target: the codec it scores with (its own
    # level-offset ids, the target's code space) and its BOS + SID prompts; None: the draft shares the
    # target's codec and prompts
    draft_codec: SIDCodec | None = None
    item_tokens: np.ndarray = field(init=False)
    index: ItemIndex = field(init=False)
    constraints: ConstraintStore = field(init=False)  # constraint sets and their mask indexes
    # decode buffers (xGR's reuse) kept across requests; decoder objects are made per call, these outlive them
    buffers: BufferPool = field(init=False, default_factory=BufferPool, repr=False)
    _draft_item_tokens: np.ndarray | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.item_tokens = item_token_table(self.codec, self.item_codes)
        self.index = ItemIndex(self.codec, self.item_codes, self.device)
        self.constraints = ConstraintStore(self.codec, self.item_codes, self.popularity)
        self._draft_item_tokens = (
            None if self.draft_codec is None else item_token_table(self.draft_codec, self.item_codes)
        )

    @property
    def device(self) -> torch.device:
        return self.model.device

    def prompts(self, histories: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.item_codes)
        for i, h in enumerate(histories):
            bad = [x for x in h if not 0 <= x < n]
            if bad:
                raise UserInputError(f"history {i}: unknown item ids {bad[:5]} (valid ids are 0..{n - 1})")
        if self.imported is None:  # our models: BOS + the history's SID tokens
            return build_prompts(histories, self.item_tokens, self.max_items, self.device)
        from genrec.workloads.models.hf_checkpoint import imported_prompts

        return imported_prompts(self.imported, self.item_codes, histories, self.max_items, self.device)

    @property
    def draft_scoring_codec(self) -> SIDCodec:
        """The codec the draft model scores and feeds SIDs with (module field `draft_codec`)."""
        return self.codec if self.draft_codec is None else self.draft_codec

    def draft_prompts(self, histories: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft model's prompts for the same users: the target's, or (a draft of ours beside an
        imported target) BOS + the history's SID tokens in the draft's ids."""
        if self._draft_item_tokens is None:
            return self.prompts(histories)
        return build_prompts(histories, self._draft_item_tokens, self.max_items, self.device)


@dataclass
class DecodeResult:
    codes: torch.Tensor  # [B, K, L] SID codes, best first
    scores: torch.Tensor  # [B, K] log-probabilities (decoder-specific scale)
    item_ids: torch.Tensor  # [B, K], -1 where the SID maps to no item
    valid: torch.Tensor  # [B, K] bool
    timings_ms: dict[str, float] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)


class PhaseTimer:
    """Accumulates wall time per phase; synchronises CUDA so GPU work is counted where it runs."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.ms: dict[str, float] = {}

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def phase(self, name: str) -> _Phase:
        return _Phase(self, name)

    def add(self, name: str, ns: int) -> None:
        self.ms[name] = self.ms.get(name, 0.0) + ns / 1e6


class _Phase:
    def __init__(self, timer: PhaseTimer, name: str) -> None:
        self.timer, self.name = timer, name

    def __enter__(self) -> _Phase:
        self.timer._sync()
        self.t0 = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.timer._sync()
        self.timer.add(self.name, time.perf_counter_ns() - self.t0)


class Decoder(Protocol):
    name: ClassVar[str]
    Params: ClassVar[type[DecoderParams]]
    needs: ClassVar[tuple[Need, ...]]

    def decode(self, ctx: DecoderContext, histories: list[list[int]], params: Any) -> DecodeResult: ...


_REGISTRY: dict[str, type] = {}


def register_decoder(cls: type) -> type:
    if cls.name in _REGISTRY:
        raise ValueError(f"decoder {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


class RegisteredDecoder:
    """Base of every decoder: a subclass that sets `name` registers itself when its class is defined.

    `needs` declares what the decoder decodes with beyond the backbone (needs.py); `decode` checks the
    parameters and those needs, each with its one message, then runs the subclass's `run`."""

    name: ClassVar[str]
    Params: ClassVar[type[DecoderParams]]
    needs: ClassVar[tuple[Need, ...]] = ()
    description: ClassVar[str] = ""  # one line for `genrec decoders`
    # whether it reads the backbone's next-token logits (a checkpoint trained only for a draft head has
    # an untrained next-token head, so such a decoder cannot run on it)
    reads_backbone: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in vars(cls):  # templates without a name of their own are not decoders
            register_decoder(cls)

    def decode(self, ctx: DecoderContext, histories: list[list[int]], params: Any) -> DecodeResult:
        params.validate()
        require_needs(type(self), ctx)
        return self.run(ctx, histories, params)

    def run(self, ctx: DecoderContext, histories: list[list[int]], params: Any) -> DecodeResult:
        raise NotImplementedError


def decoder_names() -> list[str]:
    _import_builtin_decoders()
    return sorted(_REGISTRY)


def decoder_class(name: str) -> type:
    """The registered class of a decoder (UserInputError naming the choices for an unknown one)."""
    _import_builtin_decoders()
    if name not in _REGISTRY:
        raise UserInputError(f"unknown decoder {name!r}; choose one of {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def get_decoder(name: str) -> Decoder:
    return decoder_class(name)()


def decoder_needs(name: str) -> tuple[Need, ...]:
    """What a decoder declares it needs (needs.py); () for an unknown name, which is reported where
    names are checked, so a pre-flight check of needs never shadows that message."""
    _import_builtin_decoders()
    cls = _REGISTRY.get(name)
    return tuple(cls.needs) if cls is not None else ()


def make_params(decoder: Decoder, values: dict[str, Any]) -> DecoderParams:
    """Build a decoder's Params from a dict, rejecting unknown names with the valid ones listed.

    For code that already holds typed values (benchmarks, tests); YAML, CLI and HTTP input goes
    through the platform's adapter (genrec.platform.params), which also checks types."""
    valid = {f.name for f in fields(decoder.Params)}
    unknown = sorted(set(values) - valid)
    if unknown:
        raise UserInputError(f"decoder {decoder.name!r} has no parameter {unknown}; valid: {sorted(valid)}")
    params = decoder.Params(**values)
    params.validate()
    return params


def decoder_parameters(name: str) -> dict[str, Any]:
    """Parameter names and defaults of a decoder (for `genrec eval --help`, Serve's /decoders)."""
    return {f.name: f.default for f in fields(decoder_class(name).Params)}


def _import_builtin_decoders() -> None:
    """Import every module of this package once: defining a decoder class registers it, so a new
    built-in decoder needs no entry in a list. Lazy, so importing base stays light."""
    global _BUILTINS_IMPORTED
    if _BUILTINS_IMPORTED:
        return
    package = importlib.import_module(__package__)
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{__package__}.{module.name}")
    _BUILTINS_IMPORTED = True


_BUILTINS_IMPORTED = False
