"""Orchestration: set up every registered section's systems, time them together, collect results.

``run_report()`` returns the structure that ``--json`` writes; ``_render`` turns it into text.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any, Optional, Sequence

from . import _scaling
from ._registry import SECTIONS
from ._section import Section, System
from ._targets import compute_targets
from ._timing import (
    UNROLL,
    Cell,
    af,
    baselines,
    calibrate,
    f,
    make_loop,
    measure_setup,
    time_rounds,
)
from ._verdict import standalone_bytes


class Progress:
    """Progress on stderr: a rewritten status line on a terminal, plain lines otherwise.

    ``transient`` messages (every step) show only on a terminal; ``step`` messages (every round)
    rewrite the status line on a terminal and are printed as lines elsewhere.
    """

    def __init__(self, stream: Any, quiet: bool = False) -> None:
        self.stream = stream
        self.quiet = quiet
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.t0 = time.perf_counter()
        self._pending = False

    def __call__(self, msg: str, *, transient: bool = False, step: bool = False) -> None:
        if self.quiet or (transient and not self.tty):
            return
        text = f"[{time.perf_counter() - self.t0:5.1f}s] {msg}"
        if self.tty and (transient or step):
            self.stream.write("\r\x1b[K" + text)
            self._pending = True
        else:
            if self._pending:
                self.stream.write("\r\x1b[K")
                self._pending = False
            self.stream.write(text + "\n")
        self.stream.flush()


def run_report(
    *,
    quick: bool = False,
    rounds: Optional[int] = None,
    batch_ms: Optional[float] = None,
    hosts: int = 10_000,
    tiny: bool = False,
    progress: Optional[Progress] = None,
) -> dict[str, Any]:
    """Run the benchmark and return the results (the structure written by ``--json``);
    ``tiny``: a smoke run (``--tiny``), whose scaling rows are shrunk too."""
    progress = progress or Progress(sys.stderr)
    rounds = rounds or (9 if quick else 21)
    batch_ms = batch_ms or (8.0 if quick else 25.0)
    threads_before = threading.active_count()
    started = time.perf_counter()
    date = datetime.datetime.now(datetime.timezone.utc)
    loop = asyncio.new_event_loop()
    try:
        result = _run(loop, quick, rounds, batch_ms, hosts, progress)
    finally:
        loop.close()
    if _scaling.unavailable() is None:
        progress("scaling: 1 and 2 threads of the benchmark's own (joined before it goes on)")
    result["scaling"] = _scaling.section(quick, tiny=tiny)
    result["threads"] = {"before": threads_before, "after": threading.active_count()}
    result["date"] = date.isoformat(timespec="seconds")
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def _set_up(
    section: Section, loop: asyncio.AbstractEventLoop
) -> tuple[list[System], list[dict[str, str]]]:
    systems: list[System] = []
    skipped: list[dict[str, str]] = []
    for label, factory in section.systems:
        system, reason = factory(loop)
        if system is None:
            skipped.append({"label": label, "reason": reason})
        else:
            systems.append(system)
    return systems, skipped


def _cells(
    section: Section,
    systems: Sequence[System],
    loop: asyncio.AbstractEventLoop,
    hosts: list[str],
    target_ns: float,
    progress: Progress,
) -> list[Cell]:
    cells = []
    for system in systems:
        ns = dict(system.ns, f=f, af=af, _loop=loop, _hosts=hosts)
        stmts = dict(system.stmts)
        if system.hosts_stmt:
            stmts["hosts_call_ns"] = system.hosts_stmt
        for metric, stmt in stmts.items():
            mode, base_stmt = section.baselines[metric]
            progress(f"calibrating {system.label}: {metric}", transient=True)
            run = make_loop(mode, stmt, ns)
            base = make_loop(mode, base_stmt, ns)
            cell = Cell(system, metric, run, base, len(hosts) if mode == "hosts" else UNROLL)
            cell.n = calibrate(run, target_ns)
            cells.append(cell)
    return cells


def _section_result(
    section: Section, systems: Sequence[System], skipped: list[dict[str, str]]
) -> dict[str, Any]:
    section.derive(systems)
    for system in systems:
        for key, _, _ in section.columns:
            system.results.setdefault(key, None)  # not applicable: null in JSON, "-" in the table
    return {
        "columns": {key: {"header": header, "unit": unit} for key, header, unit in section.columns},
        "rows": [
            {"key": s.key, "label": s.label, "version": s.version, "api": s.api, **s.results}
            for s in systems
        ],
        "skipped": skipped,
    }


def _run(
    loop: asyncio.AbstractEventLoop,
    quick: bool,
    rounds: int,
    batch_ms: float,
    n_hosts: int,
    progress: Progress,
) -> dict[str, Any]:
    progress("setting up: fastbreaker, the floor and the installed peers")
    parts = [(section, *_set_up(section, loop)) for section in SECTIONS]
    every = [system for _, systems, _ in parts for system in systems]

    hosts = [f"host-{i}" for i in range(n_hosts)]  # created before any memory is measured
    with_hosts = [system for system in every if system.build_hosts is not None]
    progress(f"building {n_hosts:,} hosts for {len(with_hosts)} systems (measuring memory)")
    for system in with_hosts:
        assert system.build_hosts is not None
        progress(f"building {n_hosts:,} hosts: {system.label}", transient=True)
        built = measure_setup(system.build_hosts, hosts)
        system.ns.update(built.pop("ns"))
        system.results.update(built)
    standalone = standalone_bytes(parts[0][1], n_hosts)  # the breaker section's rows

    target_ns = batch_ms * 1e6
    progress(f"calibrating: batches of about {batch_ms:g} ms")
    cells = [
        cell
        for section, systems, _ in parts
        for cell in _cells(section, systems, loop, hosts, target_ns, progress)
    ]

    progress(f"timing {len(cells)} cells, {rounds} interleaved rounds")
    time_rounds(cells, rounds, progress)

    baselines_ns = baselines(loop, target_ns)
    for system in every:
        if system.close is not None:
            system.close()
    for cell in cells:
        results = cell.owner.results
        results[cell.metric] = statistics.median(cell.diffs)
        results.setdefault("min", {})[cell.metric] = min(cell.diffs)
        results.setdefault("rounds", {})[cell.metric] = [round(d, 2) for d in cell.diffs]
    (first, first_systems, first_skipped), *rest = parts
    result: dict[str, Any] = {
        "schema": 1,
        "machine": _machine(),
        "versions": _versions(every),
        "method": {
            "statistic": "median over interleaved rounds (ns per operation, baseline subtracted)",
            "rounds": rounds,
            "batch_ms": batch_ms,
            "unroll": UNROLL,
            "hosts": n_hosts,
            "quick": quick,
            "gc": "disabled inside each timed batch (as timeit does); collected between rounds",
            "baselines_ns": baselines_ns,
            "async": "one asyncio loop made by the report; run_until_complete once per batch "
            "of awaits; the same batch around `await af()` is subtracted",
            "memory": "tracemalloc: bytes allocated while building the per-host structure and "
            "making one guarded call per host, divided by the hosts (keys created beforehand)",
        },
        **_section_result(first, first_systems, first_skipped),
        "standalone_bytes": standalone,
        "targets": compute_targets(
            first_systems,
            baselines_ns["loop iteration"],
            {section.key: systems for section, systems, _ in rest},
        ),
    }
    if rest:
        result["sections"] = {
            section.key: _section_result(section, systems, skipped)
            for section, systems, skipped in rest
        }
    return result


def _versions(systems: Sequence[System]) -> dict[str, str]:
    from .. import __version__

    peers = {
        s.key: s.version
        for s in systems
        if not s.key.startswith(("fastbreaker", "floor", "stdlib"))
    }
    return {"python": platform.python_version(), "fastbreaker": __version__, **peers}


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }
