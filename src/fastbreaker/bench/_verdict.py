"""The report's last lines: fastbreaker's own figures, where a reader's eye lands when it ends.

Also measures one of them: the bytes of a standalone ``CircuitBreaker`` (tracemalloc, as many
breakers as the report has hosts), which no table holds.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any, Mapping, Sequence

from ._format import fmt, ratio, times
from ._section import System


def standalone_bytes(systems: Sequence[System], n: int) -> dict[str, float]:
    """Bytes per ``CircuitBreaker()`` (default options, the list slot included) for the
    fastbreaker rows with default options: ``n`` of them built under tracemalloc."""
    out = {}
    for system in systems:
        if system.key not in ("fastbreaker", "fastbreaker_py"):
            continue
        cls = type(system.ns["cb"])
        gc.collect()
        was_tracing = tracemalloc.is_tracing()
        if not was_tracing:
            tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        kept = [cls() for _ in range(n)]
        after = tracemalloc.get_traced_memory()[0]
        if not was_tracing:
            tracemalloc.stop()
        del kept
        out[system.key] = (after - before) / n
    return out


def verdict_lines(result: Mapping[str, Any]) -> list[str]:
    """fastbreaker's figures of this run, compiled core if measured, else the twin's."""
    rows = {row["key"]: row for row in result["rows"]}
    key = "fastbreaker" if "fastbreaker" in rows else "fastbreaker_py"
    fb, floor = rows.get(key), rows.get("floor") or {}
    if fb is None:
        return []
    m, mach, th = result["method"], result["machine"], result["threads"]
    took = result.get("seconds")
    when = f" in {took:.0f} s" if took is not None else ""
    out = [
        f"Verdict: {fb['label']}, fastbreaker {result['versions']['fastbreaker']}, "
        f"this run{when} on {mach['cpus']} CPUs:"
    ]
    for metric, what, floor_what in (
        ("allow_ns", "allow() in CLOSED", "Floor().allow()"),
        ("call_ns", "call(f)-f()", "Floor().call(f)-f()"),
    ):
        if fb.get(metric) is None:
            continue
        line = f"  {what}: {fmt(metric, fb[metric])} ns"
        if floor.get(metric) is not None:
            line += f" = {times(ratio(fb[metric], floor[metric]))} the floor {floor_what}"
        out.append(line)
    if fb.get("hosts_call_ns") is not None:
        out.append(
            f"  {m['hosts']:,} hosts, m.call(host, f): {fmt('hosts_call_ns', fb['hosts_call_ns'])}"
            f" ns per call, {fmt('bytes_per_host', fb['bytes_per_host'])} bytes per host"
        )
    standalone = result.get("standalone_bytes", {}).get(key)
    if standalone is not None:
        out.append(
            f"  one CircuitBreaker(): {standalone:,.0f} bytes (tracemalloc, {m['hosts']:,} of them)"
        )
    out.append(
        f"  threads: {th['before']} before, {th['after']} after "
        f"({'none started' if th['before'] == th['after'] else 'CHANGED'})"
    )
    return out
