# cython: language_level=3, freethreading_compatible=True
"""Benchmark-only helper: the cheapest possible method call on a Cython class.

``Floor().allow()`` is what any compiled ``allow()`` is measured against: the cost of calling a
method that does nothing. It is shipped so that ``python -m fastbreaker`` and ``benchmarks/`` can
report ratios to the floor measured on the same machine in the same run.
"""

cimport cython
from libc.stdint cimport int64_t


cdef extern from "_fb_atomic.h" nogil:
    int64_t fb_monotonic_ns()


@cython.final
cdef class Floor:
    """An object whose ``allow()``, ``record_success()``, ``call(f)`` and ``with`` / ``async
    with`` blocks do (almost) nothing, and whose ``now()`` only reads the clock."""

    @cython.binding(False)
    def allow(self):
        return True

    @cython.binding(False)
    def now(self):
        """Read the monotonic clock as a rate limiter does (``CLOCK_MONOTONIC``), keep nothing."""
        return fb_monotonic_ns() > 0

    @cython.binding(False)
    def record_success(self, elapsed=None):
        return None

    @cython.binding(False)
    def call(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)

    def __enter__(self):
        return self

    def __exit__(self, et, exc, tb):
        return None

    async def __aenter__(self):
        return self

    async def __aexit__(self, et, exc, tb):
        return None
