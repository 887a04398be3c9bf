"""The Serve app's HTTP edge, which knows nothing of decoding: reading a request body within a size and
time bound, and the JSON answers for errors (`{"detail": "..."}`, the shape of every non-2xx answer)
and for overload (503 or 429 with Retry-After)."""

from __future__ import annotations

import asyncio
import math

from fastapi import Request
from fastapi.responses import JSONResponse

from genrec.platform.serve.requests import RequestError

CLIENT_CLOSED = 499  # nginx's "client closed request": logged as a client event, not a server error


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


def overloaded(status: int, message: str, retry_after_s: float) -> JSONResponse:
    """503 (or 429) with Retry-After in whole seconds, at least 1 (HTTP's unit)."""
    return JSONResponse(
        {"detail": message},
        status_code=status,
        headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))},
    )


def is_json_media_type(content_type: str | None) -> bool:
    """application/json or any application/*+json, parameters (charset) aside, in any letter case."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """The whole body within `timeout_s` and `max_bytes`, or RequestError (415, 408, 413, 400): a client
    that stalls mid-body or streams without end cannot hold an admission slot for longer than that.

    Only a JSON Content-Type is read: a browser sends a cross-origin POST without asking the server
    first only when its type is text/plain, a form or none, so any web page a local user opens could
    otherwise make the service decode."""
    ctype = request.headers.get("content-type")
    if not is_json_media_type(ctype):
        got = f"Content-Type {ctype[:60]!r}" if ctype else "no Content-Type"
        raise RequestError(415, f"the body must be JSON sent as Content-Type: application/json, got {got}")
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(400, f"Content-Length {declared[:40]!r} is not a byte count")
        if int(declared) > max_bytes:
            raise RequestError(413, f"request body is {declared} bytes; the limit is {max_bytes}")

    async def collect() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise RequestError(413, f"request body is over {max_bytes} bytes, the limit")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(collect(), timeout_s)
    except TimeoutError:
        raise RequestError(
            408, f"the request body did not arrive within body_timeout_s={timeout_s:g} s; send it at once"
        ) from None
