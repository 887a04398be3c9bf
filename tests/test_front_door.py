"""The replicas' side of the front-door key (platform/serve/front_door.py): with a key configured, a
request without it is answered 403 before the app runs or a byte of its body is read; without one,
everything passes."""

from __future__ import annotations

import asyncio
import json

from genrec.platform.serve.front_door import (
    FRONT_DOOR_ENV,
    FRONT_DOOR_HEADER,
    FrontDoorOnly,
    came_through_front_door,
    draw_key,
    front_door_state,
)


def call(headers: list[tuple[bytes, bytes]]) -> tuple[list[dict], list[str]]:
    """(the messages sent, what happened: 'app' when the app ran, 'receive' when the body was read)."""
    sent: list[dict] = []
    events: list[str] = []

    async def app(scope, receive, send):
        events.append("app")
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive():
        events.append("receive")
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/recommend", "headers": headers}
    asyncio.run(FrontDoorOnly(app)(scope, receive, send))
    return sent, events


def test_without_the_key_a_request_gets_403_and_its_body_is_never_read(monkeypatch):
    key = draw_key()
    monkeypatch.setenv(FRONT_DOOR_ENV, key)
    name = FRONT_DOOR_HEADER.encode()
    for headers in ([], [(name, b"guess")], [(name, key[:-1].encode())], [(b"x-other", key.encode())]):
        sent, events = call([(b"content-length", b"100"), *headers])
        assert events == []  # neither the app nor the body
        assert sent[0]["status"] == 403 and (b"connection", b"close") in sent[0]["headers"]
        detail = json.loads(sent[1]["body"])["detail"]
        assert "front door" in detail and key not in detail


def test_with_the_key_or_without_one_configured_the_app_answers(monkeypatch):
    key = draw_key()
    monkeypatch.setenv(FRONT_DOOR_ENV, key)
    sent, events = call([(FRONT_DOOR_HEADER.encode(), key.encode())])
    assert events == ["app", "receive"] and sent[0]["status"] == 200
    monkeypatch.delenv(FRONT_DOOR_ENV)  # a cluster started by the user, the proxy ingress
    sent, events = call([])
    assert events == ["app", "receive"] and sent[0]["status"] == 200


def test_the_header_name_is_matched_in_any_case_and_the_value_exactly():
    key = draw_key()
    assert came_through_front_door([(b"X-Genrec-Front-Door", key.encode())], key)
    assert not came_through_front_door([(FRONT_DOOR_HEADER.encode(), key.encode() + b"x")], key)
    assert draw_key() != key


def test_health_says_whether_a_key_is_required_and_counts_the_refused(monkeypatch):
    key = draw_key()
    monkeypatch.setenv(FRONT_DOOR_ENV, key)
    before = front_door_state()
    assert before["key_required"] is True and key not in json.dumps(before)
    call([])  # refused
    call([(FRONT_DOOR_HEADER.encode(), key.encode())])  # let through: not counted
    assert front_door_state()["refused"] == before["refused"] + 1
    monkeypatch.delenv(FRONT_DOOR_ENV)
    assert front_door_state()["key_required"] is False
