"""POST /rank: the pure request parser (every bad case and its status), then the Serve app started once
on local Ray with a tiny ranking checkpoint: scores equal RankingScorer run here in every mode, bad
requests get 4xx naming the field, /health describes the ranking model."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from dataclasses import asdict

import pytest
import torch

pytest.importorskip("ray.serve")

from genrec.platform.serve.config import ServeConfig  # noqa: E402
from genrec.platform.serve.ranking import NO_RANKING_MODEL, RankLimits, parse_rank  # noqa: E402
from genrec.platform.serve.requests import RequestError  # noqa: E402
from genrec.workloads.ranking.checkpoint import load_ranking, save_ranking  # noqa: E402
from genrec.workloads.ranking.model import RankingConfig, init_model  # noqa: E402
from genrec.workloads.ranking.modes import MODES, RankingScorer, check_inputs  # noqa: E402

CFG = RankingConfig(
    d_user=12, d_seq=5, seq_len=4, d_item=7, d_cross=3, d_attn=6, d_hidden=10, d_user_emb=4, d_tower=8,
    experts=2, tasks=2,
)  # fmt: skip
MAX_CANDIDATES = 16


def body_for(cfg: RankingConfig, b: int, seed: int = 0, mode: str | None = None) -> dict:
    g = torch.Generator().manual_seed(seed)
    body = {
        "user": {
            "profile": torch.randn(cfg.d_user, generator=g).tolist(),
            "seq": torch.randn(cfg.seq_len, cfg.d_seq, generator=g).tolist(),
        },
        "items": torch.randn(b, cfg.d_item, generator=g).tolist(),
        "cross": torch.randn(b, cfg.d_cross, generator=g).tolist(),
    }
    if mode is not None:
        body["mode"] = mode
    return body


def with_(body: dict, path: str, value) -> dict:
    """A deep copy of `body` with `path` (dots) set to `value`, or removed when value is ..."""
    out = json.loads(json.dumps(body))
    *parents, last = path.split(".")
    node = out
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if value is ...:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return out


GOOD = body_for(CFG, 3)
BAD_REQUESTS = [
    (b"{not json", 400, "not valid JSON"),
    (b"", 400, "empty request body"),
    (b"[1, 2]", 400, "must be a JSON object"),
    (with_(GOOD, "items", ...), 422, "`items` is required"),
    (with_(GOOD, "user.seq", ...), 422, "`user.seq` is required"),
    (with_(GOOD, "colour", "red"), 422, "unknown field `colour`"),
    (with_(GOOD, "user.age", 3), 422, "unknown field `user.age`; fields are ['profile', 'seq']"),
    (with_(GOOD, "user", [1, 2]), 422, "`user`: Input should be"),
    (with_(GOOD, "items.0.1", "a"), 422, "`items.0.1`: Input should be a valid number"),
    (with_(GOOD, "user.profile.0", True), 422, "`user.profile.0`: Input should be a valid number"),
    (with_(GOOD, "cross", 5), 422, "`cross`: Input should be a valid list"),
    (with_(GOOD, "mode", "fast"), 422, "`mode`: 'fast' is not a ranking mode; choose one of"),
    (with_(GOOD, "mode", 3), 422, "`mode`: Input should be a valid string"),
    (with_(GOOD, "user.profile", [0.5] * 11), 422, "user profile: expected shape [12]"),
    (with_(GOOD, "user.seq", [[0.5] * 5] * 3), 422, "user seq: expected shape [4, 5]"),
    (with_(GOOD, "items", [[0.5] * 6] * 3), 422, "item features: expected [B, 7]"),
    (with_(GOOD, "cross", [[0.5] * 3] * 2), 422, "cross features: expected [3, 3] (one row per candidate)"),
    (with_(GOOD, "items", [[0.5] * 7, [0.5] * 6, [0.5] * 7]), 422, "`items`: rows have different lengths"),
    (with_(GOOD, "items", []), 422, "`items` is empty"),
    (json.dumps(with_(GOOD, "user.profile.0", float("nan"))).encode(), 422, "user profile: contains NaN"),
    (body_for(CFG, MAX_CANDIDATES + 1), 413, f"at most {MAX_CANDIDATES} per request"),
]


def encode(body) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


@pytest.fixture(scope="module")
def ranking_dir(tmp_path_factory):
    return save_ranking(tmp_path_factory.mktemp("ranking") / "tiny-rank", init_model(CFG, seed=5))


# ---- the parser, no server -----------------------------------------------------------------------


def test_parse_rank_accepts_a_good_request_and_defaults_to_mari():
    model = init_model(CFG)
    limits = RankLimits.for_config(CFG, MAX_CANDIDATES)
    job = parse_rank(encode(GOOD), limits, lambda u, i, c: check_inputs(model, u, i, c))
    assert job.mode == "mari" and job.candidates == 3
    assert job.profile.shape == (1, 12) and job.seq.shape == (1, 4, 5) and job.items.shape == (3, 7)
    ints = with_(with_(GOOD, "user.profile", list(range(12))), "mode", "vani")  # integers are numbers too
    assert parse_rank(encode(ints), limits, lambda u, i, c: check_inputs(model, u, i, c)).mode == "vani"


@pytest.mark.parametrize("body, status, words", BAD_REQUESTS)
def test_parse_rank_rejects_bad_requests(body, status, words):
    model = init_model(CFG)
    limits = RankLimits.for_config(CFG, MAX_CANDIDATES)
    with pytest.raises(RequestError) as e:
        parse_rank(encode(body), limits, lambda u, i, c: check_inputs(model, u, i, c))
    assert e.value.status == status and words in e.value.message, e.value.message


def test_parse_rank_bounds_the_body_and_the_error_list():
    model = init_model(CFG)
    check = lambda u, i, c: check_inputs(model, u, i, c)  # noqa: E731
    with pytest.raises(RequestError) as e:
        parse_rank(encode(GOOD), RankLimits(max_candidates=MAX_CANDIDATES, max_body_bytes=100), check)
    assert e.value.status == 413 and "the limit is 100" in e.value.message
    many_bad = with_(GOOD, "items", [["x"] * 7] * 3)
    with pytest.raises(RequestError) as e:
        parse_rank(encode(many_bad), RankLimits.for_config(CFG, MAX_CANDIDATES), check)
    assert e.value.status == 422 and "and 16 more" in e.value.message


def test_rank_without_a_ranking_model_is_404():
    """The endpoint itself, called on a bare replica object (no Ray): no ranking model -> 404."""
    from genrec.platform.serve.app import Recommender

    # the class as written (Serve's ingress wrapper around it has an async __del__)
    cls = next(c for c in Recommender.func_or_class.__mro__ if "rank" in vars(c))
    replica = object.__new__(cls)
    replica.ranking = None
    answer = asyncio.run(cls.rank(replica, None))
    assert answer.status_code == 404
    assert json.loads(answer.body) == {"detail": NO_RANKING_MODEL}


# ---- the app -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app(ray_session, tiny_model_dir, synth_dir, ranking_dir):
    from genrec.platform.serve.server import HttpSettings, start_server, stop_server

    cfg = ServeConfig(
        model=tiny_model_dir,
        data=synth_dir,
        decoders=["beam"],
        defaults={"beam": {"beam_width": 4, "k": 2}},
        num_cpus=0.5,
        threads=1,
        ranking=ranking_dir,
        ranking_max_candidates=MAX_CANDIDATES,
        warmup_batches=0,
    )
    url = start_server(cfg, HttpSettings(port=free_port()))
    yield url
    stop_server()


def post(url: str, body) -> tuple[int, dict]:
    headers = {"content-type": "application/json"}
    req = urllib.request.Request(f"{url}/rank", data=encode(body), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, (json.loads(raw) if raw else {})


def test_rank_matches_the_scorer_run_directly(app, ranking_dir):
    scorer = RankingScorer(load_ranking(ranking_dir))
    for b, seed in ((1, 0), (5, 1), (MAX_CANDIDATES, 2)):
        body = body_for(CFG, b, seed)
        user = {k: torch.tensor(v) for k, v in body["user"].items()}
        items, cross = torch.tensor(body["items"]), torch.tensor(body["cross"])
        got = {}
        for mode in (*MODES, None):
            status, answer = post(app, with_(body, "mode", mode) if mode else body)
            assert status == 200, answer
            mode = mode or "mari"
            assert answer["mode"] == mode and answer["tasks"] == CFG.tasks and answer["candidates"] == b
            assert answer["timings_ms"]["server"] >= answer["timings_ms"]["score"] > 0
            got[mode] = torch.tensor(answer["scores"])
            assert got[mode].shape == (b, CFG.tasks)
            torch.testing.assert_close(got[mode], scorer.score(user, items, cross, mode), rtol=0, atol=1e-5)
        for mode in ("uoi", "mari"):
            torch.testing.assert_close(got[mode], got["vani"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("body, status, words", BAD_REQUESTS)
def test_bad_rank_requests_name_the_field(app, body, status, words):
    got, answer = post(app, body)
    assert got == status, answer
    assert words in answer["detail"]


def test_health_describes_the_ranking_model(app, ranking_dir):
    with urllib.request.urlopen(f"{app}/health", timeout=30) as r:
        health = json.loads(r.read())
    ranking = health["ranking"]
    assert ranking["path"] == str(ranking_dir.resolve())
    assert ranking["config"] == asdict(CFG)
    assert ranking["modes"] == list(MODES) and ranking["max_candidates"] == MAX_CANDIDATES
    assert ranking["mari_rewritten"]  # the MaRI graph was built at start
    assert health["decoders"] == ["beam"]  # /recommend is served as before
