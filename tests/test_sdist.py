"""The sdist holds what a build from it and the README need: docs/benchmark.png, the Cython
sources (.pyx, .pxd), the C headers, README.md, and no build products.

The sdist is built from a copy of the checkout (so the checkout gets no egg-info or build/), with
``python -m build --sdist --no-isolation`` when the ``build`` package is installed, otherwise with
``setup.py sdist``; it skips where there is no checkout (a wheel's test run) or no setuptools.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "src" / "fastbreaker"

pytestmark = [
    pytest.mark.thread_unsafe(reason="builds an sdist in a subprocess"),
    pytest.mark.skipif(not (ROOT / "setup.py").is_file(), reason="not a checkout: no setup.py"),
    pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="no setuptools"),
]


@pytest.fixture(scope="module")
def sdist_names(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    tmp = tmp_path_factory.mktemp("sdist")
    src = tmp / "checkout"
    skip = shutil.ignore_patterns(
        ".git", ".venv", "venv*", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.c"
    )
    shutil.copytree(ROOT, src, ignore=skip)
    out = tmp / "dist"
    if importlib.util.find_spec("build") is not None:
        cmd = [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out)]
    else:
        cmd = [sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(out)]
    # The file list comes from MANIFEST.in and package-data, not from cythonizing: skip that.
    env = dict(os.environ, FASTBREAKER_NO_EXTENSIONS="1")
    proc = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (archive,) = out.glob("fastbreaker-*.tar.gz")
    with tarfile.open(archive) as tar:
        return [name.split("/", 1)[1] for name in tar.getnames() if "/" in name]


def test_sdist_has_the_readme_and_its_figure(sdist_names: list[str]) -> None:
    figures = ["docs/benchmark.png", "docs/overload.png"]
    for name in ["README.md", *figures, "pyproject.toml", "setup.py", "MANIFEST.in"]:
        assert name in sdist_names


def test_sdist_has_every_cython_source_and_header(sdist_names: list[str]) -> None:
    wanted = sorted(
        p.relative_to(ROOT).as_posix()
        for pattern in ("*.pyx", "*.pxi", "*.pxd", "*.pyi", "*.h")
        for p in CORE.rglob(pattern)  # bench/_floor_c.pyx too
    )
    assert any(name.endswith(".pyx") for name in wanted)
    assert any(name.endswith(".h") for name in wanted)
    missing = [name for name in wanted if name not in sdist_names]
    assert not missing


def test_sdist_has_no_build_products(sdist_names: list[str]) -> None:
    built = [
        n
        for n in sdist_names
        if n.endswith((".so", ".pyd", ".pyc"))
        or (n.startswith("src/fastbreaker/") and n.endswith(".c"))
    ]
    assert not built
