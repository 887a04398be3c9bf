"""MaRI benchmarks on toy sizes: the MatMul, fragmented-layout and whole-model points, the two CLIs, and
the report sections. Timings are replaced by fixed ones where a test checks the arithmetic on them."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from genrec.studies.mari import mari_matmul, mari_model  # noqa: E402
from genrec.workloads.ranking.flops import matmul_flops_mari, matmul_flops_vanilla  # noqa: E402
from genrec.workloads.ranking.layout import fragmented_layout  # noqa: E402

TOY_MODEL = {"d_user": 16, "d_item": 8, "d_cross": 4, "d_hidden": 8, "experts": 2, "tasks": 2, "seq_len": 5}


def fixed_times(fns: dict, reps: int, warmup: int, device: torch.device) -> dict[str, list[float]]:
    """Stands in for interleaved_times: calls each fn once, then gives the i-th method 1 + i ms per rep,
    plus a per-rep wobble so the ratios have a spread."""
    for fn in fns.values():
        fn()
    return {name: [1.0 + i + 0.1 * (rep % 2) for rep in range(reps)] for i, name in enumerate(fns)}


@pytest.fixture
def fixed_timing(monkeypatch):
    monkeypatch.setattr(mari_matmul, "interleaved_times", fixed_times)
    monkeypatch.setattr(mari_model, "interleaved_times", fixed_times)


def test_matmul_point_matches_vanilla_and_counts_flops():
    r = mari_matmul.matmul_point(6, 10, 4, 3, 5, reps=3, warmup=1, threads=1, with_concat=True)
    assert r["max_abs_diff"] < 1e-4 and r["max_rel_diff"] < 1e-5
    assert r["flops_vanilla"] == matmul_flops_vanilla(6, 10, 4, 3, 5) == 2 * 6 * 5 * 17
    assert r["flops_mari"] == matmul_flops_mari(6, 10, 4, 3, 5)
    assert r["flops_speedup"] == pytest.approx(r["flops_vanilla"] / r["flops_mari"])
    assert min(r["time_vanilla_ms"], r["time_mari_ms"], r["time_concat_ms"]) > 0 and r["reps"] == 3
    assert (r["b"], r["d_user"], r["d_item"], r["d_cross"], r["d_hidden"]) == (6, 10, 4, 3, 5)
    assert "time_concat_ms" not in mari_matmul.matmul_point(2, 3, 2, 0, 2, reps=1, warmup=0, threads=1)


def test_matmul_point_speedups_are_ratios_of_medians(fixed_timing):
    r = mari_matmul.matmul_point(4, 8, 4, 0, 4, reps=4, warmup=0, threads=1, with_concat=True)
    vanilla, mari, concat = ([1.0 + i + 0.1 * (rep % 2) for rep in range(4)] for i in range(3))
    assert r["time_vanilla_ms"] == statistics.median(vanilla) and r["time_mari_ms"] == statistics.median(mari)
    assert r["time_speedup"] == statistics.median(vanilla) / statistics.median(mari)
    assert r["time_speedup_std"] == statistics.stdev([a / b for a, b in zip(vanilla, mari)])
    assert r["time_concat_ms"] == statistics.median(concat)
    assert r["time_speedup_vs_concat"] == statistics.median(concat) / statistics.median(mari)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"b": 0}, "b must be >= 1, got 0"), ({"d_cross": -1}, "d_cross must be >= 0"), ({"reps": 0}, "reps")],
)
def test_matmul_point_rejects_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mari_matmul.matmul_point(**kwargs, threads=1)


def test_fragmented_point_agrees_with_vanilla_and_counts_chunks(fixed_timing):
    r = mari_matmul.fragmented_point(
        50, b=4, d_user=120, d_item=70, d_cross=30, d_hidden=8, reps=3, threads=1
    )
    assert r["chunks"] == len(fragmented_layout(120, 70, 30, 50).chunks) == 6
    assert r["max_abs_diff"] < 1e-4 and r["reps"] == 3 and r["chunk"] == 50
    # fixed timings (medians of 3 reps): vanilla 1 ms, neat 2 ms, fragmented 3 ms
    assert (r["time_vanilla_ms"], r["time_mari_neat_ms"], r["time_mari_fragmented_ms"]) == (1.0, 2.0, 3.0)
    assert r["fragmented_over_neat"] == 1.5 and r["fragmented_over_vanilla"] == 3.0
    assert r["degradation_vs_neat_pct"] == 50.0 and r["degradation_vs_vanilla_pct"] == 200.0
    assert r["neat_speedup_vs_vanilla"] == 0.5 and r["fragmented_over_neat_std"] > 0
    with pytest.raises(ValueError, match="chunk, b and reps must be >= 1"):
        mari_matmul.fragmented_point(0, threads=1)


def test_model_point_scores_agree_across_modes(fixed_timing):
    r = mari_model.model_point(6, **TOY_MODEL, train_steps=2, reps=3, threads=1)
    assert r["max_abs_diff_uoi"] < 1e-4 and r["max_abs_diff_mari"] < 1e-4
    assert r["flops_mari"] < r["flops_uoi"] < r["flops_vani"]
    assert (r["time_vani_ms"], r["time_uoi_ms"], r["time_mari_ms"]) == (1.0, 2.0, 3.0)
    assert r["speedup_uoi_vs_vani"] == 0.5 and r["speedup_mari_vs_uoi"] == 2.0 / 3.0
    assert r["speedup_mari_vs_vani"] == 1.0 / 3.0
    assert r["cuda_graph"] is False and r["max_abs_diff_graph_vs_eager"] == 0.0
    assert 0.0 <= r["valid_auc_mean"] <= 1.0 and r["eligible_nodes"] > 0
    assert {k: r[k] for k in TOY_MODEL} == TOY_MODEL and (r["b"], r["train_steps"], r["reps"]) == (6, 2, 3)
    with pytest.raises(ValueError, match="train_steps >= 0"):
        mari_model.model_point(train_steps=-1, threads=1)


def test_matmul_cli_prints_a_line_per_point_and_writes_every_table(
    fixed_timing, monkeypatch, tmp_path, capsys
):
    monkeypatch.setattr(mari_matmul, "PAPER_TABLE2", {"b": {4: (2.94, 0.97)}, "d_hidden": {4: (4.99, 1.1)}})
    monkeypatch.setattr(
        mari_matmul,
        "TABLE2_FIXED",
        {
            "b": {"d_user": 8, "d_item": 4, "d_cross": 2, "d_hidden": 4},
            "d_hidden": {"b": 5, "d_user": 8, "d_item": 4},
        },
    )
    out = tmp_path / "mm.json"
    toy = ["--bs", "4", "8", "--d-users", "8", "--d-items", "4", "--d-hiddens", "4", "--chunks", "400", "77"]
    argv = [*toy, "--frag-b", "3", "--reps", "2", "--threads", "1", "--device", "cpu", "--out", str(out)]
    assert mari_matmul.main(["--table2", "--grid", "--table3", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "       b=    4: flops x1.75 (paper 2.94)  time x0.51+-0.02 (paper 0.97)  "
        "vanilla 1.05 ms mari 2.05 ms"
    )
    assert lines[1].startswith("d_hidden=    4: flops x2.14 (paper 4.99)")
    assert lines[2:4] == [
        "B=4 Du=8 Di=4 Dc=0 d=4: flops x2.00 time x0.51",
        "B=8 Du=8 Di=4 Dc=0 d=4: flops x2.40 time x0.51",
    ]
    assert lines[4] == (
        "chunk  400 (13 chunks): fragmented/neat x1.49 (+49%, paper +19.5%), vs vanilla +190% (paper 3.1%)"
    )
    assert lines[5].endswith("paper +nan%), vs vanilla +190% (paper nan%)") and lines[6] == f"-> {out}"
    result = json.loads(out.read_text())
    assert [r["setting"] for r in result["table2"]] == ["b", "d_hidden"] and len(result["grid"]) == 2
    assert result["table2"][0]["paper_time_speedup"] == 0.97 and "time_concat_ms" not in result["grid"][0]
    assert result["table3"][0]["paper_degradation_vs_neat_pct"] == 19.5
    assert "paper_degradation_vs_neat_pct" not in result["table3"][1]
    assert result["benchmark"] == "mari_matmul" and {"env", "loadavg_start", "loadavg_end"} <= set(result)


def test_model_cli_prints_a_line_per_b(fixed_timing, monkeypatch, tmp_path, capsys):
    small = {"d_seq": 8, "d_attn": 8, "d_user_emb": 8, "d_tower": 8}
    monkeypatch.setattr(mari_model, "BENCH_CONFIG", replace(mari_model.BENCH_CONFIG, **TOY_MODEL, **small))
    out = tmp_path / "model.json"
    argv = ["--bs", "3", "5", "--train-steps", "1", "--reps", "2", "--threads", "1", "--device", "cpu"]
    assert mari_model.main([*argv, "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[2] == f"-> {out}"
    assert lines[0].startswith(
        "B=    3: VanI 1.05 ms  UOI 2.05 ms  MaRI 3.05 ms  (UOI/VanI x0.51, MaRI vs UOI x0.67"
    )
    result = json.loads(out.read_text())
    assert [p["b"] for p in result["points"]] == [3, 5] and result["benchmark"] == "mari_model"
    assert result["config"]["d_user"] == 16 and {"env", "loadavg_start", "loadavg_end"} <= set(result)


# ------------------------------------------------------------------------------------------ report


def matmul_rows() -> pd.DataFrame:
    rows = [
        {"param_b": b, "param_d_user": du, "param_d_item": di, "param_d_hidden": 8, "param_d_cross": 0}
        | {"time_speedup": b * du / 100, "flops_speedup": 2.0, "time_vanilla_ms": 1.0, "time_mari_ms": 0.5}
        for di in (16, 32)
        for b in (4, 64)
        for du in (8, 64)
    ]
    return pd.DataFrame(rows + rows[:1])  # a repeated point is averaged


def test_matmul_sections_heatmaps_lines_and_table():
    pytest.importorskip("plotly")
    from genrec.studies.mari.report import fragmented_sections, matmul_sections, model_sections

    figures: list = []
    sections = matmul_sections(matmul_rows(), lambda fig: figures.append(fig) or "<fig>")
    assert [s[0] for s in sections] == ["mari-heatmaps", "mari-lines", "mari-table"]
    assert sections[0][2].count("<fig>") == 2 and "Paper (GPU): time 0.97-1.61x" in sections[0][2]
    lines = figures[2]
    assert [t.name for t in lines.data][:2] == [
        "D_user=8 D_item=16 D_hidden=8 D_cross=0",
        "D_user=8 D_item=32 D_hidden=8 D_cross=0",
    ]
    assert {t.line.dash for t in lines.data} == {"solid", "dash"} and len(lines.data) == 4
    table = sections[2][2]
    assert table.startswith("<details><summary>8 points</summary><table>")
    assert "<tr><td>4</td><td>8</td><td>16</td><td>0</td><td>8</td><td>2.00</td><td>0.32</td>" in table

    frag = pd.DataFrame({"param_chunk": [50, 100], "degradation_vs_neat_pct": [40.0, -2.0]})
    frag = frag.assign(degradation_vs_vanilla_pct=5.0, time_mari_neat_ms=1.0, time_mari_fragmented_ms=1.4)
    (section,) = fragmented_sections(frag.assign(time_vanilla_ms=2.0), lambda fig: "<fig>")
    assert section[0] == "mari-fragmented" and "<fig>" in section[2]
    assert (
        "<tr><td>100</td><td>2.00</td><td>1.00</td><td>1.40</td><td>-2.0%</td><td>+5.0%</td></tr>"
        in section[2]
    )

    model = pd.DataFrame({"param_b": [4], "time_vani_ms": [3.0], "time_uoi_ms": [2.0], "time_mari_ms": [1.0]})
    model = model.assign(speedup_uoi_vs_vani=1.5, speedup_mari_vs_uoi=2.0, speedup_mari_vs_vani=3.0)
    (section,) = model_sections(model.assign(max_abs_diff_mari=2e-7), lambda fig: "<fig>")
    cells = "".join(f"<td>{v}</td>" for v in ("4", "3.00", "2.00", "1.00", "1.50", "2.00", "3.00", "2.0e-07"))
    assert section[0] == "mari-model" and cells in section[2]
