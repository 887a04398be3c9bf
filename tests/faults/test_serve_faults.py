"""Fault suite, faults against a running Serve app (the session's local Ray, 127.0.0.1 only): one huge
request, the largest allowed request decoding while /health is asked, 200 connections that stall
mid-body, hostile JSON, Serve's own and HAProxy's errors, a request past its deadline, the listeners
and files HAProxy uses, and a replica SIGKILLed mid-request.

The app serves a wide catalogue (3 levels of 64 codes) so that the largest beam its limits allow takes
about a second on this CPU: long enough to show that nothing else waits for it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import socket
import stat
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fault_helpers import listeners, pids_mentioning, wait_until

pytest.importorskip("ray.serve")
aiohttp = pytest.importorskip("aiohttp")

from genrec.platform.serve.config import ServeConfig  # noqa: E402
from genrec.platform.serve.ingress import active_ingress, free_port, haproxy_available  # noqa: E402
from genrec.platform.serve.server import HttpSettings, reconfigure, start_server, stop_server  # noqa: E402

MAX_BEAM = 32768  # ~1 s for one request of the wide tiny model on one core
WINDOW = 20  # the model's history window (TrainConfig's default max_items)
MAX_TOKENS = MAX_BEAM * (WINDOW + 1) * 3


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    from genrec.workloads.data.synth import SynthConfig, synth_dataset
    from genrec.workloads.training.train_config import TrainConfig
    from genrec.workloads.training.trainer import train

    root = tmp_path_factory.mktemp("wide")
    synth_dataset(
        SynthConfig(seed=0, num_users=200, num_items=2000, levels=3, codebook_size=64), root / "data"
    )
    cfg = TrainConfig(model_size="tiny", epochs=1, batch_size=64, warmup_steps=2, max_steps=5)
    train(root / "data", root / "model", cfg, progress=False)  # quality does not matter here, time does
    return root / "model", root / "data"


@pytest.fixture(scope="module")
def app(ray_session, wide_model):
    model, data = wide_model
    cfg = ServeConfig(
        model=model,
        data=data,
        decoders=["beam"],
        defaults={"beam": {"beam_width": 8, "k": 5}},
        constraint_sets={},
        num_cpus=0.5,
        threads=1,
        max_queued_requests=8,
        batching={"max_batch_size": 4, "batch_wait_timeout_s": 0.002},
        limits={"max_beam_width": MAX_BEAM, "max_batch_tokens": MAX_TOKENS},
        body_timeout_s=2.0,
        warmup_batches=1,
    )
    url = start_server(cfg, HttpSettings(port=free_port()))
    yield url, cfg
    stop_server()


def get(url: str, timeout: float = 10.0) -> tuple[int, dict, dict]:
    return request("GET", url, None, timeout)


def post(url: str, body, timeout: float = 30.0) -> tuple[int, dict, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return request("POST", f"{url}/recommend", data, timeout)


def request(method: str, url: str, data: bytes | None, timeout: float) -> tuple[int, dict, dict]:
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        raw = e.read()
        assert "json" in e.headers.get("content-type", ""), (e.code, e.headers, raw[:200])
        return e.code, json.loads(raw), dict(e.headers)


def history(n: int = WINDOW) -> list[int]:
    return list(range(1, n + 1))


def test_a_huge_beam_is_refused_at_once_naming_the_limit(app):
    url, _ = app
    t0 = time.perf_counter()
    status, body, _ = post(url, {"history": [1, 2, 3], "k": 10, "beam_width": 1_000_000})
    assert status == 422 and f"max_beam_width={MAX_BEAM}" in body["detail"]
    assert time.perf_counter() - t0 < 2.0
    status, body, _ = post(url, {"history": history(), "k": 10, "beam_width": MAX_BEAM + 1})
    assert status == 422 and "max_beam_width" in body["detail"]


def test_health_answers_within_a_second_while_the_largest_allowed_request_decodes(app):
    url, _ = app
    result: dict = {}

    def largest() -> None:
        result["answer"] = post(url, {"history": history(), "k": 10, "beam_width": MAX_BEAM}, timeout=60)

    worker = threading.Thread(target=largest)
    worker.start()
    health_s = []
    while worker.is_alive():
        t0 = time.perf_counter()
        status, _, _ = get(f"{url}/health", timeout=5)
        health_s.append(time.perf_counter() - t0)
        assert status == 200
        time.sleep(0.05)
    worker.join()
    status, body, _ = result["answer"]
    assert status == 200, body
    assert body["timings_ms"]["decoder_call"] > 300  # it really decoded for a while ...
    assert len(health_s) >= 3 and max(health_s) < 1.0, health_s  # ... and /health never waited for it


def test_a_request_past_its_deadline_is_dropped_before_decoding_and_counted(app):
    url, cfg = app
    try:
        # well below one wide call (~1 s on one core, ~0.3 s on a fast idle one), so the calls after the
        # first always start past their deadline. The batch starts when its third request is in (not
        # after a 2 ms wait, which a loaded machine's spread of arrivals overran: the later requests then
        # waited in Serve's queue and were cancelled there by their 504, never reaching the decoder).
        # The replica applies a reconfigure asynchronously: the requests go out once health shows it.
        live = {"request_timeout_s": 0.2, "max_batch_size": 3, "batch_wait_timeout_s": 5.0}
        reconfigure(cfg, **live)
        wait_until = time.monotonic() + 20
        while time.monotonic() < wait_until:
            now = get(f"{url}/health")[1]
            if (now["request_timeout_s"], now["max_batch_size"], now["batch_wait_timeout_s"]) == (
                0.2,
                3,
                5.0,
            ):
                break
            time.sleep(0.1)
        before = get(f"{url}/health")[1]

        async def three() -> list[int]:
            async with aiohttp.ClientSession() as s:

                async def one() -> int:
                    body = {"history": history(), "k": 10, "beam_width": MAX_BEAM}
                    async with s.post(f"{url}/recommend", json=body) as r:
                        assert "json" in r.headers["content-type"]
                        return r.status

                return await asyncio.gather(*(one() for _ in range(3)))

        statuses = asyncio.run(three())  # one batch; each call takes ~1 s, longer than the deadline
    finally:
        reconfigure(cfg)
    assert statuses.count(504) >= 2, statuses
    # the calls after the first never ran: their deadline had passed when the decoder got to them. The
    # decoder may still be in the first call when the 504s arrive (a loaded machine decodes slower), so
    # the count is polled until the batch is over
    deadline = time.monotonic() + 20
    while (after := get(f"{url}/health")[1])["expired"] == before["expired"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert after["timed_out"] - before["timed_out"] == statuses.count(504)
    assert after["expired"] - before["expired"] >= 1


def open_partial(port: int, n: int) -> list[socket.socket]:
    """n connections that send their headers and part of the body, then nothing."""
    conns = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(
            b"POST /recommend HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"history": ['
        )
        conns.append(s)
    return conns


def test_200_connections_stalled_mid_body_do_not_stop_good_requests(app):
    url, cfg = app
    port = int(url.rsplit(":", 1)[1])
    stalled = open_partial(port, 200)
    try:
        t0 = time.perf_counter()
        for i in range(10):
            status, body, _ = post(url, {"history": [i + 1, 2], "k": 5}, timeout=10)
            assert status == 200, body
            assert get(f"{url}/health")[0] == 200
        assert time.perf_counter() - t0 < 10
        # the stalled ones are answered, not kept: 408 JSON (or closed) within the request timeout
        first = stalled[0]
        first.settimeout(15)
        answer = first.recv(4096)
        assert answer == b"" or (b" 408 " in answer.split(b"\r\n", 1)[0] and b'"detail"' in answer), answer[
            :200
        ]
    finally:
        for s in stalled:
            s.close()


def side_doors(replica_pid: int) -> dict[str, int]:
    """The ways into the replica that skip HAProxy: its own HTTP port (Serve's direct ingress, in
    30000-31000) and Serve's fallback proxy (the port genrec drew)."""
    from genrec.platform.serve import ingress

    own = [x.port for x in listeners() if x.pid == replica_pid and 30000 <= x.port <= 31000]
    assert own and ingress._RUNTIME is not None, "the replica has no direct-ingress port"
    return {"replica": own[0], "fallback proxy": ingress._RUNTIME.fallback_ports[0]}


