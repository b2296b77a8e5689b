"""``python -m fastbreaker``: the headline report runs end to end, in a subprocess, in seconds.

``--tiny`` (added to every run here) shrinks the run (2 rounds of 0.5 ms batches, 500 hosts): the
numbers mean nothing, but every row, every column and every output path runs.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import fastbreaker
from fastbreaker.bench import _breakers, _render, _section, _targets

pytestmark = pytest.mark.thread_unsafe  # each test runs the report in a subprocess

SRC = str(Path(fastbreaker.__file__).resolve().parent.parent)
PEERS = ["pybreaker", "circuitbreaker", "aiobreaker", "purgatory"]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    return env


def _run(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    head = ["-c", code] if code else ["-m", "fastbreaker"]
    cmd = [sys.executable, *head, *args, "--tiny"]
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
    variants = {"fastbreaker_count_window", "fastbreaker_time_window", "fastbreaker_dry_run"}
    if fastbreaker.COMPILED:
        expected += ["fastbreaker", "fastbreaker_fleet", "fastbreaker_shared", *variants]
    assert sorted(keys) == sorted(expected)
    skipped = {s["label"] for s in data["skipped"]}
    compiled_rows = {"fastbreaker (compiled)", "fastbreaker + fleet", "fastbreaker shared"} | {
        label for label, _ in _breakers.VARIANTS
    }
    assert skipped == {p for p in PEERS if not importlib.util.find_spec(p)} | (
        set() if fastbreaker.COMPILED else compiled_rows
    )
    rows = {row["key"]: row for row in data["rows"]}
    assert rows["fastbreaker_py"]["allow_ns"] is not None
    # a tiny run on a loaded machine can measure a cell <= 0: it then gets no ratio
    if rows["floor"]["call_ns"] > 0:
        assert rows["floor"]["x_floor"] == pytest.approx(1.0)
    else:
        assert rows["floor"]["x_floor"] is None
    if fastbreaker.COMPILED and rows["fastbreaker"]["call_ns"] > 0:
        assert rows["fastbreaker"]["x_fastbreaker"] == pytest.approx(1.0)
    if fastbreaker.COMPILED:
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
    assert "ratios carry over" in proc.stdout
    # the developers' targets are not the user's: without --check-targets they are not shown
    assert "target" not in proc.stdout.lower()
    assert "NOT met" not in proc.stdout and "MISSED" not in proc.stdout
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
        "from fastbreaker.bench import main; sys.exit(main(sys.argv[1:]))"
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
    assert lines[0].startswith("**ns per operation")
    assert lines[2].startswith("| system | call(f)-f() |")
    assert lines[3].startswith("| --- |")
    assert "| system | x Floor().call(f) | x fastbreaker |" in proc.stdout
    assert proc.stderr == ""
    proc = _run("--quick", "--quiet", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rows"]


def test_output_lines_fit_in_80_columns(report: dict[str, Any]) -> None:
    lines = report["proc"].stdout.splitlines()
    assert len(lines) > 20
    too_wide = [line for line in lines if len(line) > 80]
    assert not too_wide, too_wide


def test_any_table_fits_in_80_columns_and_keeps_every_cell() -> None:
    # wide headers wrap, and columns that still do not fit go to a continued table
    headers = ["system", "a very long header of many words", "try_acquire()+release()"]
    headers += [f"column {i}" for i in range(6)]
    rows = [["a system label of thirty chars!", "1.00x", "12,345"] + ["999"] * 6]
    lines = _render._text_table("title", headers, rows)
    assert max(len(line) for line in lines) <= 80
    cells = " ".join(lines).split()
    assert cells.count("999") == 6 and "12,345" in cells and "1.00x" in cells
    assert "try_acquire()+" in cells and "release()" in cells


def test_the_verdict_block_is_last(report: dict[str, Any]) -> None:
    data, out = report["data"], report["proc"].stdout.rstrip("\n")
    block = out.split("\n\n")[-1].splitlines()
    key = "fastbreaker" if fastbreaker.COMPILED else "fastbreaker_py"
    row = next(r for r in data["rows"] if r["key"] == key)
    assert block[0].startswith(f"Verdict: {row['label']}, fastbreaker {fastbreaker.__version__}")
    assert f"this run in {data['seconds']:.0f} s" in block[0]
    text = "\n".join(block)
    assert f"{data['method']['hosts']:,} hosts, m.call(host, f): " in text
    assert f"{row['bytes_per_host']:,.0f} bytes per host" in text
    assert f"one CircuitBreaker(): {data['standalone_bytes'][key]:,.0f} bytes" in text
    threads = data["threads"]
    assert (
        block[-1]
        == f"  threads: {threads['before']} before, {threads['after']} after (none started)"
    )
    # the methodology is not printed without --verbose
    assert "how each system is driven" not in out


def test_no_row_of_dashes_only(report: dict[str, Any]) -> None:
    # a row with nothing measured in any of a table's columns is not printed
    for line in report["proc"].stdout.splitlines():
        label, *cells = re.split(r"\s{2,}", line.strip())
        assert not (cells and all(c == "-" for c in cells)), line
    # while the JSON keeps every row (a null is what a table shows as "-")
    labels = {r["label"] for r in report["data"]["sections"]["bulkheads"]["rows"]}
    assert "asyncio.Semaphore" in labels


def test_verbose_prints_the_methodology_above_the_tables() -> None:
    proc = _run("--quick", "--quiet", "--verbose")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    first_table = out.index("\n---")  # the first table's rule
    method = out.index("How this report measures (--verbose).")
    assert method < first_table
    assert out.index("how each system is driven:") < first_table
    assert "one CircuitBreaker(): tracemalloc" in out[:first_table]
    assert out.rstrip("\n").split("\n\n")[-1].startswith("Verdict: ")
    assert max(len(line) for line in out.splitlines()) <= 80


def test_every_ratio_names_its_floor(report: dict[str, Any]) -> None:
    out = " ".join(report["proc"].stdout.split())  # lines wrap at 80 columns
    assert "x Floor().call(f)" in out  # the table's ratio column
    if fastbreaker.COMPILED:
        summary = out[out.index("fastbreaker (compiled), from the tables above:") :]
        assert "the floor Floor().allow()" in summary
        assert "the floor Floor().call(f)-f()" in summary
    raw = report["proc"].stdout
    assert " x floor" not in raw and "x floor " not in raw  # no ratio to an unnamed floor


def test_bulkhead_section(report: dict[str, Any]) -> None:
    part = report["data"]["sections"]["bulkheads"]
    keys = [row["key"] for row in part["rows"]]
    expected = ["fastbreaker_py", "stdlib_bounded_semaphore", "stdlib_asyncio_semaphore", "floor"]
    expected += [p for p in ("anyio", "pyresilience") if importlib.util.find_spec(p)]
    if fastbreaker.COMPILED:
        expected.append("fastbreaker")
    assert sorted(keys) == sorted(expected)
    for column in ("try_release_ns", "with_ns", "call_ns", "async_ns", "x_floor", "x_with"):
        assert column in part["columns"]
    rows = {row["key"]: row for row in part["rows"]}
    for metric in ("try_release_ns", "with_ns", "call_ns", "async_ns"):
        assert isinstance(rows["fastbreaker_py"][metric], float)
    sem = rows["stdlib_bounded_semaphore"]
    assert isinstance(sem["with_ns"], float) and sem["async_ns"] is None
    assert isinstance(rows["stdlib_asyncio_semaphore"]["async_ns"], float)
    if rows["floor"]["try_release_ns"] > 0:
        assert rows["floor"]["x_floor"] == pytest.approx(1.0)
    out = " ".join(report["proc"].stdout.split())  # lines wrap at 80 columns
    assert "bulkheads: ns per operation" in out and "x Floor() pair" in out
    for row in part["rows"]:
        assert row["label"] in out
    if fastbreaker.COMPILED:
        assert "fastbreaker Bulkhead (compiled), from the bulkhead tables:" in out
        assert "the floor Floor().allow(); Floor().record_success()" in out


def test_call_paths_section(report: dict[str, Any]) -> None:
    part = report["data"]["sections"]["paths"]
    rows = {row["key"]: row for row in part["rows"]}
    assert {"fastbreaker_py", "floor"} <= set(rows)
    assert ("fastbreaker" in rows) == fastbreaker.COMPILED
    for peer, metric in (
        ("purgatory", "with_ns"),
        ("tenacity", "retry_ns"),
        ("stamina", "retry_ns"),
    ):
        if importlib.util.find_spec(peer):
            assert isinstance(rows[peer][metric], float), peer
    for metric in ("with_ns", "async_dec_ns", "async_with_ns", "retry_ns", "rejected_ns"):
        assert isinstance(rows["fastbreaker_py"][metric], float)
        assert isinstance(rows["floor"][metric], float)
    out = " ".join(report["proc"].stdout.split())  # lines wrap at 80 columns
    assert "call paths: ns per operation" in out
    if fastbreaker.COMPILED:
        assert "fastbreaker (compiled), from the call-path tables:" in out
        assert "the floor raise E('svc', 1, 30.0), caught" in out


def test_scaling_block(report: dict[str, Any]) -> None:
    from fastbreaker.bench import _scaling

    part = report["data"]["scaling"]
    out = " ".join(report["proc"].stdout.split())  # lines wrap at 80 columns
    reason = _scaling.unavailable()
    if reason is not None:
        assert part == {"skipped": reason}
        assert f"scaling with 2 threads: not measured: {reason}." in out
        return
    assert [row["key"] for row in part["rows"]] == ["per_host", "shared", "floor"]
    for row in part["rows"]:
        assert row["ops_per_s"]["1"] > 0 and row["ops_per_s"]["2"] > 0
        assert row["exact"] in (True, None)
    assert "scaling without the GIL" in out


def test_scaling_measures_and_counts_exactly_on_any_build() -> None:
    # the machinery runs on a GIL build too (there the 2 threads take turns): the breakers count
    # every op of every thread, and every thread is joined
    from fastbreaker.bench import _scaling

    if not fastbreaker.COMPILED:
        pytest.skip("the scaling rows drive the compiled core")
    before = threading.active_count()
    result = _scaling.measure(seconds=0.005, repeats=1)
    assert threading.active_count() == before
    rows = {row["key"]: row for row in result["rows"]}
    assert rows["per_host"]["exact"] is True and rows["shared"]["exact"] is True
    assert rows["per_host"]["target"] == 1.8 and rows["shared"]["target"] == 1.5
    lines = _scaling.lines({"scaling": result, "check_targets": True})
    assert len(lines) == 4 and "target >= 1.8x" in lines[1] and "target >= 1.5x" in lines[2]
    assert "target" not in "\n".join(_scaling.lines({"scaling": result}))
    # a miss is reported by --check-targets
    missed = copy.deepcopy(result)
    for row in missed["rows"]:
        row["met"] = None if row["target"] is None else True
    assert _scaling.missed({"scaling": missed}) == []
    missed["rows"][1].update(x=1.2, met=False)
    assert _scaling.missed({"scaling": missed}) == ["scaling shared 1.20x < 1.5x"]


def _result(report: dict[str, Any], **cells: dict[str, float]) -> dict[str, Any]:
    """The fixture's run with some cells replaced: ``_result(r, floor={"allow_ns": 10.0})``."""
    data = copy.deepcopy(report["data"])
    rows = {row["key"]: row for row in data["rows"]}
    for key, values in cells.items():
        rows[key].update(values)
    return data


