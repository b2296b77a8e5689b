"""What a section of the report is: the systems it compares and what it measures about each.

A section (``_breakers.SECTION`` is the first) lists its systems as factories, each returning a
``System`` (how to drive one library through its documented API) or the reason it is skipped,
and says which statements it times, against which baselines, and how its tables read. The
helpers below are for writing such factories; peers are optional, so nothing is imported here.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Mapping, Optional, Sequence

from ._format import fmt, ratio, times
from ._timing import f


@dataclass
class System:
    """One row: how to drive a library through its documented API."""

    key: str
    label: str
    version: str
    ns: dict[str, Any]
    stmts: dict[str, str]  # metric -> statement; missing metrics are not applicable
    api: dict[str, str]  # metric -> what the statement does, for the reader
    build_hosts: Optional[Callable[[list[str]], dict[str, Any]]] = None
    hosts_stmt: str = ""  # timed once per host as the metric "hosts_call_ns"
    results: dict[str, Any] = field(default_factory=dict)
    # called once everything is timed: stops what a peer started (PyrateLimiter's leak thread)
    close: Optional[Callable[[], None]] = None


Factory = Callable[[asyncio.AbstractEventLoop], tuple[Optional[System], str]]


def _nothing(systems: Sequence[System]) -> None:
    return None


def _no_lines(result: Mapping[str, Any]) -> list[str]:
    return []


@dataclass(frozen=True)
class Section:
    """One part of the report; registered in ``_registry.SECTIONS``."""

    key: str
    # (label, factory) in row order; the label names a system that is skipped
    systems: Sequence[tuple[str, Factory]]
    # (key, table header, unit) of every column, in table order
    columns: Sequence[tuple[str, str, str]]
    # (title, column keys) per printed table; titles are formatted with ``rounds`` and ``hosts``
    tables: Sequence[tuple[str, Sequence[str]]]
    # metric -> (loop mode, baseline statement subtracted from it); see ``_timing.make_loop``
    baselines: Mapping[str, tuple[str, str]]
    # fills the columns computed from the medians (ratios)
    derive: Callable[[Sequence[System]], None] = _nothing
    # lines under the tables, from the section's result (``rows``, ``skipped``)
    summary: Callable[[Mapping[str, Any]], list[str]] = _no_lines
    # how the columns are measured, from the whole result (``method``)
    notes: Callable[[Mapping[str, Any]], list[str]] = _no_lines
    # bar chart panels: (metric, title, reference row key, what the ratio is to)
    panels: Sequence[tuple[str, str, str, str]] = ()

    def header(self, key: str) -> str:
        return next(header for k, header, _ in self.columns if k == key)


def version(dist: str) -> str:
    """The installed version of ``dist``, or ``?``."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def peer(name: str) -> Any:
    """The peer's module, or None when it is not installed (peers are optional)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def unlinked_region(name: str, size: int = 1 << 16) -> Any:
    """A ``SharedRegion`` of the compiled core, unlinked at once: this process's mapping stays,
    nothing is left in /dev/shm. (POSIX only: check ``sys.platform`` first.)"""
    from .._region import region_class

    region = region_class("c")(f"fbbench-{name}-{os.getpid()}", size=size)
    region.unlink()
    return region


def expect_raises(fn: Callable[[], Any], exc: type[BaseException], what: str) -> None:
    """Check a setup step (a tripped breaker really rejects) before anything is timed."""
    try:
        fn()
    except exc:
        return
    raise RuntimeError(f"benchmark setup: {what} did not raise {exc.__name__}")


def dict_of(make: Callable[[], Any]) -> Callable[[list[str]], dict[str, Any]]:
    """``build_hosts`` for a peer kept as a dict of breakers, one ``make()`` per host."""

    def build_hosts(hosts: list[str]) -> dict[str, Any]:
        d = {h: make() for h in hosts}
        for h in hosts:
            d[h].call(f)
        return {"d": d}

    return build_hosts


def summary_lines(
    result: Mapping[str, Any],
    *,
    title: str,
    missing: str,
    floors: Sequence[tuple[str, str, str]],
    others_header: str,
    peer_ratios: Sequence[tuple[str, str]],
) -> list[str]:
    """What a section's reader came for: fastbreaker's row against the floor row, then each other
    row's cost as a multiple of fastbreaker's. ``floors`` is ``(metric, what, the floor's
    operation)``; ``peer_ratios`` is ``(metric, what)``."""
    rows = {row["key"]: row for row in result["rows"]}
    fb, floor = rows.get("fastbreaker"), rows.get("floor")
    if fb is None:
        return [missing]
    out = [title]
    if floor is not None:
        for key, what, floor_what in floors:
            out.append(
                f"  {what}: {fmt(key, fb[key])} ns = {times(ratio(fb[key], floor[key]))} "
                f"the floor {floor_what} ({fmt(key, floor[key])} ns)"
            )
    others = [r for r in result["rows"] if r["key"] not in ("fastbreaker", "floor")]
    if others:
        out.append(others_header)
    for row in others:
        cells = []
        for key, what in peer_ratios:
            r = ratio(row.get(key), fb.get(key))
            if r is not None:
                cells.append(f"{what} {times(r)}")
        out.append(f"    {row['label']}: {', '.join(cells) or 'n/a'}")
    return out
