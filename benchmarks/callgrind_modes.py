"""Instruction counts of the breaker's modes and of `with` blocks, for valgrind (steadier than
wall time on a shared machine).

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python benchmarks/callgrind_modes.py MODE N PATH

MODE is none (the loop alone: subtract it), normal, dry (dry_run=True), count (window=100),
time (window_seconds=60), bulkhead (``Bulkhead(8)``) or shedder (``LoadShedder(Bulkhead(8))``);
PATH is call (``cb.call(f)``), rec (``allow()`` + ``record_success()``) or with (``with x:
f()``; the loop of ``none`` calls ``f()`` too). Divide the difference of two runs' totals by N.
"""

import sys

import fastbreaker as fb

mode, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def f():
    return 1


opts = {"dry": {"dry_run": True}, "count": {"window": 100}, "time": {"window_seconds": 60}}
if mode == "bulkhead":
    guard = fb.Bulkhead(8)
elif mode == "shedder":
    guard = fb.LoadShedder(fb.Bulkhead(8))
else:
    guard = fb.CircuitBreaker(reset_timeout=3600, **opts.get(mode, {}))
if mode == "none":
    for _ in range(n if path == "with" else 0):
        f()
elif path == "with":
    for _ in range(n):
        with guard:
            f()
elif path == "call":
    call = guard.call
    for _ in range(n):
        call(f)
else:
    allow, rec = guard.allow, guard.record_success
    for _ in range(n):
        if allow():
            rec()
