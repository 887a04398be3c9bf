"""Fault suite, the HTTP edge: a hardened HAProxy (platform/serve/haproxy_guard.py) run alone in front of a
stub replica answers an oversized /recommend with 413 before any `100 Continue`, refuses an HTTP/1.1
request without Host and an unknown HTTP version with a JSON 400, never forwarding them, and forwards
requests with the front-door key in place of any copy the client sent. Input its HTTP parser rejects
gets HAProxy 2.8's built-in HTML 400 (the split is recorded below: docs/serving.md, "Known gap")."""

from __future__ import annotations

import http.server
import socket
import subprocess
import threading
import time

import pytest

from genrec.platform.serve.front_door import FRONT_DOOR_HEADER
from genrec.platform.serve.haproxy_guard import GuardSettings, harden, write_error_pages
from genrec.platform.serve.ingress import free_port, haproxy_available, real_haproxy_binary

pytestmark = pytest.mark.skipif(not haproxy_available(), reason="HAProxy not installed")

CONFIG = """global
    stats socket {d}/admin.sock mode 666 level admin
defaults
    mode http
    timeout connect 5s
    timeout client 3600s
    timeout server 30s
frontend http_frontend
    bind 127.0.0.1:{port}
    default_backend app
backend app
    server r1 127.0.0.1:{upstream}
"""


KEY = "k" * 43  # the front-door key this HAProxy sets (a real one is drawn per Ray instance)


class Stub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    forwarded: list[str] = []
    keys: list[str | None] = []  # the front-door header of each forwarded request

    def do_POST(self):  # noqa: N802 - http.server's name
        Stub.forwarded.append(self.path)
        Stub.keys.append(self.headers.get(FRONT_DOOR_HEADER))
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b'{"items": []}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    d = tmp_path_factory.mktemp("haproxy")
    stub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    port = free_port()
    settings = GuardSettings(
        real_haproxy_binary(), str(d), http_request_timeout_s=1, client_timeout_s=30, front_door_key=KEY
    )
    write_error_pages(settings)
    cfg = d / "haproxy.cfg"
    cfg.write_text(harden(CONFIG.format(d=d, port=port, upstream=stub.server_address[1]), settings))
    proc = subprocess.Popen([settings.real_binary, "-f", str(cfg), "-db"], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(10)
    stub.shutdown()


def exchange(port: int, data: bytes, wait_s: float = 2.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            pass
    return b"".join(chunks)


def test_an_oversized_body_gets_413_before_100_continue(edge):
    Stub.forwarded.clear()
    head = (
        b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 50000000\r\nExpect: 100-continue\r\n\r\n"
    )
    answer = exchange(edge, head)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"100 Continue" not in answer and b'"detail"' in answer and not Stub.forwarded


def test_a_body_within_the_limit_is_forwarded_with_the_key_not_the_clients(edge):
    Stub.keys.clear()
    body = b'{"history": [1]}'
    head = b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    for forged in (b"", b"%s: guess\r\n%s: again\r\n" % ((FRONT_DOOR_HEADER.encode(),) * 2)):
        answer = exchange(edge, head + forged + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert Stub.keys == [KEY, KEY]  # one copy, HAProxy's


@pytest.mark.parametrize(
    "request_line, headers",
    [
        (b"GET /health HTTP/1.1", b""),  # HTTP/1.1 requires Host
        (b"GET /health HTTP/9.9", b"Host: x\r\n"),
    ],
)
def test_malformed_requests_get_a_json_400_and_are_not_forwarded(edge, request_line, headers):
    Stub.forwarded.clear()
    answer = exchange(edge, request_line + b"\r\n" + headers + b"Connection: close\r\n\r\n")
    assert answer.split(b"\r\n", 1)[0].endswith(b"400 Bad Request"), answer[:200]
    assert b'"detail"' in answer and not Stub.forwarded


def test_a_stalled_body_never_reaches_the_replica(edge):
    Stub.forwarded.clear()
    head = b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: 100\r\n\r\n"
    answer = exchange(edge, head + b'{"history"', wait_s=4.0)  # then silence
    assert answer.split(b"\r\n", 1)[0].endswith(b"408 Request Timeout"), answer[:200]
    assert b'"detail"' in answer and not Stub.forwarded


JSON_BODY = b'{"history": [1]}'
POST_HEAD = b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
# Input HAProxy's HTTP/1 parser (its mux) rejects before a stream exists. HAProxy 2.8 answers these from
# its built-in messages, not from `errorfile 400`: src/mux_h1.c, h1_send_error(), which copies
# `http_err_msgs[rc]` (line 2645 at v2.8.0) and consults the errorfile only to send nothing when it is
# empty. The fix of haproxy/haproxy#3032 (commit d252ec2be, first tagged v3.3-dev10, marked for backport
# to 3.2) makes it use the errorfile.
PARSER_ERRORS = {
    "tls-client-hello": bytes.fromhex("16030100a5010000a10303") + b"\x00" * 64,
    "garbage-request-line": b"NOT HTTP AT ALL\r\n\r\n",
    "nul-in-header": b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "bad-content-length": POST_HEAD + b"Content-Length: abc\r\n\r\n" + JSON_BODY,
    "duplicate-content-length": POST_HEAD + b"Content-Length: 16\r\nContent-Length: 17\r\n\r\n" + JSON_BODY,
    "bad-chunk-size": POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + JSON_BODY + b"\r\n0\r\n\r\n",
    "64kb-header": b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n",
    "70kb-url": b"GET /health?" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "300-headers": b"GET /health HTTP/1.1\r\nHost: x\r\n"
    + b"".join(b"X-H%d: v\r\n" % i for i in range(300))
    + b"\r\n",
    "http-0.9": b"GET /health\r\n\r\n",
}
# Malformed but parseable: the stream's rules judge them (edge_rules), with the JSON errorfile.
RULE_ERRORS = {
    "http-1.1-without-host": b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n",
    "http-9.9": b"GET /health HTTP/9.9\r\nHost: x\r\nConnection: close\r\n\r\n",
}


def test_which_malformed_requests_get_json_and_which_haproxys_html_page(edge):
    """The exact split today: a change (an HAProxy with the fix, or a new rule) must show up here and in
    docs/serving.md. Every one is a 400 and none reaches the replica."""
    Stub.forwarded.clear()
    shape = {}
    for name, data in {**PARSER_ERRORS, **RULE_ERRORS}.items():
        answer = exchange(edge, data)
        assert answer.split(b"\r\n", 1)[0].lower().startswith(b"http/1.1 400 bad request"), (
            name,
            answer[:200],
        )
        body = answer.partition(b"\r\n\r\n")[2]
        shape[name] = "json" if body.startswith(b'{"detail"') else "html" if b"<html>" in body else body[:80]
    assert shape == {**dict.fromkeys(PARSER_ERRORS, "html"), **dict.fromkeys(RULE_ERRORS, "json")}
    assert not Stub.forwarded
