"""Shared by the pytest-benchmark files.

    python -m pytest benchmarks --benchmark-enable              # measure (compare within a group)
    python -m pytest benchmarks --benchmark-disable             # CI: run each once, so none rots

* ``bench_*.py`` files are collected when the directory is given (pytest's default pattern only
  collects ``test_*.py``); a file named on the command line is collected by pytest itself.
* ``fb``: the fastbreaker API bound to one core, ids ``c`` and ``python`` (as in
  ``tests/conftest.py``); with ``FASTBREAKER_NO_EXTENSIONS`` set only ``python`` runs.
* ``floor``: the benchmark floor, ``Floor()`` from ``_floor_c`` (an empty method call on a
  Cython class); skipped in a pure-Python build.
* ``drive``: ``drive(make_coro)`` runs a coroutine that never suspends to completion without an
  event loop, so that async benchmarks measure the wrappers and not asyncio's scheduler.
"""

from __future__ import annotations

import fnmatch
import types
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Optional

import pytest

import fastbreaker

NAMESPACES = fastbreaker.testing.implementations()
IMPLS = list(NAMESPACES)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Optional[pytest.Module]:
    if file_path.suffix != ".py" or not file_path.name.startswith("bench_"):
        return None
    if parent.session.isinitpath(file_path):
        return None  # named on the command line: pytest collects it already
    if any(fnmatch.fnmatch(file_path.name, pat) for pat in parent.config.getini("python_files")):
        return None  # the configured pattern covers it already
    return pytest.Module.from_parent(parent, path=file_path)


@pytest.fixture(params=IMPLS)
def fb(request: pytest.FixtureRequest) -> types.SimpleNamespace:
    """The fastbreaker API bound to one implementation (ids ``c`` and ``python``)."""
    return NAMESPACES[request.param]


@pytest.fixture
def floor() -> Any:
    """``Floor()``: what a compiled ``allow()`` is measured against."""
    if not fastbreaker.COMPILED:
        pytest.skip("the floor is compiled; this is a pure-Python run")
    from fastbreaker.bench._floor_c import Floor

    return Floor()


def _drive(make_coro: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    coro = make_coro()
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError(f"{make_coro!r} suspended: drive() only runs coroutines that never wait")


@pytest.fixture
def drive() -> Callable[[Callable[[], Coroutine[Any, Any, Any]]], Any]:
    """``drive(make_coro)``: run ``make_coro()`` to the end without a loop (it must not suspend)."""
    return _drive
