"""Parsing and checking `POST /recommend` bodies, with no Ray or HTTP server involved.

`parse_recommend` turns raw body bytes into a `RecommendJob` (what the batcher decodes: the history
and the decoder's frozen Params) or raises `RequestError(status, message)`, whose message names the
offending field and how to fix it. Decoder parameters go through genrec.platform.params, so a bad
one gets the same message here as in a YAML experiment or `genrec eval --param`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from genrec.platform.serve.config import ConstraintFields
from genrec.workloads.errors import UserInputError

MAX_BODY_BYTES = 1 << 20  # a history of item ids never needs more


class RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class RecommendRequest(BaseModel):
    """The body of POST /recommend. `k`, `beam_width` and `constraint` are short for the same names in
    `params`; every decoder parameter is typed and checked by genrec.platform.params (the adapter of
    YAML experiments and `genrec eval --param`), so they are not typed here."""

    model_config = ConfigDict(extra="forbid", strict=True)

    history: list[int] = Field(description="the user's item ids, oldest first")
    decoder: str | None = Field(None, description="a served decoder; default: the deployment's first")
    k: Any = Field(None, description="items to return")
    beam_width: Any = None
    constraint: Any = Field(None, description="a configured constraint set or a rule")
    params: dict[str, Any] = Field(default_factory=dict, description="any parameter of the decoder")


SHORTHANDS = ("k", "beam_width", "constraint")  # top-level fields that are decoder parameters


@dataclass(frozen=True)
class RecommendJob:
    history: tuple[int, ...]
    decoder: str
    params: Any  # the decoder's frozen Params: hashable, so equal requests batch into one decoder call
    truncated_from: int = 0  # original history length when it was truncated, else 0
    notes: tuple[str, ...] = field(default=())

    @property
    def k(self) -> int:
        return self.params.k

    @property
    def group(self) -> tuple[str, Any]:
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
    defaults: Mapping[str, Any]  # each served decoder's default Params (validated at start)
    constraint_sets: Mapping[str, ConstraintFields]  # name -> fields; only sets built at start
    unavailable_sets: Mapping[str, str] = field(default_factory=dict)  # name -> why it was not built


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


def parse_recommend(body: bytes, limits: Limits) -> RecommendJob:
    """Body bytes -> RecommendJob with the decoder's typed Params, or RequestError (4xx)."""
    raw = load_json_body(body, MAX_BODY_BYTES, RECOMMEND_EXAMPLE)
    if not isinstance(raw, dict):
        raise RequestError(400, f"request body must be a JSON object, got {type(raw).__name__}")
    if "constraint_set" in raw:  # renamed: one name for YAML, CLI and HTTP, for every beam decoder
        raise RequestError(
            422,
            "`constraint_set` was renamed `constraint` (it applies to any beam-based decoder); send "
            f'{{"constraint": {json.dumps(raw["constraint_set"])}}}',
        )
    try:
        req = RecommendRequest.model_validate(raw)
    except ValidationError as e:
        raise RequestError(
            422, describe_validation_error(e, lambda loc: sorted(RecommendRequest.model_fields))
        ) from None
    history, truncated_from, notes = check_history(req.history, limits)
    decoder = req.decoder or limits.default_decoder
    if decoder not in limits.decoders:
        raise RequestError(
            422, f"`decoder`: {decoder!r} is not served here; choose one of {list(limits.decoders)}"
        )
    params = request_params(decoder, request_values(req), limits)
    return RecommendJob(tuple(history), decoder, params, truncated_from, tuple(notes))


def check_history(history: list[int], limits: Limits) -> tuple[list[int], int, list[str]]:
    """(history to decode, original length if truncated else 0, notes) or RequestError."""
    if not history:
        raise RequestError(422, "`history` is empty; send at least one item id the user interacted with")
    bad = [x for x in history if not 0 <= x < limits.num_items]
    if bad:
        raise RequestError(
            422, f"`history` has unknown item ids {bad[:10]}; valid ids are 0..{limits.num_items - 1}"
        )
    if len(history) <= limits.max_history:
        return history, 0, []
    if limits.history_policy == "reject":
        raise RequestError(
            422,
            f"`history` has {len(history)} items; the model's window is {limits.max_history}: send at "
            f"most {limits.max_history} (the most recent), or serve with history_policy: truncate",
        )
    note = f"history truncated to its last {limits.max_history} items (the model's window)"
    return history[-limits.max_history :], len(history), [note]


def request_values(req: RecommendRequest) -> dict[str, Any]:
    """`params` with the top-level shorthands merged in; a name given in both places is an error."""
    values = dict(req.params)
    for name in SHORTHANDS:
        value = getattr(req, name)
        if value is None:
            continue
        if name in values:
            raise RequestError(422, f"`{name}` is given twice (top level and in `params`); give it once")
        values[name] = value
    return values


def request_params(decoder: str, values: dict[str, Any], limits: Limits) -> Any:
    """The request's values over the decoder's served defaults -> its frozen Params, checked by the
    same adapter as YAML and the CLI (same messages), then against what this deployment built."""
    from genrec.platform.params import parse_decoder_params

    base = limits.defaults[decoder]
    takes_constraint = hasattr(base, "constraint")
    if takes_constraint and isinstance(values.get("constraint"), str):
        values = named_set_values(values, limits)
    try:
        params = parse_decoder_params(decoder, values, base=base)
    except UserInputError as e:
        raise RequestError(422, str(e)) from None
    if params.k > limits.max_k:
        raise RequestError(422, f"`k` must be between 1 and {limits.max_k}, got {params.k}")
    if takes_constraint:
        check_constraint_built(ConstraintFields.of(params), ConstraintFields.of(base), limits)
    return params


def named_set_values(values: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """A `constraint` naming a configured set -> the set's constraint fields (a name wins over a rule)."""
    name = values["constraint"]
    if name in limits.unavailable_sets:
        raise RequestError(422, f"`constraint` {name!r} is unavailable here: {limits.unavailable_sets[name]}")
    if name not in limits.constraint_sets:
        return values  # a rule: the adapter checks it
    fixed = limits.constraint_sets[name].values()
    clash = sorted(k for k in values if k in fixed and k != "constraint")
    if clash:
        raise RequestError(
            422, f"`constraint` {name!r} is a configured set that fixes {clash}; leave them out"
        )
    return {**values, **fixed}


def check_constraint_built(chosen: ConstraintFields, default: ConstraintFields, limits: Limits) -> None:
    """Constraint sets are built when a replica starts, never on a request: only "none", the decoder's
    default and the configured sets are served."""
    if chosen.constraint == "none" or chosen in (default, *limits.constraint_sets.values()):
        return
    raise RequestError(
        422,
        f"`constraint` {chosen.describe()} is not built on this deployment; name one of its sets "
        f"{sorted(limits.constraint_sets)} (GET /constraint-sets) or add it to `constraint_sets` in the "
        "serve config",
    )