@pytest.mark.skipif(not fastbreaker.COMPILED, reason="the summary compares the compiled core")
def test_summary_gives_ratios_to_the_floors_and_to_the_peers(report: dict[str, Any]) -> None:
    data = _result(
        report,
        fastbreaker={"allow_ns": 15.0, "call_ns": 40.0, "open_call_ns": 500.0},
        floor={"allow_ns": 10.0, "call_ns": 50.0},
        fastbreaker_py={"call_ns": 1000.0, "open_call_ns": 2000.0},
    )
    text = _render.format_text(data)
    assert "allow() in CLOSED: 15.0 ns = 1.50x the floor Floor().allow() (10.0 ns)" in text
    assert "call(f)-f(): 40.0 ns = 0.80x the floor Floor().call(f)-f() (50.0 ns)" in text
    assert "fastbreaker (pure twin): call 25x, open: call 4.00x" in text
    # a noisy run can measure a negative cell: it gets no ratio rather than a meaningless one
    data = _result(report, fastbreaker={"allow_ns": -3.0}, floor={"allow_ns": 10.0})
    assert "= n/a the floor Floor().allow()" in _render.format_text(data)


def test_targets_compare_unrounded_ratios() -> None:
    # a ratio that prints as the target when rounded to 2 decimals is still a miss
    assert _targets.ratio_vs(1.1503, 1.15) == "1.1503"
    assert _targets.ratio_vs(1.1497, 1.15) == "1.15"  # met, and printed as equal: consistent
    assert _targets.ratio_vs(2.0, 3.0) == "2.00"
    floor = _section.System("floor", "floor", "0", {}, {}, {}, results={"allow_ns": 10.0})
    fb = _section.System(
        "fastbreaker",
        "fb",
        "0",
        {},
        {},
        {},
        results={
            "allow_ns": 11.5 + 1e-9,
            "call_ns": 30.0,
            "open_allow_ns": 20.0,
        },
    )
    targets = _targets.compute_targets([fb, floor], loop_ns=0.0)
    checks = {t["what"]: t for t in targets["checks"]}
    assert checks["allow() in CLOSED"]["met"] is False
    assert checks["call(f) minus f()"]["met"] is True  # 3.0x exactly: met
    assert targets["floor"] == "Floor().allow()"
    result = {"targets": targets, "check_targets": True}
    assert _targets.missed_targets(result) == ["allow() in CLOSED"]
    lines = _targets.target_lines(result)
    assert any("allow() in CLOSED" in ln and "1.150000" in ln and "MISSED" in ln for ln in lines)
    assert _targets.target_lines(dict(result, check_targets=False)) == []
    # a further section's target is a ratio to its own floor row, and its line names that floor
    bh_floor = _section.System("floor", "floor", "0", {}, {}, {}, results={"try_release_ns": 20.0})
    bh = _section.System("fastbreaker", "fb", "0", {}, {}, {}, results={"try_release_ns": 55.0})
    targets = _targets.compute_targets([fb, floor], 0.0, {"bulkheads": [bh, bh_floor]})
    check = targets["checks"][-1]
    assert check["what"] == "Bulkhead try_acquire() + release()"
    assert check["x_floor"] == pytest.approx(2.75) and check["met"] is False
    lines = _targets.target_lines({"targets": targets, "check_targets": True})
    assert "the floor Floor().allow(); Floor().record_success() (20.0 ns)" in " ".join(lines)
    # rows with other options are compared with a reference row of the same run
    counted = _section.System(
        "fastbreaker_count_window", "w", "0", {}, {}, {}, results={"allow_record_ns": 40.0}
    )
    timed = _section.System(
        "fastbreaker_time_window", "t", "0", {}, {}, {}, results={"allow_record_ns": 61.0}
    )
    dry = _section.System("fastbreaker_dry_run", "d", "0", {}, {}, {}, results={"call_ns": 31.0})
    targets = _targets.compute_targets([fb, floor, counted, timed, dry], 0.0)
    checks = {t["what"]: t for t in targets["checks"]}
    window = checks["time window allow+record"]
    assert window["x_floor"] == pytest.approx(61.0 / 40.0) and window["met"] is False  # > 1.5x
    dry_run = checks["dry_run call(f)-f()"]
    assert dry_run["x_floor"] == pytest.approx(31.0 / 30.0) and dry_run["met"] is True
    lines = _targets.target_lines({"targets": targets, "check_targets": True})
    assert any("1.52x window=100 (40.0 ns)" in ln and "MISSED" in ln for ln in lines)
    assert all(len(ln) <= 100 for ln in lines if "window=100" in ln or "x plain" in ln)


