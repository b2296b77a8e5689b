"""What a first user meets: ``python -m fastbreaker --version``, the report working without
matplotlib, and the suite testing the installed package (not a source tree on ``sys.path``)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import fastbreaker

PACKAGE = pathlib.Path(fastbreaker.__file__).resolve().parent
ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_version_flag_prints_the_installed_version_and_core() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fastbreaker", "--version"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    core = "compiled core" if fastbreaker.COMPILED else "pure-Python core"
    assert proc.stdout.strip() == f"fastbreaker {fastbreaker.__version__} ({core})"
    assert fastbreaker.__version__ != "0+unknown"  # read from the installed metadata


def test_no_module_imports_matplotlib_statically() -> None:
    # mypy --strict and stubtest read every static import: one of matplotlib would make them
    # fail on an environment without it (the report imports it by name, bench/_mpl.py)
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(n.split(".")[0] == "matplotlib" for n in names), path


def test_the_report_imports_and_refuses_plot_without_matplotlib() -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "import fastbreaker.bench._cli, fastbreaker.bench._overload, fastbreaker.bench._render as r\n"
        "print(r.require_matplotlib())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "pip install matplotlib" in proc.stdout


def test_the_suite_tests_the_installed_package() -> None:
    # No pythonpath setting: fastbreaker comes from an installation, a wheel or an editable
    # install, whose .pth file in site-packages adds src/ after site-packages (never before it,
    # as pytest's pythonpath did).
    import importlib.metadata

    assert importlib.metadata.version("fastbreaker") == fastbreaker.__version__
    paths = [pathlib.Path(p).resolve() for p in sys.path if p]
    site = [i for i, p in enumerate(paths) if p.name in ("site-packages", "dist-packages")]
    if PACKAGE.parent in paths and PACKAGE.parent.name not in ("site-packages", "dist-packages"):
        assert site and paths.index(PACKAGE.parent) > min(site), sys.path


@pytest.mark.skipif(not (ROOT / "pyproject.toml").exists(), reason="no pyproject.toml")
def test_pytest_settings_set_no_pythonpath() -> None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    with open(ROOT / "pyproject.toml", "rb") as f:
        ini = tomllib.load(f)["tool"]["pytest"]["ini_options"]
    assert "pythonpath" not in ini
    assert any(m.startswith("slow:") for m in ini["markers"])
