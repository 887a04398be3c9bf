"""One typed path for decoder parameters: YAML experiments, `genrec eval --param`, POST /recommend.

Each decoder's frozen `Params` dataclass (genrec.workloads.decoding.params) is the single source. A
`benchmark:` experiment's Params (genrec.workloads.benchmark_registry) take the same path.
`parse_decoder_params` turns plain values from any entry point into that dataclass in three steps,
each with one message format, so the same bad value reads the same from every entry point:

1. names: unknown parameters are rejected with the valid ones listed;
2. types: a cached pydantic `TypeAdapter` per Params type checks the values in strict mode (no
   silent `"5"` -> 5 or `true` -> 1); the CLI reads `--param NAME=VALUE` as the YAML `NAME: VALUE`
   (`cli_values`), so a CLI value has exactly the type the same text has in an experiment file;
3. rules: `constraint` must be a rule of CONSTRAINT_RULES (named sets are a Serve concept and are
   mapped to rule fields before this), then the dataclass's own `validate()` (k <= beam_width and
   the other cross-field rules live there, once);
4. use: a value given for a setting that the chosen rule or backend does not read (`constraint_path`
   under rule `all`, `kernel` with a baseline backend) is refused by name (`check_used`), so a client
   never sees it echoed as if it had been used and a sweep never runs it as a distinct configuration.

Callers prefix their own context (a YAML key path); the CLI prints the message as is, Serve answers
it as HTTP 422. genrec.workloads never imports this module (pydantic stays out of workloads).
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from typing import Any

import yaml
from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict  # pydantic needs it (not typing's) on Python < 3.12

from genrec.workloads.decoding.base import get_decoder
from genrec.workloads.decoding.params import CONSTRAINT_RULES, SIZED_RULES
from genrec.workloads.errors import UserInputError


class ParamError(UserInputError):
    """A bad decoder parameter. `param` names the field at fault, None for a cross-field rule."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, param)


@dataclass(frozen=True)
class ParamInfo:
    """One parameter of a decoder, for `genrec decoders` and Serve's GET /decoders."""

    name: str
    type: str
    default: Any


def params_type(decoder: str) -> type:
    """The decoder's Params dataclass (UserInputError for an unknown decoder)."""
    return get_decoder(decoder).Params


@functools.cache
def _field_types(ptype: type) -> dict[str, type]:
    hints = typing.get_type_hints(ptype)  # resolves `from __future__ import annotations` strings
    return {f.name: hints[f.name] for f in fields(ptype)}


@functools.cache
def _adapter(ptype: type) -> TypeAdapter:
    # A strict dataclass schema would want a Params instance, not a mapping: validate the values as a
    # TypedDict of the same fields (partial: missing fields keep the dataclass defaults) instead.
    values = TypedDict(f"{ptype.__name__}Values", _field_types(ptype), total=False)
    return TypeAdapter(with_config(ConfigDict(strict=True, extra="forbid"))(values))


def type_name(t: Any) -> str:
    return getattr(t, "__name__", str(t))


def check_field_names(ptype: type, names: Iterable[str], owner: str) -> None:
    """Every name is a field of `ptype`, else ParamError listing the valid ones (`owner`: "decoder 'x'")."""
    valid = sorted(f.name for f in fields(ptype))
    unknown = sorted(set(names) - set(valid))
    if unknown:
        what = f"parameter {unknown[0]!r}" if len(unknown) == 1 else f"parameters {unknown}"
        raise ParamError(f"{owner} has no {what}; valid: {valid}", unknown[0])


def check_names(decoder: str, names: Iterable[str]) -> None:
    """Every name is a parameter of the decoder, else ParamError listing the valid ones."""
    check_field_names(params_type(decoder), names, f"decoder {decoder!r}")


def type_error(ptype: type, e: ValidationError) -> ParamError:
    """A pydantic error -> one sentence per bad value, in our words (not pydantic's, which vary by case)."""
    types = _field_types(ptype)
    parts, first = [], None
    for err in e.errors():
        name = str(err["loc"][0]) if err["loc"] else "params"
        first = first or name
        want = type_name(types.get(name, object))
        article = "an" if want[:1] in "aeiou" else "a"
        value = err.get("input")
        parts.append(f"`{name}` takes {article} {want}, got {value!r} ({type(value).__name__})")
    return ParamError("; ".join(parts), first)


def check_constraint_rule(params: Any) -> None:
    rule = getattr(params, "constraint", None)
    if rule is not None and rule not in CONSTRAINT_RULES:
        raise ParamError(
            f"`constraint` {rule!r} is not a constraint rule; choose one of {list(CONSTRAINT_RULES)}",
            "constraint",
        )


def _sized(p: Any) -> bool:
    return p.constraint in SIZED_RULES


def _static_backend(p: Any) -> bool:
    return getattr(p, "backend", "static") == "static"


