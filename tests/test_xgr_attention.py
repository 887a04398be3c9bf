"""The xGR attention benchmark on tiny sizes (Triton interpreter on CPU): the kernel agrees with SDPA
over the per-beam-copied cache on the benchmark's own inputs, every arm is timed, the ratios are the
ratios of the medians, a dtype the kernel cannot build for is recorded rather than fatal."""

from __future__ import annotations

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

pytest.importorskip("triton", reason="triton is not installed (pip install triton; CPU uses the interpreter)")

from genrec.studies.xgr import xgr_attention  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TINY = [
    "--device", DEVICE, "--users", "1", "2", "--beams", "3", "8", "--heads", "2", "--head-dim", "16",
    "--prompt", "5", "--steps", "2", "--repeats", "2", "--warmup", "1", "--inner", "1",
]  # fmt: skip


def test_rows_agree_with_sdpa_and_time_every_arm(tmp_path):
    out = tmp_path / "xa.json"
    result = xgr_attention.main([*TINY, "--dtypes", "float32", "--out", str(out)])
    rows = result["rows"]
    assert [(r["users"], r["beams"]) for r in rows] == [(1, 3), (1, 8), (2, 3), (2, 8)]
    for row in rows:
        assert row["triton_max_abs_err"] < 1e-5  # same attention as SDPA over the copied cache
        for arm in ("triton", "torch_staged", "sdpa_copied"):
            assert 0 < row[f"{arm}_us"] <= row[f"{arm}_us_p90"]
        assert row["sdpa_over_triton"] == pytest.approx(row["sdpa_copied_us"] / row["triton_us"])
    assert json.loads(out.read_text())["rows"] == rows


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's missing bf16 is a CPU-only failure")
def test_a_dtype_the_kernel_cannot_build_is_recorded_and_the_run_goes_on():
    rows = xgr_attention.main([*TINY, "--beams", "3", "--dtypes", "bfloat16", "float32"])["rows"]
    assert [("error" in r) for r in rows] == [True, True, False, False]
    assert "bf16" in rows[0]["error"]


@pytest.mark.parametrize("bad", [["--beams", "0"], ["--steps", "-1"], ["--dtypes", "int8"]])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(SystemExit):
        xgr_attention.parse_args([*TINY, *bad])


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the capture succeeds")
def test_a_graph_that_cannot_be_captured_costs_its_graph_arm_only():
    """Capture needs CUDA: on the CPU every capture fails, and each failure is returned, not raised."""
    graphs, errors = xgr_attention.graph_calls({"sdpa_copied": lambda: None}, torch.device("cpu"))
    assert graphs == {} and set(errors) == {"sdpa_copied_graph"}
