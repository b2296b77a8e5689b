"""mypy --strict accepts tests/typing_check.py, which exercises the public API's types."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_mypy_accepts_typing_check():
    pytest.importorskip("mypy")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            str(ROOT / "tests" / "typing_check.py"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "MYPYPATH": str(ROOT / "src")},
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_rejects_wrong_argument_types(tmp_path):
    # The check can fail: a decorated function still rejects bad arguments.
    pytest.importorskip("mypy")
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import fastbreaker as fb\n"
        "b = fb.CircuitBreaker()\n"
        "@b\n"
        "def f(x: int) -> int:\n    return x\n"
        "f('not an int')\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "MYPYPATH": str(ROOT / "src")},
    )
    assert out.returncode == 1 and "arg-type" in out.stdout, out.stdout