# parameter -> (does `params` read it?, the setting it belongs to, where it is read)
READ_ONLY_WITH: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "constraint_size": (_sized, "constraint", f"constraint {list(SIZED_RULES)}"),
    "constraint_seed": (_sized, "constraint", f"constraint {list(SIZED_RULES)}"),
    "constraint_path": (lambda p: p.constraint == "file", "constraint", "constraint 'file'"),
    "dense_levels": (_static_backend, "backend", "backend 'static'"),
    "kernel": (_static_backend, "backend", "backend 'static'"),
}


def check_used(params: Any, given: Iterable[str]) -> None:
    """ParamError naming the first of the `given` parameters whose value differs from its default
    although `params`' rule or backend never reads it (a default left in place is no claim)."""
    defaults = {f.name: f.default for f in fields(params)}
    for name in sorted(given):
        if name not in READ_ONLY_WITH or name not in defaults:
            continue
        reads, setting, where = READ_ONLY_WITH[name]
        value = getattr(params, name)
        if value != defaults[name] and not reads(params):
            raise ParamError(
                f"`{name}` {value!r} is not used with {setting} {getattr(params, setting)!r}: only "
                f"{where} reads it; leave it out or change {setting}",
                name,
            )


def plain_values(params: Any) -> dict[str, Any]:
    """A Params object or a mapping -> a plain dict of values."""
    if params is None:
        return {}
    if is_dataclass(params) and not isinstance(params, type):
        return asdict(params)
    return dict(params)


def parse_params(ptype: type, values: Mapping[str, Any], owner: str, base: Any = None) -> Any:
    """`values` (over `base`) -> a frozen, validated `ptype` (a decoder's or a benchmark's Params):
    names, then types by the cached strict adapter, then the dataclass's own `validate()`."""
    check_field_names(ptype, values, owner)
    merged = {**plain_values(base), **values}
    try:
        typed = _adapter(ptype).validate_python(merged)
    except ValidationError as e:
        raise type_error(ptype, e) from None
    missing = [f.name for f in fields(ptype) if f.default is MISSING and f.name not in typed]
    if missing:
        raise ParamError(f"{owner} needs {missing}: give a value for each", missing[0])
    params = ptype(**typed)
    check_constraint_rule(params)
    try:
        params.validate()  # the cross-field rules (k <= beam_width, ...), kept in the dataclass
    except ParamError:
        raise
    except UserInputError as e:
        raise ParamError(str(e), getattr(e, "param", None)) from None
    return params


def parse_decoder_params(decoder: str, values: Mapping[str, Any], base: Any = None) -> Any:
    """`values` (over `base`: a Params object or a mapping of trusted defaults) -> the decoder's frozen,
    validated Params. Raises ParamError / UserInputError with the same text for every entry point."""
    params = parse_params(params_type(decoder), values, f"decoder {decoder!r}", base)
    check_used(params, values)  # a decoder's rule / backend settings; a benchmark's names mean other things
    return params


def parse_benchmark_params(benchmark: str, values: Mapping[str, Any]) -> Any:
    """A `benchmark:` experiment's values -> the benchmark's frozen, validated Params, by the same
    three steps (and so the same messages) as a decoder's."""
    from genrec.platform.benchmarks import get_benchmark

    return parse_params(get_benchmark(benchmark).Params, values, f"benchmark {benchmark!r}")


def eval_params(decoder: str, values: Mapping[str, Any], ks: Sequence[int]) -> Any:
    """Params for an evaluation with cut-offs `ks` (`genrec eval`, sweep trials): `values` over the
    defaults derived from the cut-offs (k = the largest K, a beam at least that wide); k must cover
    every K."""
    from genrec.workloads.evaluation import eval_defaults, resolve_params  # the dataset code: when used

    params = parse_decoder_params(decoder, values, base=eval_defaults(params_type(decoder), tuple(ks)))
    return resolve_params(decoder, params, tuple(ks))


def cli_value(raw: str) -> Any:
    """A `--param` VALUE read as a YAML scalar, so `k=50` is 50 exactly as `k: 50` is in a YAML file."""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw  # not YAML (e.g. `a: b: c`): the text as written, which a str parameter takes


def cli_values(pairs: Sequence[str]) -> dict[str, Any]:
    """['beam_width=20', 'constraint=cold_start'] -> {'beam_width': 20, 'constraint': 'cold_start'}."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UserInputError(f"--param {pair!r}: expected NAME=VALUE, e.g. --param beam_width=20")
        if name in out:
            raise UserInputError(f"--param {name} is given twice; give each parameter once")
        out[name] = cli_value(raw)
    return out


def describe_parameters(decoder: str) -> list[ParamInfo]:
    """The decoder's parameters in declaration order, with types and defaults."""
    ptype = params_type(decoder)
    types = _field_types(ptype)
    return [
        ParamInfo(f.name, type_name(types[f.name]), None if f.default is MISSING else f.default)
        for f in fields(ptype)
    ]
