"""Parsing and checking `POST /recommend` bodies, with no Ray or HTTP server involved.

`parse_recommend` turns raw body bytes into a `RecommendJob` (what the batcher decodes) or raises
`RequestError(status, message)`, whose message names the offending field and how to fix it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from genrec.workloads.errors import UserInputError

MAX_BODY_BYTES = 1 << 20  # a history of item ids never needs more


class RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class RecommendRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    history: list[int] = Field(description="the user's item ids, oldest first")
    k: int = Field(10, description="items to return")
    decoder: str | None = None
    beam_width: int | None = None
    constraint_set: str | None = None


@dataclass(frozen=True)
class RecommendJob:
    history: tuple[int, ...]
    k: int
    decoder: str
    params: tuple[tuple[str, Any], ...]  # the decoder's resolved parameters, hashable for grouping
    truncated_from: int = 0  # original history length when it was truncated, else 0
    notes: tuple[str, ...] = field(default=())

    @property
    def group(self) -> tuple[str, tuple]:
        """Requests with the same group decode together in one batch call."""
        return self.decoder, self.params


@dataclass(frozen=True)
class Limits:
    """What a replica accepts: from its DecoderHost and the ServeConfig."""

    num_items: int
    max_history: int
    max_k: int
    history_policy: str  # truncate | reject
    decoders: tuple[str, ...]
    default_decoder: str
    constraint_sets: dict[str, dict[str, Any]]  # name -> static decoder params; missing: unavailable
    unavailable_sets: dict[str, str]  # name -> why it could not be built
    defaults: dict[str, dict[str, Any]]  # each served decoder's default parameters (resolved at start)


RECOMMEND_EXAMPLE = '{"history": [1, 2, 3], "k": 10}'


def load_json_body(body: bytes, max_bytes: int, example: str, limit_note: str = "") -> Any:
    """Raw body -> parsed JSON, or RequestError (413 too large, 400 empty or not JSON) showing `example`."""
    if len(body) > max_bytes:
        raise RequestError(413, f"request body is {len(body)} bytes; the limit is {max_bytes}{limit_note}")
    if not body.strip():
        raise RequestError(400, f"empty request body; send JSON like {example}")
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"request body is not valid JSON ({e}); send JSON like {example}") from None


def describe_validation_error(
    e: ValidationError, fields_of: Callable[[tuple], list[str]], max_errors: int | None = None
) -> str:
    """One message naming each bad field; `fields_of(loc)` lists the valid names beside an unknown one."""
    errors = e.errors()
    parts = []
    for err in errors[:max_errors]:
        loc = ".".join(str(x) for x in err["loc"]) or "body"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown field `{loc}`; fields are {fields_of(err['loc'])}")
        elif err["type"] == "missing":
            parts.append(f"`{loc}` is required")
        else:
            parts.append(f"`{loc}`: {err['msg']}")
    if max_errors is not None and len(errors) > max_errors:
        parts.append(f"... and {len(errors) - max_errors} more")
    return "; ".join(parts)


def parse_recommend(body: bytes, limits: Limits, resolve) -> RecommendJob:
    """Body bytes -> RecommendJob. `resolve(decoder, overrides) -> (name, Params)` checks parameters."""
    raw = load_json_body(body, MAX_BODY_BYTES, RECOMMEND_EXAMPLE)
    if not isinstance(raw, dict):
        raise RequestError(400, f"request body must be a JSON object, got {type(raw).__name__}")
    try:
        req = RecommendRequest.model_validate(raw)
    except ValidationError as e:
        raise RequestError(
            422, describe_validation_error(e, lambda loc: sorted(RecommendRequest.model_fields))
        ) from None

    history, notes, truncated_from = list(req.history), [], 0
    if not history:
        raise RequestError(422, "`history` is empty; send at least one item id the user interacted with")
    bad = [x for x in history if not 0 <= x < limits.num_items]
    if bad:
        raise RequestError(
            422, f"`history` has unknown item ids {bad[:10]}; valid ids are 0..{limits.num_items - 1}"
        )
    if len(history) > limits.max_history:
        if limits.history_policy == "reject":
            raise RequestError(
                422,
                f"`history` has {len(history)} items; the model's window is {limits.max_history}: send at "
                f"most {limits.max_history} (the most recent), or serve with history_policy: truncate",
            )
        truncated_from = len(history)
        history = history[-limits.max_history :]
        notes.append(f"history truncated to its last {limits.max_history} items (the model's window)")

    if not 1 <= req.k <= limits.max_k:
        raise RequestError(422, f"`k` must be between 1 and {limits.max_k}, got {req.k}")
    if req.beam_width is not None and req.beam_width < 1:
        raise RequestError(422, f"`beam_width` must be >= 1, got {req.beam_width}")

    overrides: dict[str, Any] = {"k": req.k}
    decoder = req.decoder
    if req.constraint_set is not None:
        name = req.constraint_set
        if name in limits.unavailable_sets:
            raise RequestError(
                422, f"`constraint_set` {name!r} is unavailable here: {limits.unavailable_sets[name]}"
            )
        if name not in limits.constraint_sets:
            raise RequestError(
                422, f"`constraint_set`: unknown set {name!r}; available: {sorted(limits.constraint_sets)}"
            )
        if "static" not in limits.decoders:
            raise RequestError(
                422, "`constraint_set` needs the `static` decoder, which this deployment does not serve"
            )
        if decoder not in (None, "static"):
            raise RequestError(
                422,
                f"`constraint_set` is decoded by the `static` decoder; drop `decoder` ({decoder!r}) "
                "or set it to static",
            )
        decoder = "static"
        overrides.update(limits.constraint_sets[name])
    decoder = decoder or limits.default_decoder
    if decoder not in limits.decoders:
        raise RequestError(
            422, f"`decoder`: {decoder!r} is not served here; choose one of {list(limits.decoders)}"
        )
    if req.beam_width is not None:
        overrides["beam_width"] = req.beam_width
    try:
        width = overrides.get("beam_width", limits.defaults[decoder].get("beam_width"))
        if req.beam_width is not None and "beam_width" not in limits.defaults[decoder]:
            raise RequestError(422, f"`beam_width`: decoder {decoder!r} has no beam width; leave it out")
        if width is not None and req.k > width:
            raise RequestError(
                422, f"`k` ({req.k}) is larger than the beam width ({width}); ask for beam_width >= {req.k}"
            )
        name, params = resolve(decoder, overrides)
    except UserInputError as e:
        raise RequestError(422, str(e)) from None
    return RecommendJob(
        history=tuple(history),
        k=req.k,
        decoder=name,
        params=tuple(sorted(vars(params).items())),
        truncated_from=truncated_from,
        notes=tuple(notes),
    )
