"""Parquet result store: atomic one-file-per-row writes, idempotent by run id, schema checks."""

import pytest

from genrec.platform.tracking import list_experiments, read_results, write_result_row
from genrec.workloads.errors import UserInputError
from genrec.workloads.results import Environment, ResultRow

ENV = Environment("cpu:x", 2, "2.13", "none", "3.11", "abc", "host")


def row(exp, run_id, **quality):
    return ResultRow(
        decoder="beam",
        decoder_params={"beam_width": 4},
        dataset="d",
        model="m",
        split="test",
        env=ENV,
        quality=quality,
        experiment=exp,
        run_id=run_id,
    )


def test_rows_round_trip_and_rewrites_do_not_duplicate(tmp_path):
    write_result_row(tmp_path, row("a", "r1", **{"hr@10": 0.1}))
    write_result_row(tmp_path, row("a", "r2", **{"hr@10": 0.2}))
    write_result_row(tmp_path, row("b", "r3", **{"hr@10": 0.3}))
    write_result_row(tmp_path, row("a", "r1", **{"hr@10": 0.15}))  # a resumed trial writes again
    df = read_results(tmp_path, "a")
    assert sorted(df["run_id"]) == ["r1", "r2"]
    assert df.set_index("run_id").loc["r1", "hr@10"] == pytest.approx(0.15)
    assert df["param_beam_width"].tolist() == [4, 4]
    assert len(read_results(tmp_path)) == 3 and list_experiments(tmp_path) == ["a", "b"]
    assert not list(tmp_path.rglob("*.tmp"))


def test_empty_and_bad_names(tmp_path):
    assert read_results(tmp_path).empty and list_experiments(tmp_path) == []
    with pytest.raises(UserInputError, match="experiment name"):
        write_result_row(tmp_path, row("../evil", "r"))


def test_newer_schema_is_refused(tmp_path):
    flat = row("a", "r1").to_flat()
    flat["schema_version"] = 99
    write_result_row(tmp_path, flat)
    with pytest.raises(UserInputError, match="newer"):
        read_results(tmp_path)
