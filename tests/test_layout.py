"""The package layout: namespace folders mapped into genrec.*, no stdlib shadowing, a complete wheel,
and --help on every CLI command."""

import subprocess
import sys
import zipfile

import pytest
import typer
from conftest import REPO

AREAS = {
    "platform": "genrec/platform",
    "workloads": "genrec/workloads",
    "kernels": "genrec/kernels",
    "dashboards": "genrec/dashboards",
}


def test_top_level_areas_are_namespace_folders():
    for area in AREAS:
        assert (REPO / area).is_dir()
        assert not (REPO / area / "__init__.py").exists(), f"{area}/__init__.py would shadow imports"


def test_import_platform_from_repo_root_is_the_standard_library():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import platform, sys; print(platform.__file__); print(platform.python_version())",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    assert not out[0].startswith(str(REPO)), f"`import platform` resolved to the repo: {out[0]}"
    assert out[1].startswith("3.")


def test_workloads_import_nothing_the_gpu_machine_lacks():
    code = (
        "import sys, genrec.workloads.evaluation, genrec.workloads.training.trainer, "
        "genrec.workloads.decoding.beam, genrec.workloads.tokenize.pipeline;"
        "bad = [m for m in ('ray', 'mlflow', 'plotly', 'pydantic', 'typer') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_built_wheel_contains_every_module(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("genrec_lab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"{prefix}/{p.relative_to(REPO / area).as_posix()}"
        for area, prefix in AREAS.items()
        for p in (REPO / area).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert expected, "no modules found"
    missing = sorted(expected - names)
    assert not missing, f"modules missing from the wheel (add their packages to pyproject.toml): {missing}"


def _command_paths(group, prefix=()):
    for name, cmd in group.commands.items():
        path = (*prefix, name)
        yield path
        if hasattr(cmd, "commands"):
            yield from _command_paths(cmd, path)


def test_every_cli_command_has_help(capsys):
    from genrec.platform.cli import app, main

    paths = list(_command_paths(typer.main.get_command(app)))
    assert {("train",), ("eval",), ("data", "synth"), ("tokenize",)} <= set(paths)
    for path in [(), *paths]:
        with pytest.raises(SystemExit) as exc:
            main([*path, "--help"])
        assert exc.value.code == 0, path
        assert "Usage" in capsys.readouterr().out


def test_multi_value_k_option_is_expanded():
    from genrec.platform.cli import expand_multi_value_options

    assert expand_multi_value_options(["eval", "--k", "5", "10", "--quiet"]) == [
        "eval",
        "--k",
        "5",
        "--k",
        "10",
        "--quiet",
    ]
    assert expand_multi_value_options(["eval", "--k", "5"]) == ["eval", "--k", "5"]
    assert expand_multi_value_options(["eval", "--k", "--quiet"]) == ["eval", "--k", "--quiet"]
    assert expand_multi_value_options(["eval", "--k"]) == ["eval", "--k"]
