"""The one-call GPU check (studies/gpu): the runner's bookkeeping on planted steps, and a CPU dry run of
the real plan, so a broken step command or a renamed JSON field fails here, not in a lent GPU session."""

import json
import sys
import tarfile

import pytest

from genrec.studies.gpu import check, plan
from genrec.studies.gpu.plan import CheckConfig, Step, Target

PY = sys.executable


def write_json(path: str, value: float) -> tuple[str, ...]:
    return (PY, "-c", f"import json; open({path!r}, 'w').write(json.dumps({{'x': {value}}}))")


def planted(cfg: CheckConfig) -> list[Step]:
    raw = cfg.raw
    return [
        Step("good", (write_json(str(raw("good")), 3.0),), timeout_s=30, estimate_s=1),
        Step("low", (write_json(str(raw("low")), 0.5),), timeout_s=30, estimate_s=1),
        Step("broken", ((PY, "-c", "import sys; sys.exit(3)"),), timeout_s=30, estimate_s=1),
        Step("hangs", ((PY, "-c", "import time; time.sleep(30)"),), timeout_s=1, estimate_s=1),
        Step("after", (write_json(str(raw("after")), 9.0),), timeout_s=30, estimate_s=1, needs=("broken",)),
        Step("too_big", (write_json(str(raw("too_big")), 9.0),), timeout_s=30, estimate_s=10_000),
        Step("future", (), timeout_s=30, estimate_s=1, built=False),
    ]


def planted_targets() -> list[Target]:
    def read(path):
        return json.loads(path.read_text())["x"]

    names = ("good", "low", "broken", "hangs", "after", "too_big", "future")
    return [Target(f"{n} >= 1", n, read, 1.0) for n in names]


def test_every_target_gets_a_figure_or_a_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(check, "plan", planted)
    monkeypatch.setattr(check, "targets", planted_targets)
    out = tmp_path / "out"
    out.mkdir()
    cfg = CheckConfig(work=tmp_path / "work", device="cpu", dry=True)
    runs = check.execute(cfg, out, budget_s=600, only=None)
    assert runs["broken"].status == "failed (rc 3)"
    assert runs["hangs"].status == "timeout"
    record = json.loads((out / "gpu_check.json").read_text())
    status = {t["target"].split()[0]: (t["status"], t["figure"]) for t in record["targets"]}
    assert status == {
        "good": ("met", 3.0),
        "low": ("not met", 0.5),
        "broken": ("not run (failed (rc 3))", None),
        "hangs": ("not run (timeout)", None),
        "after": ("not run (needs broken)", None),
        "too_big": ("not run (budget)", None),
        "future": ("not built", None),
    }
    summary = (out / "summary.txt").read_text()
    assert "not run (budget)" in summary and "not built" in summary
    with tarfile.open(out / "raw.tar.gz") as tar:
        assert {"raw/good.json", "raw/broken.log"} <= set(tar.getnames())


def test_a_renamed_field_is_reported_not_hidden(tmp_path):
    cfg = CheckConfig(work=tmp_path, device="cpu", dry=True)
    cfg.raw("s").parent.mkdir(parents=True)
    cfg.raw("s").write_text(json.dumps({"renamed": 1}))
    t = Target("s", "s", lambda p: json.loads(p.read_text())["x"], 1.0)
    row = check.target_line(t, {"s": check.StepRun("s", "ok")}, cfg)
    assert row["status"].startswith("unreadable (KeyError")


def test_only_adds_what_a_step_needs_and_refuses_unknown_names(tmp_path):
    cfg = CheckConfig(work=tmp_path, device="cpu", dry=True)
    assert check.with_needs(cfg, ["serving"]) == {"serving", "prepare"}
    with pytest.raises(check.UserInputError, match="unknown steps"):
        check.with_needs(cfg, ["servings"])


def test_the_plan_names_every_target_of_the_issue():
    steps = {s.name for s in plan.plan(CheckConfig(work=plan.Path("/tmp/x")))}
    assert {t.step for t in plan.targets()} <= steps
    labels = " ".join(t.label for t in plan.targets())
    for what in ("kernels", "BW 512", "peak memory", "selection", "serving", "AtSpeed", "STATIC", "Qwen3"):
        assert what in labels


@pytest.mark.slow
def test_cpu_dry_run_of_the_real_plan(tmp_path):
    """Every step of the real plan runs on tiny shapes and every target reads its figure."""
    out = tmp_path / "out"
    code = check.main(["--out", str(out), "--work", str(tmp_path / "work"), "--device", "cpu", "--dry-run"])
    record = json.loads((out / "gpu_check.json").read_text())
    steps = {s["name"]: s["status"] for s in record["steps"]}
    assert set(steps.values()) == {"ok"}, steps
    assert code == 0
    for t in record["targets"]:
        assert t["status"] in ("met", "not met", "n/a on cpu"), t
