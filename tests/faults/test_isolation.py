"""One request never fails another: a fault while decoding one request group is that group's answer,
and what the device cannot run is refused before it is queued (no Ray: the replica's batch decoder and
request parser run in-process, as `@serve.batch` and POST /recommend call them)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

pytest.importorskip("pydantic")

from genrec.platform.actors import DecoderHost, HostConfig  # noqa: E402
from genrec.platform.params import parse_decoder_params  # noqa: E402
from genrec.platform.serve.batch_decoder import BatchDecoder, GroupFailure  # noqa: E402
from genrec.platform.serve.requests import Limits, RecommendJob, RequestError, parse_recommend  # noqa: E402


@pytest.fixture(scope="module")
def host(tiny_model_dir, synth_dir):
    return DecoderHost(
        HostConfig(
            model=str(tiny_model_dir),
            data=str(synth_dir),
            device="cpu",
            decoders=("beam",),
            defaults={"beam": {"beam_width": 8, "k": 5}},
            warmup_batches=0,
        )
    )


def host_limits(host: DecoderHost) -> Limits:
    return Limits(
        num_items=host.num_items,
        max_history=host.max_history,
        max_k=100,
        history_policy="truncate",
        decoders=("beam",),
        default_decoder="beam",
        defaults=dict(host.defaults),
        constraint_sets={},
        levels=host.context.codec.levels,
        device=str(host.context.device),
    )


def test_one_poison_request_among_50_good_ones_fails_alone(host, monkeypatch):
    """The poison group raises a plain RuntimeError (as Triton does on a machine with no GPU driver):
    it gets a 500 naming the error, and all 50 good requests of the same batch are answered."""
    base = host.defaults["beam"]
    poison = replace(base, attention="triton")  # built directly: this checks the batch, not admission
    real_decode = host.decode

    def decode(histories, decoder=None, params=None):
        if getattr(params, "attention", "") == "triton":
            raise RuntimeError("0 active drivers ([]). There should only be one.")
        return real_decode(histories, decoder, params)

    monkeypatch.setattr(host, "decode", decode)
    now = time.perf_counter()
    jobs = [RecommendJob(tuple(h), "beam", base) for h in host.sample_histories(50, seed=1)]
    jobs.insert(25, RecommendJob(jobs[0].history, "beam", poison))
    answers = BatchDecoder(host, host_limits(host)).decode([(j, now, now + 60) for j in jobs], now)
    failed = answers.pop(25)
    assert isinstance(failed, GroupFailure) and failed.status == 500
    assert "RuntimeError" in failed.message and "0 active drivers" in failed.message
    assert all(isinstance(a, dict) and a["items"] for a in answers), answers


def test_a_fault_on_one_history_fails_only_that_request(host, monkeypatch):
    """Requests of one group decode in one call; when that call fails, each is retried alone, so a
    history that trips a fault fails only its own request."""
    base = host.defaults["beam"]
    histories = host.sample_histories(6, seed=2)
    poison_history = list(histories[3])
    real_decode = host.decode

    def decode(batch, decoder=None, params=None):
        if poison_history in [list(h) for h in batch]:
            raise IndexError("index 7 is out of bounds for dimension 0 with size 7")
        return real_decode(batch, decoder, params)

    monkeypatch.setattr(host, "decode", decode)
    now = time.perf_counter()
    jobs = [(RecommendJob(tuple(h), "beam", base), now, now + 60) for h in histories]
    answers = BatchDecoder(host, host_limits(host)).decode(jobs, now)
    assert isinstance(answers[3], GroupFailure) and "IndexError" in answers[3].message
    assert all(isinstance(a, dict) for i, a in enumerate(answers) if i != 3)


@pytest.mark.parametrize(
    "params, words",
    [
        ({"attention": "triton"}, ["attention", "triton", "cpu", "torch"]),
    ],
)
def test_what_the_device_cannot_run_is_refused_before_it_is_queued(host, params, words):
    body = {"history": list(host.sample_histories(1)[0]), "k": 5, "params": params}
    import json

    with pytest.raises(RequestError) as e:
        parse_recommend(json.dumps(body).encode(), host_limits(host))
    assert e.value.status == 422
    assert all(w in e.value.message for w in words), e.value.message


def test_cli_and_yaml_refuse_a_triton_backend_on_the_cpu_in_one_line():
    from genrec.platform.capabilities import check_capabilities
    from genrec.platform.params import ParamError

    params = parse_decoder_params("beam", {"attention": "triton"})
    with pytest.raises(ParamError) as e:
        check_capabilities(params, "cpu")
    assert "\n" not in str(e.value) and "attention" in str(e.value) and e.value.param == "attention"


def test_eval_with_a_triton_backend_on_the_cpu_exits_2_in_one_line(tiny_model_dir, synth_dir, capsys):
    from conftest import run_cli

    argv = ["eval", "--model", str(tiny_model_dir), "--data", str(synth_dir), "--device", "cpu"]
    assert run_cli([*argv, "--param", "attention=triton", "--max-users", "4", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "attention" in err and "Traceback" not in err, err


def test_a_sweep_with_a_triton_backend_on_the_cpu_is_refused_before_ray_starts(
    tiny_model_dir, synth_dir, tmp_path
):
    from experiment_files import cpu_sweep

    from genrec.platform.experiment_loading import experiment_from_dict
    from genrec.platform.sweep import preflight
    from genrec.workloads.errors import UserInputError

    raw = cpu_sweep("caps", synth_dir, tiny_model_dir, tmp_path, k=5, widths=[5, 8])
    raw["search_space"]["attention"] = {"grid": ["torch", "triton"]}
    raw["eval"] = {"device": "cpu", "ks": [5]}
    raw["metric"] = "hr@5"
    with pytest.raises(UserInputError) as e:
        preflight(experiment_from_dict(raw, base_dir=tmp_path))
    assert "search_space.attention.grid[1]" in str(e.value) and "torch" in str(e.value)
