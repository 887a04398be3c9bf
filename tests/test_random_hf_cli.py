"""`python -m genrec.studies.common.random_hf`: the checkpoint a user without a model of their own imports."""

from __future__ import annotations

import json

import pytest
from hf_models import transformers_or_skip

from genrec.studies.common import random_hf
from genrec.workloads.errors import UserInputError
from genrec.workloads.models.hf_checkpoint import import_hf_checkpoint


def test_builds_an_importable_checkpoint(tmp_path):
    transformers_or_skip()
    out = tmp_path / "q3"
    random_hf.main(["--out", str(out), "--sizes", "8", "8", "8", "--items", "50", "--seed", "3"])
    index = json.loads((out / "items.index.json").read_text())
    assert len(index) == 50 and len({tuple(v) for v in index.values()}) == 50  # distinct SIDs
    assert "{history}" in json.loads((out / "prompt.json").read_text())["text"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the build folder is gone
    import_hf_checkpoint(
        out, out / "items.index.json", tmp_path / "imported", "lcrec", out / "prompt.json", None
    )
    assert (tmp_path / "imported").is_dir()


def test_refuses_what_it_cannot_build(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(UserInputError, match="exists"):
        random_hf.main(["--out", str(tmp_path / "taken")])
    with pytest.raises(UserInputError, match="--items 600"):
        random_hf.main(["--out", str(tmp_path / "new"), "--sizes", "8", "8", "8", "--items", "600"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
