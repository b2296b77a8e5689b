"""``python -m fastbreaker``: the headline report runs end to end, in a subprocess, in seconds.

``FASTBREAKER_REPORT_TINY=1`` shrinks the run (2 rounds of 0.5 ms batches, 500 hosts): the
numbers mean nothing, but every row, every column and every output path runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fastbreaker

pytestmark = pytest.mark.thread_unsafe  # each test runs the report in a subprocess

SRC = str(Path(fastbreaker.__file__).resolve().parent.parent)
PEERS = ["pybreaker", "circuitbreaker", "aiobreaker", "purgatory"]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _env() -> dict[str, str]:
    env = dict(os.environ, FASTBREAKER_REPORT_TINY="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    return env


def _run(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    head = ["-c", code] if code else ["-m", "fastbreaker"]
    cmd = [sys.executable, *head, *args]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One tiny ``--quick`` run, with ``--json`` and (when matplotlib is installed) ``--plot``."""
    out = tmp_path_factory.mktemp("report")
    args = ["--quick", "--json", str(out / "report.json")]
    if HAS_MATPLOTLIB:
        args += ["--plot", str(out / "report.png")]
    proc = _run(*args)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((out / "report.json").read_text())
    return {"proc": proc, "data": data, "dir": out}


def test_json_structure(report: dict[str, Any]) -> None:
    data = report["data"]
    assert data["schema"] == 1
    assert data["command"].startswith("python -m fastbreaker --quick")
    for key in ("date", "machine", "versions", "method", "columns", "rows", "skipped", "targets"):
        assert key in data
    assert data["method"]["quick"] is True
    assert data["method"]["hosts"] == 500
    assert "gc" in data["method"] and "median" in data["method"]["statistic"]
    for row in data["rows"]:
        assert {"key", "label", "version", "api"} <= row.keys()
        assert isinstance(row["call_ns"], float)
        assert isinstance(row["hosts_call_ns"], float)
        assert row["bytes_per_host"] > 0
        assert row["threads_created"] == 0
        assert len(row["rounds"]["call_ns"]) == data["method"]["rounds"]


def test_rows_for_fastbreaker_floor_and_installed_peers(report: dict[str, Any]) -> None:
    data = report["data"]
    keys = [row["key"] for row in data["rows"]]
    expected = ["fastbreaker_py", "floor"] + [p for p in PEERS if importlib.util.find_spec(p)]
    if fastbreaker.COMPILED:
        expected.append("fastbreaker")
    assert sorted(keys) == sorted(expected)
    skipped = {s["label"] for s in data["skipped"]}
    assert skipped == {p for p in PEERS if not importlib.util.find_spec(p)} | (
        set() if fastbreaker.COMPILED else {"fastbreaker (compiled)"}
    )
    rows = {row["key"]: row for row in data["rows"]}
    assert rows["fastbreaker_py"]["allow_ns"] is not None
    assert rows["floor"]["x_floor"] == pytest.approx(1.0)
    if fastbreaker.COMPILED:
        assert rows["fastbreaker"]["x_fastbreaker"] == pytest.approx(1.0)
        assert data["targets"]["checks"][0]["what"] == "allow() in CLOSED"
    for peer in PEERS:
        if peer in rows:
            assert rows[peer]["allow_ns"] is None  # no peer has a permit API
            assert rows[peer]["open_call_ns"] is not None


def test_no_thread_started(report: dict[str, Any]) -> None:
    threads = report["data"]["threads"]
    assert threads["before"] == threads["after"]
    assert f"{threads['before']} before, {threads['after']} after" in report["proc"].stdout


def test_table_and_progress(report: dict[str, Any]) -> None:
    proc = report["proc"]
    for row in report["data"]["rows"]:
        assert row["label"] in proc.stdout
    assert "x fastbreaker" in proc.stdout
    assert "ratios carry over" in proc.stdout
    assert "smoke run" in proc.stdout
    assert "round 2/2" in proc.stderr  # progress goes to stderr


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_plot_writes_a_png(report: dict[str, Any]) -> None:
    png = report["dir"] / "report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000


def test_plot_without_matplotlib_says_so(tmp_path: Path) -> None:
    # sys.modules[name] = None makes `import name` raise ImportError, as if not installed.
    code = (
        "import sys; sys.modules['matplotlib'] = None; sys.argv[0] = 'fastbreaker'; "
        "from fastbreaker._report import main; sys.exit(main(sys.argv[1:]))"
    )
    png = tmp_path / "chart.png"
    proc = _run("--quick", "--plot", str(png), code=code)
    assert proc.returncode == 2
    assert "--plot needs matplotlib" in proc.stderr
    assert "pip install matplotlib" in proc.stderr
    assert not png.exists()
    assert proc.stdout == ""  # it stops before measuring anything


def test_markdown_and_json_to_stdout() -> None:
    proc = _run("--quick", "--quiet", "--markdown")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("| system | call(f)-f() |")
    assert lines[1].startswith("| --- |")
    assert proc.stderr == ""
    proc = _run("--quick", "--quiet", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rows"]
