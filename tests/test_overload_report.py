"""``python -m fastbreaker overload`` runs for real (a smoke-sized run: --tiny):
uvicorn in a child process on 127.0.0.1, the open-loop client, both modes, the table and JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def test_the_overload_command_measures_both_modes(tmp_path: Path) -> None:
    out = tmp_path / "overload.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "fastbreaker", "overload", "--tiny", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert "goodput without" in proc.stdout and "goodput with" in proc.stdout
    data = json.loads(out.read_text())
    assert [r["load"] for r in data["rows"]] == [1.0, 3.0]
    # the warm-up's requests are sent and not counted (a fresh server's short queue flattered
    # short points without shedding), and the table says so beside the numbers
    assert data["warmup_s"] > 0 and "after 0.2 s of warm-up (sent, not counted" in proc.stdout
    for row in data["rows"]:
        for mode in ("without", "with"):
            c = row[mode]
            # every request sent ends one way: answered in time, late, shed, timed out or failed
            assert c["sent"] == c["good"] + c["late"] + c["shed"] + c["timeout"] + c["error"]
            assert c["sent"] == int(row["offered_rps"] * data["seconds"])
            assert c["warmup_sent"] == int(row["offered_rps"] * data["warmup_s"])
            assert 0.0 <= c["goodput"] <= 1.5
        assert row["without"]["shed"] == 0  # no shedder: nothing answers 503
    # at 3x the capacity the shedder refuses work; without it nothing is refused
    assert data["rows"][1]["with"]["shed"] > 0


def test_the_overload_command_refuses_bad_options() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "fastbreaker", "overload", "--capacity", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--capacity >= 1" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "fastbreaker", "overload", "--warmup", "-1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--warmup must be in [0, 60] seconds" in proc.stderr
