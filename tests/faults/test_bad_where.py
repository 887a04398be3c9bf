"""Fault suite, bad inputs: `genrec runs --where` takes column comparisons only. Expressions that
reached Python objects through pandas' query engine (`@__builtins__`, attribute access, calls) and
malformed ones exit 2 with the grammar in the message; good ones select the right rows."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from genrec.platform.tracking import write_result_row
from genrec.workloads.results import Environment, ResultRow

ENV = Environment("cpu:x", 2, "2.13", "none", "3.11", "abc", "host")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("where")
    for i, (width, recall, decoder) in enumerate([(10, 0.1, "beam"), (20, 0.6, "static"), (30, 0.7, "beam")]):
        write_result_row(
            root,
            ResultRow(
                decoder=decoder,
                decoder_params={"beam_width": width},
                dataset="d",
                model="m",
                split="test",
                env=ENV,
                quality={"recall@10": recall},
                experiment="w",
                run_id=f"r{i}",
            ),
        )
    return root


def runs(results, where: str) -> list[str]:
    return [
        "runs",
        "--results-dir",
        str(results),
        "--where",
        where,
        "--format",
        "json",
        "--columns",
        "run_id",
    ]


HOSTILE = [
    "@__builtins__",
    "@__builtins__['eval']('1')",
    "decoder.__class__.__subclasses__()",
    "__import__('os').system('true')",
    "run_id.str.len() > 0",
    "decoder == decoder.upper()",
    "param_beam_width.__class__ > 0",
    "`recall@10` >",
    "param_beam_width >= 20 and",
    "(param_beam_width > 1",
    "param_beam_width > 1)",
    "param_beam_width => 1",
    "param_beam_width = 10",
    "1 == 1",
    "'a' == 'a'",
    "nope > 1",
    "`no such column` == 1",
    "decoder in beam",
    "decoder in ['beam'",
    "decoder not beam",
    "param_beam_width > 1 ; import os",
    "lambda: 1",
    "[x for x in decoder]",
    "decoder > 1",
    "not",
    "   ",
    "(" * 60 + "param_beam_width > 1" + ")" * 60,
    "param_beam_width > 1 or " * 400 + "param_beam_width > 1",
]


@pytest.mark.parametrize("where", HOSTILE, ids=[f"hostile-{i}" for i in range(len(HOSTILE))])
def test_hostile_or_malformed_where_exits_2(results, where, capsys):
    assert run_cli(runs(results, where)) == 2
    err = capsys.readouterr().err
    assert "--where" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "where, want",
    [
        ("param_beam_width >= 20", ["r1", "r2"]),
        ("param_beam_width >= 20 and `recall@10` > 0.65", ["r2"]),
        ("decoder == 'beam' or param_beam_width == 20", ["r0", "r1", "r2"]),
        ('not (decoder == "beam")', ["r1"]),
        ("decoder in ['static', 'nope']", ["r1"]),
        ("decoder not in ['static']", ["r0", "r2"]),
        ("20 < param_beam_width", ["r2"]),
        ("`recall@10` < 0.5 | param_beam_width > 25", ["r0", "r2"]),
    ],
)
def test_column_comparisons_select_rows(results, where, want, capsys):
    assert run_cli(runs(results, where)) == 0
    got = [json.loads(line)["run_id"] for line in capsys.readouterr().out.splitlines()]
    assert sorted(got) == want
