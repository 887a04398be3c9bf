"""Only the front door: with the HAProxy ingress, a replica serves only what came through HAProxy.

Serve's HAProxy mode leaves two more ways into a replica on the app's host: the replica's own HTTP
port (Serve's "direct ingress", 30000-31000) and Serve's fallback proxy. Neither has HAProxy's
`timeout http-request` or its body buffering (`wait-for-body`), so a client that sends half a body
there holds one of the replica's admission slots for `body_timeout_s`; enough of them turn good
requests away with 503.

So `genrec serve` draws a random key per local Ray instance (`draw_key`) and gives it to both sides:
HAProxy (haproxy_guard.py) sets it as the `FRONT_DOOR_HEADER` of every request it forwards, after
deleting any copy the client sent, and the replicas find it in their environment (`FRONT_DOOR_ENV`,
inherited from `ray.init`). `FrontDoorOnly`, an ASGI middleware in front of the app, answers a request
without the right header at once with a JSON 403, before the app reads a byte of the body or counts
it against admission, and closes the connection: a half-sent body at a side door costs a replica
nothing past its headers. Serve's own `/-/healthz` and `/-/routes` (HAProxy's health checks) are
answered by Serve before the app and stay open.

Without a key in the environment (a cluster started by the user, the `proxy` ingress, the in-process
harness) the middleware passes everything through. The key is never logged or echoed: the 403 says
only that this port serves the front door's requests. Standard library only (the HAProxy wrapper
imports it).
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

FRONT_DOOR_ENV = "GENREC_FRONT_DOOR_KEY"  # the key, in the environment of the Ray instance
FRONT_DOOR_HEADER = "x-genrec-front-door"  # the header HAProxy sets on what it forwards
SIDE_DOOR_DETAIL = (
    "this port serves only requests that come through the app's front door (HAProxy on the app's host "
    "and port); send the request there"
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def draw_key() -> str:
    """A fresh key: 256 random bits, URL-safe (so it needs no quoting in HAProxy's config)."""
    return secrets.token_urlsafe(32)


def configured_key() -> str:
    """The key this process was started with ('' when none: every request is served)."""
    return os.environ.get(FRONT_DOOR_ENV, "")


def front_door_state() -> dict[str, object]:
    """What GET /health says of the side doors (never the key): whether a key is required, and how many
    requests this replica refused for lacking it."""
    return {"key_required": bool(configured_key()), "refused": FrontDoorOnly.refused}


def came_through_front_door(headers: list[tuple[bytes, bytes]], key: str) -> bool:
    """Whether the request's headers carry the key (compared in constant time)."""
    name = FRONT_DOOR_HEADER.encode()
    got = next((value for header, value in headers if header.lower() == name), b"")
    return hmac.compare_digest(got, key.encode())


class FrontDoorOnly:
    """ASGI middleware: with a configured key, a request without it gets 403 before the app sees it.
    `refused` counts those 403s (and closed websockets) in this process, for GET /health."""

    refused = 0

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = configured_key()
        if not key or scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        if came_through_front_door(scope.get("headers") or [], key):
            return await self.app(scope, receive, send)
        FrontDoorOnly.refused += 1
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = json.dumps({"detail": SIDE_DOOR_DETAIL}).encode()
        # `receive` is never called: the body is not read, and `connection: close` ends the connection
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
