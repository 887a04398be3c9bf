"""Fault suite, bad inputs: request bodies a hostile but fair client sends to POST /recommend, checked
by the parser the replicas run (no Ray): every one gets a 4xx naming the problem, none a 500, none is
echoed back in full, and the deployment's resource limits are named in the answer."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from genrec.platform.params import parse_decoder_params
from genrec.platform.serve.requests import (
    MAX_DETAIL_CHARS,
    MAX_JSON_DEPTH,
    Limits,
    RequestError,
    json_depth,
    load_json_body,
    parse_recommend,
)


def limits(**over) -> Limits:
    base = dict(
        num_items=100,
        max_history=5,
        max_k=50,
        history_policy="truncate",
        decoders=("beam", "atspeed_strict"),
        default_decoder="beam",
        defaults={
            "beam": parse_decoder_params("beam", {"beam_width": 10, "k": 10}),
            "atspeed_strict": parse_decoder_params("atspeed_strict", {"beam_width": 10, "k": 10}),
        },
        constraint_sets={},
        max_beam_width=64,
        max_history_items=200,
        max_batch_tokens=1000,  # a beam of 64 over the 5-item window (64 x 6 x 3 = 1152) is above it
        levels=3,
    )
    return Limits(**{**base, **over})


def body(obj) -> bytes:
    return obj if isinstance(obj, bytes) else json.dumps(obj).encode()


BIG = "x" * 400_000
# (body, status, words in the detail)
BAD_BODIES = {
    # not JSON, or JSON that would take the parser down
    "huge-int-history": (b'{"history": [' + b"7" * 5000 + b"]}", 400, "5000 digits"),
    "huge-int-k": (b'{"history": [1], "k": ' + b"9" * 30 + b"}", 400, "30 digits"),
    "huge-negative-int": (b'{"history": [-' + b"1" * 4400 + b"]}", 400, "4400 digits"),
    "deep-list": (b"[" * 50_000 + b"]" * 50_000, 400, f"deeper than {MAX_JSON_DEPTH}"),
    "deep-object": (b'{"a":' * 20_000 + b"1" + b"}" * 20_000, 400, "deeper than"),
    "deep-unclosed": (b"[" * 100_000, 400, "deeper than"),
    "deep-in-params": (b'{"history": [1], "params": ' + b"[" * 40 + b"]" * 40 + b"}", 400, "deeper than"),
    "nan": (b'{"history": [1], "k": NaN}', 400, "NaN is not a JSON number"),
    "infinity": (b'{"history": [1], "k": Infinity}', 400, "Infinity is not a JSON number"),
    "minus-infinity": (b'{"history": [1], "k": -Infinity}', 400, "-Infinity"),
    "float-overflow": (b'{"history": [1], "k": 1e999}', 400, "out of range"),
    "not-json": (b"{not json", 400, "not valid JSON"),
    "empty": (b"", 400, "empty request body"),
    "whitespace": (b"  \n ", 400, "empty request body"),
    "not-utf8": (b'{"history": [1], "decoder": "\xff"}', 400, "not valid JSON"),
    "array": (b"[1, 2]", 400, "JSON object"),
    "string": (b'"hello"', 400, "JSON object"),
    "null": (b"null", 400, "JSON object"),
    "number": (b"42", 400, "JSON object"),
    "trailing-garbage": (b'{"history": [1]} x', 400, "not valid JSON"),
    "too-large": (b'{"history": [' + b"1," * 600_000 + b"1]}", 413, "the limit is"),
    # fields
    "no-history": ({"k": 5}, 422, "`history` is required"),
    "empty-history": ({"history": []}, 422, "`history` is empty"),
    "history-string": ({"history": "1,2"}, 422, "`history`"),
    "history-floats": ({"history": [1.5]}, 422, "`history.0`"),
    "history-bools": ({"history": [True]}, 422, "`history.0`"),
    "history-null": ({"history": [None]}, 422, "`history.0`"),
    "history-nested": ({"history": [[1]]}, 422, "`history.0`"),
    "history-unknown-id": ({"history": [1, 100]}, 422, "unknown item ids [100]"),
    "history-negative-id": ({"history": [-1]}, 422, "unknown item ids [-1]"),
    "history-int64-id": ({"history": [2**63 - 1]}, 422, "unknown item ids"),
    "history-too-long": ({"history": [1] * 201}, 422, "max_history_items=200"),
    "unknown-field": ({"history": [1], "colour": "red"}, 422, "unknown field `colour`"),
    "unknown-huge-field": ({"history": [1], BIG: 1}, 422, "unknown field"),
    "renamed-field": ({"history": [1], "constraint_set": "all"}, 422, "renamed `constraint`"),
    "decoder-unknown": ({"history": [1], "decoder": "nope"}, 422, "'nope' is not served"),
    "decoder-int": ({"history": [1], "decoder": 3}, 422, "`decoder`"),
    "decoder-empty": ({"history": [1], "decoder": ""}, 422, "`decoder` is empty"),
    "decoder-huge": ({"history": [1], "decoder": BIG}, 422, "is not served"),
    "k-zero": ({"history": [1], "k": 0}, 422, "`k` must be >= 1"),
    "k-negative": ({"history": [1], "k": -3}, 422, "`k`"),
    "k-string": ({"history": [1], "k": "ten"}, 422, "`k` takes an int"),
    "k-float": ({"history": [1], "k": 2.5}, 422, "`k`"),
    "k-above-beam": ({"history": [1], "k": 11}, 422, "larger than the beam width (10)"),
    "k-above-max-k": ({"history": [1], "k": 60, "beam_width": 60}, 422, "limit max_k"),
    "k-10-to-18": ({"history": [1], "k": 10**18}, 422, "limit max_k"),  # not "ask for beam_width >= 1e18"
    "k-in-params-huge": ({"history": [1], "params": {"k": 10**18}}, 422, "limit max_k"),
    "k-twice": ({"history": [1], "k": 5, "params": {"k": 5}}, 422, "given twice"),
    "beam-zero": ({"history": [1], "beam_width": 0}, 422, "`beam_width`"),
    "beam-string": ({"history": [1], "beam_width": "wide"}, 422, "`beam_width` takes an int"),
    "beam-huge-string": ({"history": [1], "params": {"beam_width": BIG}}, 422, "`beam_width` takes an int"),
    "beam-million": ({"history": [1, 2, 3], "k": 10, "beam_width": 1_000_000}, 422, "max_beam_width=64"),
    "beam-above-limit": ({"history": [1], "beam_width": 65}, 422, "max_beam_width=64"),
    "beam-int64": ({"history": [1], "beam_width": 2**62}, 422, "max_beam_width"),
    "draft-beams-above-limit": (
        {"history": [1], "decoder": "atspeed_strict", "params": {"draft_beams": 10_000}},
        422,
        "`draft_beams` 10000 is above this deployment's limit max_beam_width=64",
    ),
    "tokens-above-limit": ({"history": [1, 2, 3, 4, 5], "beam_width": 64}, 422, "max_batch_tokens="),
    "params-not-object": ({"history": [1], "params": [1]}, 422, "`params`"),
    "params-unknown": ({"history": [1], "params": {"colour": 1}}, 422, "colour"),
    "constraint-unknown": ({"history": [1], "constraint": "nope"}, 422, "'nope' is not a constraint rule"),
    "constraint-path-unused": (
        {"history": [1], "constraint": "all", "params": {"constraint_path": "/etc/passwd"}},
        422,
        "`constraint_path` '/etc/passwd' is not used with constraint 'all'",
    ),
    "constraint-size-unused": (
        {"history": [1], "params": {"constraint_size": 5}},
        422,
        "`constraint_size` 5 is not used with constraint 'none'",
    ),
    "constraint-unbuilt": (
        {"history": [1], "constraint": "random", "params": {"constraint_size": 7}},
        422,
        "not built",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_bad_body_gets_a_4xx_naming_the_problem(case):
    raw, status, words = BAD_BODIES[case]
    t0 = time.perf_counter()
    with pytest.raises(RequestError) as e:
        parse_recommend(body(raw), limits())
    assert e.value.status == status, e.value.message
    assert words in e.value.message
    assert len(e.value.message) <= MAX_DETAIL_CHARS + 40  # a 422 never echoes large input
    assert time.perf_counter() - t0 < 2.0  # rejected without heavy work


def test_the_largest_allowed_request_passes_and_reports_its_tokens():
    job = parse_recommend(
        body({"history": [1, 2, 3, 4, 5], "beam_width": 64, "k": 10}), limits(max_batch_tokens=10**6)
    )
    assert job.params.beam_width == 64 and job.tokens == 64 * 6 * 3
    at_limit = parse_recommend(
        body({"history": [1, 2, 3, 4, 5], "beam_width": 64, "k": 10}), limits(max_batch_tokens=64 * 6 * 3)
    )
    assert at_limit.tokens == 64 * 6 * 3


def test_over_long_histories_count_after_truncation():
    job = parse_recommend(body({"history": list(range(50)), "k": 3}), limits())
    assert job.truncated_from == 50 and len(job.history) == 5 and job.tokens == 10 * 6 * 3


def test_depth_scanner_ignores_brackets_in_strings():
    assert json_depth(b'{"a": "[[[[[[[[[[\\"[[[[", "b": [[1]]}') == 3
    assert json_depth(b'{"a": "x\\\\", "b": [1]}') == 2
    assert load_json_body(b'{"history": [1], "note": "' + b"[" * 100 + b'"}', 1 << 20, "ex")["history"] == [1]


def test_request_error_clips_any_message():
    err = RequestError(422, "bad value " + "y" * 100_000)
    assert len(err.message) < MAX_DETAIL_CHARS + 40 and "characters left out" in err.message


class StalledRequest:
    """A starlette Request stand-in whose body arrives in one chunk, then never finishes."""

    def __init__(self, headers: dict[str, str], chunks: list[bytes], stall: bool) -> None:
        self.headers, self.chunks, self.stall = headers, chunks, stall

    async def stream(self):
        for c in self.chunks:
            yield c
        if self.stall:
            await asyncio.sleep(3600)


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    "headers, chunks, stall, status",
    [
        (JSON, [b'{"history": '], True, 408),  # half a body, then silence
        ({**JSON, "content-length": "99999999"}, [], False, 413),  # announced too large: refused unread
        ({**JSON, "content-length": "12abc"}, [], False, 400),
        (JSON, [b"x" * 700_000, b"x" * 700_000], False, 413),  # streamed past the limit
        # a cross-origin "simple" POST (text/plain, a form, no type) never reaches the decoder
        ({"content-type": "text/plain"}, [b'{"history": [1]}'], False, 415),
        ({"content-type": "application/x-www-form-urlencoded"}, [b"history=1"], False, 415),
        ({}, [b'{"history": [1]}'], False, 415),
        ({"content-type": "application/jsonx"}, [b"{}"], False, 415),
    ],
)
def test_body_reading_is_bounded_in_time_and_size(headers, chunks, stall, status):
    pytest.importorskip("ray.serve")
    from genrec.platform.serve.app import read_body

    async def run() -> None:
        await read_body(StalledRequest(headers, chunks, stall), 1 << 20, 0.2)

    t0 = time.perf_counter()
    with pytest.raises(RequestError) as e:
        asyncio.run(run())
    assert e.value.status == status and time.perf_counter() - t0 < 2.0


def test_token_budget_splits_a_group_into_calls():
    pytest.importorskip("ray.serve")
    from genrec.platform.serve.batch_decoder import token_chunks

    assert token_chunks([0, 1, 2, 3], [5, 5, 5, 5], 10) == [[0, 1], [2, 3]]
    assert token_chunks([0, 1, 2], [10, 1, 10], 10) == [[0], [1], [2]]
    assert token_chunks([0], [99], 10) == [[0]]


@pytest.mark.parametrize(
    "ctype", ["application/json", "Application/JSON; charset=utf-8", "application/x+json"]
)
def test_json_content_types_are_read(ctype):
    pytest.importorskip("ray.serve")
    from genrec.platform.serve.app import read_body

    got = asyncio.run(read_body(StalledRequest({"content-type": ctype}, [b"{}"], False), 1 << 20, 0.2))
    assert got == b"{}"


def static_limits() -> Limits:
    return limits(
        decoders=("static",),
        default_decoder="static",
        defaults={"static": parse_decoder_params("static", {"beam_width": 10, "k": 10})},
        device="cpu",
    )


@pytest.mark.parametrize(
    "params, words",
    [
        ({"dense_levels": 99}, "`dense_levels` 99 is not below the SIDs' 3 levels"),
        ({"kernel": "triton"}, "`kernel` 'triton'"),
        (
            {"backend": "cpu_trie", "kernel": "triton"},
            "`kernel` 'triton' is not used with backend 'cpu_trie'",
        ),
        (
            {"backend": "ppv_exact", "dense_levels": 1},
            "`dense_levels` 1 is not used with backend 'ppv_exact'",
        ),
    ],
)
def test_settings_the_request_cannot_use_are_refused_by_name(params, words):
    with pytest.raises(RequestError) as e:
        parse_recommend(body({"history": [1], "params": params}), static_limits())
    assert e.value.status == 422 and words in e.value.message, e.value.message