def test_check_targets_flag_sets_the_exit_status(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = _run("--quick", "--quiet", "--check-targets", "--json", str(out))
    data = json.loads(out.read_text())
    if not fastbreaker.COMPILED:
        assert proc.returncode == 1 and "needs the compiled core" in proc.stderr
        return
    missed = [t["what"] for t in data["targets"]["checks"] if t["met"] is False]
    assert proc.returncode == (1 if missed else 0), proc.stderr
    assert "--check-targets: the developers' targets" in proc.stdout
    for what in missed:
        assert what in proc.stderr
    flat = " ".join(proc.stdout.split())  # a verdict may wrap at 80 columns
    verdicts = flat.split("--check-targets:", 1)[1].split(" target <=")[1:]
    # four for the breaker, two of its rows with other options, one for the shared row, one for
    # the bulkhead, one for the call paths' rejection, four for the rate limiters
    assert len(verdicts) == 13
    assert sum(v.split(":")[1].strip().startswith("MISSED") for v in verdicts) == len(missed)


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_plot_draws_allow_next_to_the_calls(report: dict[str, Any]) -> None:
    import matplotlib.pyplot as plt

    data = _result(report, fastbreaker_py={"allow_ns": 300.0}, floor={"allow_ns": 10.0})
    fig = _render.figure(data)
    try:
        panels = {ax.get_title(): ax for ax in fig.axes}
        allow = next(ax for title, ax in panels.items() if title.startswith("allow()"))
        widths = [bar.get_width() for bar in allow.patches]
        expected = [
            r["allow_ns"] if r["allow_ns"] and r["allow_ns"] > 0 else 0 for r in data["rows"]
        ]
        assert widths == pytest.approx(expected)
        labels = [t.get_text() for t in allow.texts]
        assert "300 ns  (30x)" in labels  # the twin, as a multiple of Floor().allow()
        assert any(title.startswith("guarded call") for title in panels)
    finally:
        plt.close(fig)


RATE_PEERS = {
    "pyrate": "pyrate_limiter",
    "pyrate_mp": "pyrate_limiter",
    "limits_fixed_window": "limits",
    "limits_sliding_window_counter": "limits",
    "limits_moving_window": "limits",
    "aiolimiter": "aiolimiter",
}


def test_the_rate_limiter_section(report: dict[str, Any]) -> None:
    part = report["data"]["sections"]["ratelimits"]
    rows = {row["key"]: row for row in part["rows"]}
    installed = {k for k, mod in RATE_PEERS.items() if importlib.util.find_spec(mod)}
    ours = (
        {"fastbreaker", "fastbreaker_shared", "fastbreaker_breaker", "floor_clock"}
        if fastbreaker.COMPILED
        else set()
    )
    assert set(rows) == {"fastbreaker_py"} | ours | installed
    skipped = {s["label"]: s["reason"] for s in part["skipped"]}
    assert len(skipped) == len(RATE_PEERS) - len(installed) + 4 - len(ours)
    assert all(reason for reason in skipped.values())
    for key in installed - {"aiolimiter"}:
        assert isinstance(rows[key]["try_ns"], float) and rows[key]["async_ns"] is None
    assert isinstance(rows["fastbreaker_py"]["try_ns"], float)
    if "aiolimiter" in rows:
        assert rows["aiolimiter"]["try_ns"] is None
        assert isinstance(rows["aiolimiter"]["async_ns"], float)
    out = " ".join(report["proc"].stdout.split())
    assert "rate limiters: ns per admitted call" in out
    assert "every limiter admits 1,000,000,000 units per second" not in out  # --verbose only
    if fastbreaker.COMPILED:
        assert isinstance(rows["fastbreaker"]["hosts_call_ns"], float)
        assert rows["fastbreaker"]["bytes_per_host"] > 0
        assert isinstance(rows["fastbreaker_breaker"]["hosts_call_ns"], float)
        assert "fastbreaker RateLimiter (compiled), from the rate limiter tables:" in out
        assert "try_acquire(): " in out and "CircuitBreaker.allow() (" in out
        assert "RateLimiterMap.try_acquire(key): " in out and "BreakerMap.allow(key) (" in out
        assert "shared-memory try_acquire(): " in out
        assert "the clock floor Floor().now() (" in out
        assert isinstance(rows["floor_clock"]["try_ns"], float)
        whats = [t["what"] for t in report["data"]["targets"]["checks"]]
        assert whats[-4:] == [
            "RateLimiter.try_acquire()",
            "RateLimiterMap.try_acquire(key)",
            "try_acquire() vs clock read",
            "shared try_acquire()",
        ]


def test_rate_limiter_targets_are_ratios_of_two_rows() -> None:
    def row(key: str, **results: float) -> _section.System:
        return _section.System(key, key, "0", {}, {}, {}, results=dict(results))

    fb = row("fastbreaker", allow_ns=10.0, call_ns=30.0)
    floor = row("floor", allow_ns=9.0, call_ns=30.0)
    limits = [
        row("fastbreaker", try_ns=14.0, hosts_call_ns=62.0),
        row("fastbreaker_breaker", try_ns=9.0, hosts_call_ns=40.0),
        row("fastbreaker_shared", try_ns=27.0),
    ]
    targets = _targets.compute_targets([fb, floor], 1.0, {"ratelimits": limits})
    checks = {t["what"]: t for t in targets["checks"]}
    one = checks["RateLimiter.try_acquire()"]
    assert one["x_floor"] == pytest.approx(15.0 / 10.0) and one["met"] is True  # loop included
    per_key = checks["RateLimiterMap.try_acquire(key)"]
    assert per_key["x_floor"] == pytest.approx(63.0 / 41.0) and per_key["met"] is False
    shared = checks["shared try_acquire()"]
    assert shared["x_floor"] == pytest.approx(28.0 / 15.0) and shared["met"] is True
    lines = _targets.target_lines({"targets": targets, "check_targets": True})
    assert any("1.54x BreakerMap.allow(key) (41.0 ns)" in ln and "MISSED" in ln for ln in lines)


def test_tiny_is_a_documented_option() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fastbreaker", "--help"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "--tiny" in text and "smoke run" in text and "numbers mean nothing" in text


def test_a_new_section_is_one_module_and_one_registration() -> None:
    # What a section module holds: its systems and what it measures; registering it is one line.
    from fastbreaker.bench import _registry, _run

    def toy(loop: Any) -> tuple[_section.System | None, str]:
        stmts = {"toy_ns": "x + 1"}
        return _section.System("toy", "toy system", "0", {"x": 1}, stmts, dict(stmts)), ""

    section = _section.Section(
        key="toy",
        systems=[("toy system", toy), ("absent peer", lambda loop: (None, "not installed"))],
        columns=[("toy_ns", "x + 1", "ns")],
        tables=[("toy, {rounds} rounds", ["toy_ns"])],
        baselines={"toy_ns": ("sync", "pass")},
        summary=lambda part: [f"toy rows: {len(part['rows'])}"],
    )
    _registry.SECTIONS.append(section)
    try:
        progress = _run.Progress(sys.stderr, quiet=True)
        result = _run.run_report(quick=True, rounds=1, batch_ms=0.2, hosts=10, progress=progress)
        result["check_targets"] = False
        text = _render.format_text(result)
    finally:
        _registry.SECTIONS.remove(section)
    toy_part = result["sections"]["toy"]
    assert [row["key"] for row in toy_part["rows"]] == ["toy"]
    assert isinstance(toy_part["rows"][0]["toy_ns"], float)
    assert toy_part["skipped"] == [{"label": "absent peer", "reason": "not installed"}]
    assert "toy" not in {row["key"] for row in result["rows"]}  # the first section stays on top
    assert "toy, 1 rounds" in text and "toy rows: 1" in text
    assert "skipped absent peer: not installed" in text
