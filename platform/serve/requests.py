"""Parsing and checking `POST /recommend` bodies, with no Ray or HTTP server involved.

`parse_recommend` turns raw body bytes into a `RecommendJob` (what the batcher decodes: the history
and the decoder's frozen Params) or raises `RequestError(status, message)`, whose message names the
offending field and how to fix it. Decoder parameters go through genrec.platform.params, so a bad
one gets the same message here as in a YAML experiment or `genrec eval --param`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from genrec.platform.serve.config import ConstraintFields
from genrec.workloads.errors import UserInputError
from genrec.workloads.serving.xschedule import request_tokens as beams_x_prompt

MAX_BODY_BYTES = 1 << 20  # a history of item ids never needs more
MAX_INT_DIGITS = 20  # every id and parameter fits an int64; longer digit strings are refused unparsed
MAX_JSON_DEPTH = 32  # the deepest body we accept nests 3 levels; deeper is an attack or a mistake
MAX_DETAIL_CHARS = 1000  # an error message never echoes more than this of the client's input


def clip(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """`text` cut to about `limit` characters, keeping its start and its end (where a message says
    what to do) and saying how much of the middle was left out."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} ...({len(text) - 2 * half} characters left out)... {text[-half:]}"


class RequestError(Exception):
    """A 4xx answer; its message is clipped so a huge bad value is never echoed back in full."""

    def __init__(self, status: int, message: str) -> None:
        message = clip(message)
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
    tokens: int = 0  # this request's share of a decoder call's work (see `request_tokens`)

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
    # per-deployment resource limits (ServeConfig.limits), checked before a request is queued so one
    # request can never hold a replica for minutes or take gigabytes
    max_beam_width: int = 512  # every width parameter of a decoder: beam_width, draft_beams
    max_history_items: int = 4096  # items in the request's history, before any truncation
    max_batch_tokens: int = 1 << 20  # beams x prompt positions of one decoder call
    levels: int = 3  # SID tokens per item (a prompt holds levels tokens per history item)
    device: str = "cpu"  # the replica's torch device: what its kernels can run on (capabilities.py)


WIDTH_PARAMETERS = ("beam_width", "draft_beams")  # decoder parameters whose cost grows with their value


def request_tokens(params: Any, history_items: int, levels: int) -> int:
    """The positions a request's beams attend over: widest beam x (history + answer) tokens. A decoder
    call's memory and time grow with the sum over its requests, which `max_batch_tokens` bounds."""
    width = max([int(getattr(params, name, 1)) for name in WIDTH_PARAMETERS] + [1])
    return beams_x_prompt(width, history_items, levels)  # the count the `slo` batching budgets in


RECOMMEND_EXAMPLE = '{"history": [1, 2, 3], "k": 10}'


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise RequestError(
            400, f"a number in the body has {len(text.lstrip('-'))} digits; the limit is {MAX_INT_DIGITS}"
        )
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise RequestError(400, f"the number {clip(text, 40)} is out of range; send finite numbers")
    return value


def _no_constant(name: str) -> Any:
    raise RequestError(400, f"{name} is not a JSON number; send finite numbers only")


_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')


def json_depth(body: bytes) -> int:
    """How deep the brackets of a JSON text nest, brackets inside strings skipped; stops counting past
    MAX_JSON_DEPTH. Escaped quotes and backslashes are dropped first and everything but brackets and
    quotes is deleted in C, so the Python loop only sees the body's structure."""
    skeleton = body.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    depth = deepest = 0
    in_string = False
    for byte in skeleton:
        if byte == 0x22:  # "
            in_string = not in_string
        elif in_string:
            continue
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_JSON_DEPTH:
                break
        else:
            depth -= 1
    return deepest


