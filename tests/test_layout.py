"""The package layout: namespace folders mapped into genrec.*, no stdlib shadowing, a complete wheel,
--help on every CLI command, and the layering contract (checked on every module's source, lazy imports
inside functions included)."""

import ast
import re
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from conftest import REPO

AREAS = {
    "platform": "genrec/platform",
    "workloads": "genrec/workloads",
    "kernels": "genrec/kernels",
    "dashboards": "genrec/dashboards",
    "studies": "genrec/studies",
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
        "genrec.workloads.decoding.beam, genrec.workloads.tokenize.pipeline, "
        # the serving harness's entry point beside the Serve app runs there too (no Ray on that machine)
        "genrec.workloads.serving.harness, genrec.platform.serve.harness, "
        # the study drivers, and every study's registrations (its benchmarks, its page kind: not the page)
        "genrec.studies.static.static_step, genrec.studies.beam.beam_vs_hf, genrec.studies.loader;"
        "genrec.studies.loader.load_studies();"
        "bad = [m for m in ('ray', 'mlflow', 'plotly', 'pydantic', 'typer') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- the layering contract ----------------------------------------------------------------------------
# Layers, lowest first: a module may import its own layer and the ones below. The CLI (platform) loads
# the studies (their benchmarks and report pages), a study's report page builds on the report toolkit
# (dashboards), the reports read results and the benchmark registry (workloads), and kernels are leaf ops
# with their torch references beside them.
LAYERS = ("kernels", "workloads", "dashboards", "studies", "platform")
# What the lent GPU machine has besides the standard library: workloads and kernels run there from a
# plain checkout, so anything else (ray, mlflow, plotly, pydantic, typer, fastapi, starlette, yaml, ...)
# is refused there.
GPU_MACHINE_HAS = frozenset(
    {"torch", "triton", "numpy", "pandas", "pyarrow", "safetensors", "tokenizers", "tqdm", "rich"}
)
# Optional peers: allowed only inside functions (or for typing), where the comparison that needs them runs
# (genrec_old: an older commit of this repo exported by benchmarks/beam_regression.py).
OPTIONAL_PEERS = frozenset({"transformers", "genrec_old"})
GPU_ONLY_AREAS = ("workloads", "kernels", "studies")
# A study's report page modules draw with plotly (dashboards' toolkit): the one part of a study that
# does not run on the lent GPU machine. Its drivers and registration module do.
STUDY_REPORT_PAGE = re.compile(r"^studies/\w+/report(_\w+)?\.py$")
# The Triton kernel modules; every other kernels module (the torch references) must import without triton.
TRITON_KERNELS = frozenset(
    {
        "kernels/constrained_mask.py",
        "kernels/csr_level_select.py",
        "kernels/shared_prefix_attention_triton.py",
    }
)


@dataclass(frozen=True)
class Import:
    line: int
    module: str  # absolute dotted name (relative imports resolved)
    names: tuple[str, ...]  # `from module import names`; empty for `import module`
    lazy: bool  # inside a function, or only for type checking

    def targets(self) -> set[str]:
        """The module and every `module.name` (a name may be a submodule: `from genrec import platform`)."""
        return {self.module, *(f"{self.module}.{n}" for n in self.names if n != "*")}


def module_name(rel_path: str) -> tuple[str, bool]:
    """'workloads/data/dataset.py' -> ('genrec.workloads.data.dataset', False); packages end in __init__."""
    parts = rel_path.removesuffix(".py").split("/")
    is_package = parts[-1] == "__init__"
    return ".".join(["genrec", *(parts[:-1] if is_package else parts)]), is_package


def resolve_relative(module: str | None, level: int, importer: str, is_package: bool) -> str:
    package = importer if is_package else importer.rsplit(".", 1)[0]
    base = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _dynamic_import(node: ast.Call) -> str | None:
    """The constant module name of `__import__("x")` / `importlib.import_module("x")`, else None."""
    func = node.func
    called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if called not in ("__import__", "import_module") or not node.args:
        return None
    arg = node.args[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def imports_of(source: str, rel_path: str) -> list[Import]:
    """Every import in a module's source at any depth: top level, inside functions, classes, try and if
    blocks, and constant-name dynamic imports."""
    importer, is_package = module_name(rel_path)
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(node.lineno, alias.name, (), lazy) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = (
                resolve_relative(node.module, node.level, importer, is_package) if node.level else node.module
            )
            found.append(Import(node.lineno, module or "", tuple(a.name for a in node.names), lazy))
        elif isinstance(node, ast.Call) and (name := _dynamic_import(node)):
            found.append(Import(node.lineno, name, (), lazy))
        for child in ast.iter_child_nodes(node):
            child_lazy = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(node, ast.If) and _is_type_checking(node.test) and child in node.body:
                child_lazy = True
            visit(child, child_lazy)

    visit(ast.parse(source, filename=rel_path), False)
    return found


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "genrec" and parts[1] in LAYERS else None


def layer_rule(area: str, imp: Import) -> list[str]:
    rank = LAYERS.index(area)
    above = sorted({layer for t in imp.targets() if (layer := layer_of(t)) and LAYERS.index(layer) > rank})
    order, allowed = " < ".join(LAYERS), ", ".join(LAYERS[: rank + 1])
    return [f"imports genrec.{layer} [layers: {order}; {area} imports only {allowed}]" for layer in above]


def gpu_machine_rule(rel_path: str, imp: Import) -> list[str]:
    area, top = rel_path.split("/")[0], imp.module.split(".")[0]
    if area not in GPU_ONLY_AREAS or top in ("genrec", *sys.stdlib_module_names, *GPU_MACHINE_HAS):
        return []
    if STUDY_REPORT_PAGE.match(rel_path):
        return []
    if top in OPTIONAL_PEERS:
        why = "optional peers are imported inside the function that uses them"
        return [] if imp.lazy else [f"imports {top} at module level [gpu-machine: {why}]"]
    has = ", ".join(sorted(GPU_MACHINE_HAS))
    return [f"imports {top} [gpu-machine: {area} imports only the standard library and {has}]"]


def triton_rule(rel_path: str, imp: Import) -> list[str]:
    if not rel_path.startswith("kernels/") or rel_path in TRITON_KERNELS:
        return []
    if imp.module.split(".")[0] == "triton":
        what = "triton"
    # a backend registry may load a Triton kernel module inside the function that returns the backend
    # (the module still imports without triton: test_kernel_torch_references_import_without_triton)
    elif not imp.lazy and imp.targets() & {module_name(k)[0] for k in TRITON_KERNELS}:
        what = "a Triton kernel module"
    else:
        return []
    why = "torch references import without triton; name Triton kernel modules in TRITON_KERNELS"
    return [f"imports {what} [triton-kernels: {why}]"]


def violations(rel_path: str, source: str) -> list[str]:
    """'path:line: what [rule]' for every import that breaks the layering contract."""
    area = rel_path.split("/")[0]
    return [
        f"{rel_path}:{imp.line}: {problem}"
        for imp in imports_of(source, rel_path)
        for problem in [*layer_rule(area, imp), *gpu_machine_rule(rel_path, imp), *triton_rule(rel_path, imp)]
    ]


def code_modules(root: Path = REPO) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for area in LAYERS
        for p in (root / area).rglob("*.py")
        if "__pycache__" not in p.parts
    )


def tree_violations(root: Path = REPO) -> list[str]:
    """Every violation in every code module of the tree at ROOT."""
    return [v for m in code_modules(root) for v in violations(m, (root / m).read_text(encoding="utf-8"))]


def test_every_module_keeps_the_layering_contract():
    modules = code_modules()
    assert {"kernels/constrained_mask_torch.py", "workloads/results_store.py"} <= set(modules)
    assert {"studies/loader.py", "studies/nezha/nezha_arms.py", "studies/nezha/report.py"} <= set(modules)
    found = tree_violations()
    assert not found, "layering contract broken:\n" + "\n".join(found)


# ---- where benchmark drivers and paper pages live -------------------------------------------------------
PAPERS = ("atspeed", "nezha", "static", "xgr", "mari", "beam")
# entry points below the studies that are not benchmark drivers: the serving harness beside the Serve app
# and the report browser check (dashboards/browser.py: opens a page in headless Chromium)
NOT_DRIVERS = frozenset({"workloads/serving/harness.py", "dashboards/browser.py"})


def is_driver(source: str) -> bool:
    """A `python -m` benchmark driver: it parses flags and runs as __main__."""
    return "argparse" in source and 'if __name__ == "__main__"' in source


def paper_page_calls(source: str) -> list[int]:
    """Lines of `PageKind(..., claims=...)`: a page that draws a paper's benchmark rows."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", "")) == "PageKind"
        and any(kw.arg == "claims" for kw in node.keywords)
    ]


def test_workloads_hold_no_benchmark_driver_and_dashboards_no_paper_page():
    assert not (REPO / "workloads" / "benchmarks").exists()
    drivers = [
        m
        for m in code_modules()
        if m.startswith(("workloads/", "kernels/", "dashboards/"))
        and m not in NOT_DRIVERS
        and is_driver((REPO / m).read_text(encoding="utf-8"))
    ]
    assert not drivers, f"benchmark drivers belong in studies/<topic>/: {drivers}"
    pages = [
        m
        for m in code_modules()
        if m.startswith("dashboards/")
        and (Path(m).stem.startswith(PAPERS) or paper_page_calls((REPO / m).read_text(encoding="utf-8")))
    ]
    assert not pages, f"paper pages belong in studies/<topic>/report*.py: {pages}"
    # and the studies do hold them: every topic, its drivers and its experiment files
    for topic in PAPERS:
        assert (REPO / "studies" / topic / "__init__.py").is_file(), topic
        assert list((REPO / "studies" / topic).glob("*.py")), topic
    assert list((REPO / "studies" / "nezha" / "experiments").glob("*.yaml"))


def test_the_checks_catch_a_planted_driver_and_paper_page():
    driver = 'import argparse\n\nif __name__ == "__main__":\n    main()\n'
    assert is_driver(driver) and not is_driver("import argparse\n")
    page = "from genrec.dashboards.registry import PageKind\nK = PageKind('x', 'X', f, claims=('x_arm',))\n"
    assert paper_page_calls(page) == [2] and paper_page_calls("PageKind('decoders', 'd', f)\n") == []


def test_contract_fails_on_a_planted_upward_import_in_the_tree(tmp_path):
    """The whole-tree check, not only `violations`: the same tree with one workloads module that imports a
    study fails it, naming the file, the line and the rule; without the planted module it passes."""
    for m in ("workloads/errors.py", "studies/loader.py", "studies/nezha/nezha_arms.py"):
        (tmp_path / m).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / m).write_text((REPO / m).read_text(encoding="utf-8"))
    assert tree_violations(tmp_path) == []
    (tmp_path / "workloads" / "planted.py").write_text(
        "from genrec.workloads.errors import UserInputError\n\n\ndef f():\n    import genrec.studies.loader\n"
    )
    layers = "kernels < workloads < dashboards < studies < platform"
    rule = f"layers: {layers}; workloads imports only kernels, workloads"
    assert tree_violations(tmp_path) == [f"workloads/planted.py:5: imports genrec.studies [{rule}]"]


def test_triton_kernels_named_in_the_contract_exist():
    assert all((REPO / k).is_file() for k in TRITON_KERNELS), sorted(TRITON_KERNELS)


BANNED = [  # (module path, source, line and what the report must name)
    ("workloads/x.py", "import torch\n\ndef f():\n    import ray.tune\n", 4, "ray"),
    ("kernels/x.py", "def f():\n    from plotly import io\n", 2, "plotly"),
    ("workloads/b/c.py", "try:\n    import yaml\nexcept ImportError:\n    pass\n", 2, "yaml"),
    ("workloads/x.py", "class A:\n    import pydantic\n", 2, "pydantic"),
    ("workloads/x.py", "import importlib\nimportlib.import_module('mlflow')\n", 2, "mlflow"),
    ("workloads/x.py", "import transformers\n", 1, "transformers at module level"),
    ("kernels/x.py", "from ..workloads.constraints import vntk\n", 1, "genrec.workloads"),
    ("kernels/x.py", "def f():\n    import triton\n", 2, "triton"),
    ("kernels/x.py", "from . import constrained_mask\n", 1, "a Triton kernel module"),
    ("dashboards/x.py", "def f():\n    from genrec.platform import sweep\n", 2, "genrec.platform"),
    ("workloads/a/b.py", "from ... import dashboards\n", 1, "genrec.dashboards"),
    ("workloads/a/__init__.py", "from ... import platform\n", 1, "genrec.platform"),  # a package: . is itself
    # nothing below the studies imports one (the registries are filled from above, by the platform)
    ("workloads/x.py", "from genrec.studies.nezha import nezha_arms\n", 1, "genrec.studies"),
    ("workloads/x.py", "def f():\n    import genrec.studies.loader\n", 2, "genrec.studies"),
    (
        "dashboards/x.py",
        "from genrec.studies.atspeed.report import build_atspeed_report\n",
        1,
        "genrec.studies",
    ),
    ("kernels/x.py", "from genrec.studies.static import static_point\n", 1, "genrec.studies"),
    ("studies/a/b.py", "from genrec.platform.params import parse_params\n", 1, "genrec.platform"),
    # study drivers run on the lent GPU machine; only their report page modules may draw with plotly
    ("studies/nezha/nezha_arms.py", "import plotly\n", 1, "plotly"),
    ("studies/xgr/registration.py", "def f():\n    import pydantic\n", 2, "pydantic"),
    ("studies/mari/reporting.py", "import plotly\n", 1, "plotly"),
]


@pytest.mark.parametrize(("rel_path", "source", "line", "what"), BANNED)
def test_contract_reports_banned_imports_with_file_line_and_rule(rel_path, source, line, what):
    found = violations(rel_path, source)
    assert any(v.startswith(f"{rel_path}:{line}: imports {what} [") for v in found), found


ALLOWED = {
    "kernels/ref.py": """
        import math
        import torch
        from . import shared_prefix_attention
        from .constrained_mask_torch import vntk
        def backend():
            from .constrained_mask import vntk_triton
    """,
    "workloads/a/b.py": """
        from typing import TYPE_CHECKING
        import numpy
        from genrec.kernels.constrained_mask import vntk_triton
        from ..errors import UserInputError
        if TYPE_CHECKING:
            from transformers import LlamaForCausalLM
        def f():
            import triton
            import transformers
    """,
    "dashboards/x.py": "import plotly\nfrom genrec.workloads.results_store import read_results\n",
    "platform/x.py": "import ray\nfrom genrec.dashboards.report import build_report\n",
    "studies/nezha/report.py": "import plotly\nfrom genrec.dashboards.page import FigureWriter\n",
    "studies/atspeed/report_figures.py": "import plotly.graph_objects\n",
    "studies/a/b.py": """
        import torch
        from genrec.dashboards.registry import register_page
        from genrec.studies.common.cuda_graph import capture_cuda_graph
        from genrec.workloads.benchmark_registry import register_benchmark
    """,
    "platform/y.py": "from genrec.studies.loader import load_studies\n",
}


@pytest.mark.parametrize("rel_path", sorted(ALLOWED))
def test_contract_accepts_what_each_layer_may_import(rel_path):
    assert violations(rel_path, textwrap.dedent(ALLOWED[rel_path])) == []


def test_kernel_torch_references_import_without_triton():
    """Run, not just read: each non-Triton kernels module imports with triton made unimportable."""
    references = [
        module_name(m)[0] for m in code_modules() if m.startswith("kernels/") and m not in TRITON_KERNELS
    ]
    assert "genrec.kernels.constrained_mask_torch" in references
    code = (
        "import importlib, sys\n"
        "sys.modules['triton'] = None  # any `import triton` now raises ImportError\n"
        f"for name in {references!r}:\n"
        "    importlib.import_module(name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


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