def read_answer(conn: socket.socket, timeout_s: float = 2.0) -> bytes:
    """One HTTP answer (its head and its Content-Length or chunked body), or what came before the other
    side closed or went silent for `timeout_s`."""
    conn.settimeout(timeout_s)
    data = b""
    try:
        while chunk := conn.recv(4096):
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            if sep and length and len(body) >= int(length.group(1)):
                break
            if sep and b"chunked" in head.lower() and body.endswith(b"0\r\n\r\n"):
                break
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def first_answers(conns: list[socket.socket], since: float, timeout_s: float) -> dict:
    """socket -> (its answer, or b"" if closed without one; seconds from `since` until it began)."""
    got: dict = {}
    deadline = time.perf_counter() + timeout_s
    waiting = list(conns)
    while waiting and time.perf_counter() < deadline:
        readable, _, _ = select.select(waiting, [], [], 0.05)
        for conn in readable:
            began = time.perf_counter() - since
            got[conn] = (read_answer(conn), began)
            waiting.remove(conn)
    assert not waiting, f"{len(waiting)} side-door connections got no answer within {timeout_s} s"
    return got


@pytest.mark.skipif(not haproxy_available(), reason="HAProxy ingress not installed")
def test_half_bodies_at_the_side_doors_are_refused_at_once_and_good_requests_go_through(app):
    """40 half-sent bodies to the replica's own port and 40 to Serve's fallback proxy (each more than the
    replica's admission bound of 12), held while 12 good requests go through HAProxy: every good one
    gets 200, every side-door connection a JSON 403 (or, at the fallback proxy, Serve's own 503 when its
    queue for the replica is full; or is closed) well before body_timeout_s, and the
    key HAProxy adds appears neither there nor in /health."""
    url, cfg = app
    if get(f"{url}/health")[1]["ingress"] != "haproxy":
        pytest.skip("this Ray serves through Serve's proxy: there is no side door")
    from genrec.platform.serve import ingress

    key = ingress._RUNTIME.settings.front_door_key
    doors = side_doors(get(f"{url}/health")[1]["pid"])
    held = {name: open_partial(port, 40) for name, port in doors.items()}
    opened = time.perf_counter()
    try:
        result: dict = {}

        def good() -> None:
            async def twelve() -> list[int]:
                async with aiohttp.ClientSession() as s:

                    async def one(i: int) -> int:
                        async with s.post(f"{url}/recommend", json={"history": [i + 1, 2], "k": 5}) as r:
                            return r.status

                    return await asyncio.gather(*(one(i) for i in range(12)))

            time.sleep(0.3)  # the side-door requests reach the replica first
            result["statuses"] = asyncio.run(twelve())

        sender = threading.Thread(target=good)
        sender.start()
        answers = {name: first_answers(conns, opened, timeout_s=10) for name, conns in held.items()}
        sender.join()
        statuses = result["statuses"]
    finally:
        for conns in held.values():
            for conn in conns:
                conn.close()
    assert statuses == [200] * 12, statuses
    for name, got in answers.items():
        for answer, _ in got.values():
            head = answer.split(b"\r\n", 1)[0]
            refused = b" 403 " in head and b"front door" in answer
            # the fallback proxy queues at most max_queued_requests for the replica and turns the rest
            # away itself, at once (Serve's plain-text 503): they never reach the replica either
            dropped = name == "fallback proxy" and b" 503 " in head and b"backpressure" in answer
            assert answer == b"" or refused or dropped, (name, answer[:300])
            assert key.encode() not in answer
        assert any(b" 403 " in answer for answer, _ in got.values()), name
        # refused, not timed out: a 408 would come at body_timeout_s
        took = sorted(t for _, t in got.values())
        assert took[-1] < cfg.body_timeout_s, (name, [round(t, 2) for t in took])
    state = get(f"{url}/health")[1]
    assert key not in json.dumps(state)
    # /health says a key is required and counts the side-door 403s (this replica's, since it started)
    assert state["front_door"]["key_required"] is True and state["front_door"]["refused"] > 0