def load_json_body(
    body: bytes, max_bytes: int, example: str, limit_note: str = "", finite_only: bool = True
) -> Any:
    """Raw body -> parsed JSON, or RequestError (413 too large; 400 empty, not JSON, nested too deep,
    a number too long) showing `example`. Limits are checked before Python builds any object.
    `finite_only`: NaN, Infinity and overflowing floats are a 400 too (False: left to the caller's
    own check, as /rank names the tensor that holds them)."""
    if len(body) > max_bytes:
        raise RequestError(413, f"request body is {len(body)} bytes; the limit is {max_bytes}{limit_note}")
    if not body.strip():
        raise RequestError(400, f"empty request body; send JSON like {example}")
    depth = json_depth(body)
    if depth > MAX_JSON_DEPTH:
        raise RequestError(
            400, f"request body nests deeper than {MAX_JSON_DEPTH} levels; send JSON like {example}"
        )
    try:
        if not finite_only:
            return json.loads(body, parse_int=_bounded_int)
        return json.loads(
            body, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant
        )
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"request body is not valid JSON ({e}); send JSON like {example}") from None
    except (ValueError, RecursionError) as e:  # e.g. Python's own digit limit on huge numbers
        raise RequestError(
            400, f"request body cannot be read as JSON ({e}); send JSON like {example}"
        ) from None


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
    if req.decoder == "":  # not "the default": a client that sends a name means one
        raise RequestError(
            422,
            f"`decoder` is empty; leave it out for the default {limits.default_decoder!r} or choose one "
            f"of {list(limits.decoders)}",
        )
    decoder = req.decoder or limits.default_decoder
    if decoder not in limits.decoders:
        raise RequestError(
            422, f"`decoder`: {decoder!r} is not served here; choose one of {list(limits.decoders)}"
        )
    params = request_params(decoder, request_values(req), limits)
    tokens = check_cost(params, len(history), limits)
    return RecommendJob(tuple(history), decoder, params, truncated_from, tuple(notes), tokens)


def check_cost(params: Any, history_items: int, limits: Limits) -> int:
    """The request's tokens, or RequestError (422) naming the deployment limit it exceeds."""
    for name in WIDTH_PARAMETERS:
        value = getattr(params, name, None)
        if value is not None and value > limits.max_beam_width:
            raise RequestError(422, width_limit_message(name, value, limits))
    tokens = request_tokens(params, history_items, limits.levels)
    if tokens > limits.max_batch_tokens:
        raise RequestError(
            422,
            f"this request needs {tokens} tokens (widest beam x (history items + 1) x {limits.levels} "
            f"levels), above this deployment's limit max_batch_tokens={limits.max_batch_tokens}; send a "
            "narrower beam or a shorter history (or raise limits.max_batch_tokens in the serve config)",
        )
    return tokens


def check_history(history: list[int], limits: Limits) -> tuple[list[int], int, list[str]]:
    """(history to decode, original length if truncated else 0, notes) or RequestError."""
    if not history:
        raise RequestError(422, "`history` is empty; send at least one item id the user interacted with")
    if len(history) > limits.max_history_items:
        raise RequestError(
            422,
            f"`history` has {len(history)} items, above this deployment's limit max_history_items="
            f"{limits.max_history_items}; send the most recent {limits.max_history} (the model's window)",
        )
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
    from genrec.platform.capabilities import check_capabilities
    from genrec.platform.params import parse_decoder_params

    check_limits_first(values, limits)
    base = limits.defaults[decoder]
    takes_constraint = hasattr(base, "constraint")
    if takes_constraint and isinstance(values.get("constraint"), str):
        values = named_set_values(values, limits)
    try:
        params = parse_decoder_params(decoder, values, base=base)
        # before it is queued: a backend this replica's device cannot run would fail in the batch
        check_capabilities(params, limits.device, limits.levels)
    except UserInputError as e:
        raise RequestError(422, str(e)) from None
    if params.k > limits.max_k:
        raise RequestError(
            422, f"`k` must be between 1 and {limits.max_k} (this deployment's limit max_k), got {params.k}"
        )
    if takes_constraint:
        check_constraint_built(ConstraintFields.of(params), ConstraintFields.of(base), limits)
    return params


def check_limits_first(values: dict[str, Any], limits: Limits) -> None:
    """The deployment's limits on k and the widths, before the decoder's own rules: advice such as "ask
    for beam_width >= k" must never point past a limit the client cannot raise."""
    k = values.get("k")
    if type(k) is int and k > limits.max_k:
        raise RequestError(
            422, f"`k` must be between 1 and {limits.max_k} (this deployment's limit max_k), got {k}"
        )
    for name in WIDTH_PARAMETERS:
        width = values.get(name)
        if type(width) is int and width > limits.max_beam_width:
            raise RequestError(422, width_limit_message(name, width, limits))


def width_limit_message(name: str, value: int, limits: Limits) -> str:
    return (
        f"`{name}` {value} is above this deployment's limit max_beam_width={limits.max_beam_width}; "
        f"send at most {limits.max_beam_width} (or raise limits.max_beam_width in the serve config)"
    )


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
