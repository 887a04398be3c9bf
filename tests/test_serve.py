"""The Serve app, started once on local Ray with fractional CPUs: endpoints, bad requests and their
status codes, overload (503 + Retry-After, nothing lost), timeouts, live reconfiguration, and the
batched answers against the decoder run directly (the reference)."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from dataclasses import asdict

import pytest

pytest.importorskip("ray.serve")
aiohttp = pytest.importorskip("aiohttp")

from genrec.platform.actors import DecoderHost, HostConfig  # noqa: E402
from genrec.platform.params import parse_decoder_params  # noqa: E402
from genrec.platform.serve.config import ServeConfig  # noqa: E402
from genrec.platform.serve.ingress import resolve_ingress  # noqa: E402
from genrec.platform.serve.server import reconfigure, start_server, stop_server  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app(ray_session, tiny_model_dir, synth_dir):
    from genrec.platform.serve.server import HttpSettings

    cfg = ServeConfig(
        model=tiny_model_dir,
        data=synth_dir,
        decoders=["beam", "static"],
        defaults={"beam": {"beam_width": 8, "k": 5}, "static": {"beam_width": 8, "k": 5}},
        constraint_sets={
            "all": {"rule": "all"},
            "cold_start": {"rule": "cold_start"},
            "few": {"rule": "random", "size": 20, "seed": 1},
        },
        num_cpus=0.5,
        threads=1,
        max_queued_requests=4,
        max_ongoing_requests=2,
        batching={"max_batch_size": 2, "batch_wait_timeout_s": 0.002},
        warmup_batches=1,
    )
    url = start_server(cfg, HttpSettings(port=free_port()))
    yield url, cfg
    stop_server()


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def post(url: str, body) -> tuple[int, dict, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"{url}/recommend", data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, (json.loads(raw) if raw else {}), dict(e.headers)


def test_health_decoders_and_constraint_sets(app, synth_dir):
    url, cfg = app
    health = get(f"{url}/health")
    assert health["status"] == "ok"
    assert health["dataset"] == str(synth_dir.resolve())
    assert health["decoders"] == ["beam", "static"]
    assert health["max_batch_size"] == 2
    # the test Ray (conftest) starts with the default ingress: HAProxy in front when it is installed
    assert health["ingress"] == resolve_ingress("auto")
    decoders = get(f"{url}/decoders")
    assert decoders["default"] == "beam"
    assert decoders["decoders"]["beam"]["defaults"] == asdict(
        parse_decoder_params("beam", {"beam_width": 8, "k": 5})
    )
    assert decoders["decoders"]["static"]["parameters"]["constraint"] == {"type": "str", "default": "all"}
    sets = get(f"{url}/constraint-sets")
    assert sets["decoders"] == ["beam", "static"]  # every served decoder that takes a constraint
    by_name = {s["name"]: s for s in sets["sets"]}
    assert set(by_name) == {"all", "cold_start", "few"}
    assert by_name["few"]["available"] and by_name["few"]["size"] == 20


def test_recommend_matches_the_decoder_run_directly(app, tiny_model_dir, synth_dir):
    url, _ = app
    host = DecoderHost(
        HostConfig(
            model=str(tiny_model_dir),
            data=str(synth_dir),
            decoders=("beam",),
            defaults={"beam": {"beam_width": 8, "k": 5}},  # the app's: k is never narrowed silently
            warmup_batches=0,
        )
    )
    for history in host.sample_histories(4, seed=3):
        status, body, _ = post(url, {"history": history, "k": 5})
        assert status == 200, body
        ref = host.decode([history], "beam", {"k": 5}).items[0]
        want = [(i, s) for i, s, ok in zip(ref.item_ids, ref.scores, ref.valid) if ok]
        got = [(it["item_id"], it["score"]) for it in body["items"]]
        assert [i for i, _ in got] == [i for i, _ in want]
        assert all(abs(a - b) < 1e-4 for (_, a), (_, b) in zip(got, want))
        assert body["decoder"] == "beam" and body["k"] == 5
        t = body["timings_ms"]
        # the whole decoder call holds its phases (the load generator's overhead subtracts the call)
        assert t["prefill"] > 0 and t["decode"] > 0
        assert t["decoder_call"] >= t["prefill"] + t["decode"] and t["server"] >= t["decoder_call"]
        assert 1 <= body["batch_size"] <= 2


@pytest.mark.parametrize("decoder", ["beam", "static"])
def test_constraint_restricts_items_for_any_beam_decoder(app, synth_dir, decoder):
    url, _ = app
    from genrec.workloads.data.dataset import load_dataset

    ds = load_dataset(synth_dir)
    cold = set(map(int, (ds.item_popularity("train") == 0).nonzero()[0]))
    status, body, _ = post(
        url, {"history": [1, 2, 3], "k": 5, "decoder": decoder, "constraint": "cold_start"}
    )
    assert status == 200, body
    assert body["decoder"] == decoder and body["items"]
    assert body["params"]["constraint"] == "cold_start"
    assert {it["item_id"] for it in body["items"]} <= cold


@pytest.mark.parametrize(
    "body, status, words",
    [
        (b"{not json", 400, "not valid JSON"),
        (b"", 400, "empty request body"),
        (b"[1, 2]", 400, "JSON object"),
        ({"k": 5}, 422, "`history` is required"),
        ({"history": [], "k": 5}, 422, "`history` is empty"),
        ({"history": [1, 10_000], "k": 5}, 422, "unknown item ids [10000]"),
        ({"history": [1, -1], "k": 5}, 422, "unknown item ids [-1]"),
        ({"history": ["a"], "k": 5}, 422, "`history.0`"),
        ({"history": [1], "k": 9}, 422, "larger than the beam width (8)"),
        ({"history": [1], "k": 9, "beam_width": 4}, 422, "larger than the beam width (4)"),
        ({"history": [1], "k": 0}, 422, "`k` must be >= 1, got 0"),
        (
            {"history": [1], "params": {"beam_width": "ten"}},
            422,
            "`beam_width` takes an int, got 'ten' (str)",
        ),
        ({"history": [1], "decoder": "nope"}, 422, "'nope' is not served"),
        ({"history": [1], "constraint": "nope"}, 422, "'nope' is not a constraint rule"),
        ({"history": [1], "constraint_set": "all"}, 422, "renamed `constraint`"),
        ({"history": [1], "constraint": "random", "params": {"constraint_size": 7}}, 422, "not built"),
        ({"history": [1], "colour": "red"}, 422, "unknown field `colour`"),
    ],
)
def test_bad_requests_name_the_field(app, body, status, words):
    url, _ = app
    got, answer, _ = post(url, body)
    assert got == status, answer
    assert words in answer["detail"]


def test_over_long_history_is_truncated_and_says_so(app):
    url, _ = app
    window = get(f"{url}/health")["max_history"]
    status, body, _ = post(url, {"history": list(range(window + 7)), "k": 3})
    assert status == 200 and body["history_truncated"]
    assert f"last {window} items" in body["notes"][0]
    status, body, _ = post(url, {"history": list(range(window)), "k": 3})
    assert status == 200 and not body["history_truncated"]


async def _burst(url: str, n: int) -> list[tuple[int, dict]]:
    async with aiohttp.ClientSession() as session:

        async def one(i: int):
            async with session.post(f"{url}/recommend", json={"history": [i % 50, 7], "k": 5}) as r:
                return r.status, dict(r.headers)

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_burst_beyond_the_queue_is_rejected_and_nothing_is_lost(app):
    url, _ = app
    sent = 60  # queue bound 4 + ongoing 2 per replica: most of a simultaneous burst must be turned away
    results = asyncio.run(_burst(url, sent))
    answered = sum(s == 200 for s, _ in results)
    rejected = [h for s, h in results if s in (503, 429)]
    assert answered + len(rejected) == sent, sorted({s for s, _ in results})
    assert answered >= 1 and rejected
    assert all("retry-after" in {k.lower() for k in h} for h in rejected)


def test_live_reconfiguration_and_timeouts(app):
    url, cfg = app
    pid = get(f"{url}/health")["pid"]
    try:
        reconfigure(cfg, max_batch_size=8, batch_wait_timeout_s=0.001)
        health = get(f"{url}/health")
        assert health["max_batch_size"] == 8 and health["batch_wait_timeout_s"] == 0.001
        assert health["pid"] == pid  # the same replica: no restart, the model stayed loaded
        reconfigure(cfg, request_timeout_s=1e-6)
        status, body, _ = post(url, {"history": [1, 2], "k": 5})
        assert status == 504 and "request_timeout_s" in body["detail"]
    finally:
        reconfigure(cfg)
    status, _, _ = post(url, {"history": [1, 2], "k": 5})
    assert status == 200
    assert get(f"{url}/health")["max_batch_size"] == 2


def test_decoder_actor_answers_like_the_host(ray_session, tiny_model_dir, synth_dir):
    import ray

    from genrec.platform.actors import start_decoder_actor

    cfg = HostConfig(model=str(tiny_model_dir), data=str(synth_dir), threads=1, warmup_batches=1)
    host = DecoderHost(cfg)
    histories = host.sample_histories(3, seed=0)
    actor = start_decoder_actor(cfg, gpu=0)
    try:
        out = ray.get(actor.decode.remote(histories, "beam", {"beam_width": 6, "k": 3}))
        ref = host.decode(histories, "beam", {"beam_width": 6, "k": 3})
        assert [r.item_ids for r in out.items] == [r.item_ids for r in ref.items]
        assert out.batch_size == 3 and out.decode_ms > 0 and "prefill" in out.timings_ms
        assert ray.get(actor.describe.remote())["num_items"] == host.num_items
    finally:
        ray.kill(actor)


def test_slo_batching_policy_is_a_live_switch(app):
    """`batching.policy: slo` (xSchedule) in place of @serve.batch: answers as before, a request no
    batch can hold is a 422, one that cannot meet the SLO a 503 + Retry-After; then back to fixed."""
    url, cfg = app
    long_history = list(range(1, 60))  # truncated to the model's window: still 8 beams x 21+ x 3 tokens
    try:
        reconfigure(cfg, policy="slo", token_budget=400, slo_ms=5000.0, wait_quota_ms=5.0)
        assert get(f"{url}/health")["batching"]["policy"] == "slo"
        status, body, _ = post(url, {"history": [1, 2, 3], "k": 5})
        assert status == 200 and body["items"] and body["batch_size"] >= 1
        health = get(f"{url}/health")
        assert health["batching"]["batches"] >= 1 and health["batching"]["service_overhead_ms"] > 0
        assert health["batching"]["lateness_factor"] >= 1.0  # observed / predicted, from the answers
        status, body, _ = post(url, {"history": long_history, "k": 5})
        assert status == 422 and "batching.token_budget=400" in body["detail"]
        reconfigure(cfg, policy="slo", token_budget=400, slo_ms=1.0, wait_quota_ms=0.5)
        status, body, headers = post(url, {"history": [1, 2, 3], "k": 5})
        assert status == 503 and "SLO" in body["detail"]
        assert int({k.lower(): v for k, v in headers.items()}["retry-after"]) >= 1
        assert get(f"{url}/health")["slo_rejected"] >= 1
    finally:
        reconfigure(cfg)
    assert get(f"{url}/health")["batching"]["policy"] == "fixed"
    assert post(url, {"history": [1, 2, 3], "k": 5})[0] == 200