HOSTILE = {
    "huge-int": b'{"history": [' + b"7" * 5000 + b'], "k": 5}',
    "deep-json": b"[" * 50_000 + b"]" * 50_000,
    "nan": b'{"history": [1], "k": NaN}',
    "not-json": b"{history",
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_json_gets_a_400_json_answer(app, case):
    url, _ = app
    status, body, _ = post(url, HOSTILE[case])
    assert status == 400 and body["detail"]


def test_a_422_does_not_echo_large_input(app):
    url, _ = app
    status, body, _ = post(url, {"history": [1], "params": {"beam_width": "w" * 500_000}})
    assert status == 422 and len(json.dumps(body)) < 2000


def raw_exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def test_every_error_is_json_whoever_answers_it(app):
    url, _ = app
    port = int(url.rsplit(":", 1)[1])
    for method, path in [("GET", "/nope"), ("GET", "/recommend"), ("DELETE", "/health")]:
        status, body, headers = request(method, f"{url}{path}", None, 10)
        assert status in (404, 405) and body["detail"]
    # Not HTTP at all: HAProxy 2.8 answers parse errors with its built-in page, ignoring errorfile 400
    # (haproxy/haproxy#3032); the status is right, the body is HTML (docs/serving.md, "Known gap";
    # test_haproxy_edge.py records which malformed inputs get which).
    garbage = raw_exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
    assert b" 400 " in garbage.split(b"\r\n", 1)[0]

    async def burst() -> list[tuple[int, str, str]]:
        async with aiohttp.ClientSession() as s:

            async def one(i: int):
                body = {"history": history(), "k": 5, "beam_width": 4096}
                async with s.post(f"{url}/recommend", json=body) as r:
                    return r.status, r.headers.get("content-type", ""), await r.text()

            return await asyncio.gather(*(one(i) for i in range(60)))

    answers = asyncio.run(burst())  # beyond the replica's bound: its own 503s, maybe Serve's too
    codes = [status for status, _, _ in answers]
    assert 200 in codes and any(c in (503, 429) for c in codes), codes
    for status, ctype, text in answers:
        if status != 200:
            assert "json" in ctype and json.loads(text)["detail"], (status, ctype, text[:200])


@pytest.mark.skipif(not haproxy_available(), reason="HAProxy ingress not installed")
def test_haproxy_listens_on_127_0_0_1_only_with_owner_only_files(app):
    url, _ = app
    port = int(url.rsplit(":", 1)[1])
    if active_ingress() != "haproxy" and get(f"{url}/health")[1]["ingress"] != "haproxy":
        pytest.skip("this Ray serves through Serve's proxy")
    runtime = (
        Path(os.environ["GENREC_HAPROXY_SETTINGS"]).parent
        if "GENREC_HAPROXY_SETTINGS" in os.environ
        else None
    )
    from genrec.platform.serve import ingress

    runtime = ingress._RUNTIME.dir if ingress._RUNTIME is not None else runtime
    assert runtime is not None and runtime.is_dir()
    haproxy = set(pids_mentioning(str(runtime)))
    assert haproxy, "no HAProxy runs from the runtime folder"
    mine = [x for x in listeners() if x.pid in haproxy or x.port == port]
    ports = {x.port for x in mine}
    assert {port, ingress._RUNTIME.stats_port, ingress._RUNTIME.metrics_port} <= ports
    assert all(x.local_only for x in mine), mine
    assert not [x for x in listeners() if x.port in (8404, 9101)]  # Ray's fixed defaults are not used
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
    sockets = list(runtime.glob("*/admin.sock"))
    assert sockets and all(stat.S_IMODE(s.stat().st_mode) & 0o077 == 0 for s in sockets)


def test_a_replica_killed_mid_request_never_leaves_a_client_hanging(app):
    """Last in the module: Serve restarts the replica, which takes a while.

    Each client gets a JSON answer before its deadline: 200 (its request finished first) or 503 with
    Retry-After (HAProxy's answer for a replica that died under it, or Serve's when the request went
    through its fallback proxy). While Ray reloads HAProxy after the death, a connection can be closed
    without an answer; the client retries once, as a client of a 503 would, and must then get one."""
    url, _ = app
    pid = get(f"{url}/health")[1]["pid"]
    deadline_s = 20.0

    async def clients() -> list[tuple[int, float, int]]:
        timeout = aiohttp.ClientTimeout(total=deadline_s)
        async with aiohttp.ClientSession(timeout=timeout) as s:

            async def attempt(body: dict) -> int | None:
                try:
                    async with s.post(f"{url}/recommend", json=body) as r:
                        text = await r.text()
                        if r.status != 200:
                            ctype = r.headers.get("content-type", "")
                            assert "json" in ctype and json.loads(text)["detail"], (r.status, text[:200])
                        return r.status
                except aiohttp.ClientConnectionError:
                    return None

            async def one(i: int) -> tuple[int, float, int]:
                t0 = time.perf_counter()
                body = {"history": history(), "k": 5, "beam_width": MAX_BEAM // 2}
                status, tries = await attempt(body), 1
                if status is None:  # dropped, not hung: retry once
                    await asyncio.sleep(0.5)
                    status, tries = await attempt(body), 2
                return status, time.perf_counter() - t0, tries

            async def kill():
                await asyncio.sleep(0.3)
                os.kill(pid, 9)  # the replica this module's app started

            results = await asyncio.gather(*(one(i) for i in range(6)), kill())
            return results[:-1]

    results = asyncio.run(clients())
    for status, took, _ in results:
        assert status in (200, 503), results  # a JSON answer, never a hang
        assert took < deadline_s
    assert any(status == 503 for status, _, _ in results), results
    # Serve brings a new replica up; the app answers again
    assert wait_until(lambda: _healthy_pid(url) not in (None, pid), 90, poll_s=1.0)


def _healthy_pid(url: str) -> int | None:
    try:
        status, body, _ = get(f"{url}/health", timeout=5)
    except (urllib.error.URLError, ConnectionError, TimeoutError, AssertionError, json.JSONDecodeError):
        return None
    return body.get("pid") if status == 200 else None


def test_a_poison_request_among_good_ones_fails_alone(app):
    """Five rounds of 10 good requests and one the CPU deployment cannot decode (a Triton backend), sent
    together so they share batches: the poison gets a 422 naming the parameter before it is queued,
    every good request a 200 (tests/faults/test_isolation.py checks the batch itself)."""
    url, _ = app

    async def round_() -> list[tuple[int, dict]]:
        async with aiohttp.ClientSession() as s:

            async def one(body: dict):
                async with s.post(f"{url}/recommend", json=body) as r:
                    return r.status, await r.json()

            good = {"history": history(), "k": 5}
            poison = {**good, "params": {"attention": "triton"}}
            return await asyncio.gather(*(one(poison if i == 5 else good) for i in range(11)))

    for _ in range(5):
        for _attempt in range(3):  # admission's 503 (queue full on a loaded machine) is not what is tested
            answers = asyncio.run(round_())
            if all(s != 503 for s, _ in answers):
                break
            time.sleep(1.0)
        status, body = answers.pop(5)
        assert status == 422 and "`attention` 'triton'" in body["detail"], (status, body)
        assert [s for s, _ in answers] == [200] * 10, answers


def test_a_body_not_sent_as_json_gets_415(app):
    url, _ = app
    req = urllib.request.Request(
        f"{url}/recommend", data=b'{"history": [1]}', method="POST", headers={"content-type": "text/plain"}
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 415 and "Content-Type: application/json" in json.loads(e.value.read())["detail"]
