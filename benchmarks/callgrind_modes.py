"""Instruction counts of the breaker's modes, for valgrind (steadier than wall time here).

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        python benchmarks/callgrind_modes.py MODE N PATH

MODE is none (the loop alone: subtract it), normal, dry (dry_run=True), count (window=100) or
time (window_seconds=60); PATH is call (``cb.call(f)``) or rec (``allow()`` +
``record_success()``). Divide the difference of two runs' totals by N.
"""

import sys

import fastbreaker as fb

mode = sys.argv[1]
n = int(sys.argv[2])


def f():
    return 1


opts = {
    "normal": {},
    "dry": {"dry_run": True},
    "count": {"window": 100},
    "time": {"window_seconds": 60},
    "none": {},
}[mode]
cb = fb.CircuitBreaker(reset_timeout=3600, **opts)
if sys.argv[3] == "call":
    call = cb.call
    for _ in range(n if mode != "none" else 0):
        call(f)
else:
    allow, rec = cb.allow, cb.record_success
    for _ in range(n if mode != "none" else 0):
        if allow():
            rec()
