"""results_diff: two result folders compared by configuration and quality columns (the refactor check
behind `make demo` before and after)."""

import dataclasses

from test_report import ENV

from genrec.platform.tracking import write_result_row
from genrec.studies.common import results_diff
from genrec.workloads.results import ResultRow


def row(decoder, width, recall, latency, model="/a/runs/models/demo-small", run_id=None):
    return ResultRow(
        decoder=decoder,
        decoder_params={"beam_width": width, "k": 10},
        dataset="/x/runs/data/demo",
        model=model,
        split="test",
        env=dataclasses.replace(ENV),
        quality={"recall@10": recall, "invalid_rate": 0.0},
        latency_ms={"p50": latency},
        counters={"model_calls": 3},
        experiment="demo",
        run_id=run_id or f"{decoder}{width}",
    )


def write(folder, rows):
    for r in rows:
        write_result_row(folder, r)
    return str(folder)


def test_same_configurations_and_quality_are_identical_whatever_the_latency_and_paths(tmp_path, capsys):
    before = write(tmp_path / "b", [row("beam", 10, 0.25, 5.0), row("xgr", 10, 0.25, 4.0)])
    moved = "/elsewhere/clone/runs/models/demo-small"
    after = write(
        tmp_path / "a", [row("beam", 10, 0.25, 9.0, moved, "r1"), row("xgr", 10, 0.25, 1.0, moved, "r2")]
    )
    assert results_diff.main([before, after, "--experiment", "demo"]) == 0
    assert "identical" in capsys.readouterr().out


def test_a_changed_quality_value_or_a_missing_configuration_is_named(tmp_path, capsys):
    before = write(tmp_path / "b", [row("beam", 10, 0.25, 5.0), row("beam", 20, 0.26, 5.0)])
    after = write(tmp_path / "a", [row("beam", 10, 0.2501, 5.0)])
    assert results_diff.main([before, after]) == 1
    out = capsys.readouterr().out
    assert "recall@10 0.25 -> 0.2501" in out
    assert "only before" in out and '"beam_width": 20' in out


def test_a_parameter_only_one_version_records_is_named_not_a_new_configuration(tmp_path, capsys):
    before = write(tmp_path / "b", [row("beam", 10, 0.25, 5.0)])
    newer = row("beam", 10, 0.25, 5.0)
    newer.decoder_params = {**newer.decoder_params, "level_softmax": False}
    after = write(tmp_path / "a", [newer])
    assert results_diff.main([before, after]) == 0
    assert "parameter level_softmax only after (values False)" in capsys.readouterr().out
