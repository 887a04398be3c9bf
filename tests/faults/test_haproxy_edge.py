"""Fault suite, the HTTP edge: a hardened HAProxy (platform/serve/haproxy_guard.py) run alone in front of a
stub replica answers an oversized /recommend with 413 before any `100 Continue`, and refuses an HTTP/1.1
request without Host and an unknown HTTP version with a JSON 400, never forwarding them."""

from __future__ import annotations

import http.server
import socket
import subprocess
import threading
import time

import pytest

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


class Stub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    forwarded: list[str] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        Stub.forwarded.append(self.path)
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
    settings = GuardSettings(real_haproxy_binary(), str(d), http_request_timeout_s=1, client_timeout_s=30)
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


def test_a_body_within_the_limit_is_forwarded(edge):
    body = b'{"history": [1]}'
    head = b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    answer = exchange(edge, head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


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
