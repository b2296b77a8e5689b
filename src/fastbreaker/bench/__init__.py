"""The headline benchmark behind ``python -m fastbreaker``: fastbreaker against every peer.

One run measures, on this machine and in this process, what a guarded call costs with the
compiled core, its pure-Python twin, each installed peer (pybreaker, circuitbreaker, aiobreaker,
purgatory: ``pip install 'fastbreaker[bench]'``) and the floor (an empty method call on a Cython
class), and prints one table.

How it measures (printed above the tables with ``--verbose``, and stored in ``--json``):

* Each cell is a loop of ``n`` x 10 unrolled statements timed with ``time.perf_counter_ns``,
  minus the same loop around the baseline statement (``pass``, ``f()`` or ``await af()``) with
  the same ``n``, divided by the number of statements. ``n`` is calibrated once per cell so that
  a batch takes about ``--batch-ms``.
* Rounds are interleaved: every round times every cell once (baseline right before the cell, the
  order rotated each round), so a noisy moment hits every row alike. The table shows the median
  over rounds; the JSON also has the minimum and every round.
* The garbage collector is disabled inside each timed batch (as ``timeit`` does, which if
  anything flatters the allocating peers) and a collection runs between rounds.
* asyncio peers are driven through their async API inside one event loop created by the report:
  ``loop.run_until_complete()`` runs once per batch, and the same batch around ``await af()`` is
  subtracted, so the loop's cost is not charged to anyone.
* 10,000 hosts: one structure per system holding a breaker per host, keys created beforehand,
  one guarded call per host round-robin; bytes per host are what ``tracemalloc`` sees allocated
  while the structure is built (and one call made per host), divided by the number of hosts.
* Nothing here starts a thread: ``threading.active_count()`` is shown before and after.

Only the standard library is imported at module level; peers and matplotlib are imported when
the report runs, and each is optional.

The modules, one job each: ``_timing`` (the timed loops, calibration, interleaved rounds),
``_section`` (what a section is: its systems and measurements), ``_breakers`` (the breaker
section: fastbreaker, the floor and each peer), ``_bulkheads`` (the bulkhead section: Bulkhead
against the floor, the standard library's semaphores, anyio and pyresilience), ``_registry``
(the list of sections),
``_run`` (orchestration), ``_targets`` (the developers' targets), ``_format`` and ``_render``
(text, Markdown, chart), ``_cli`` (the options); ``_floor_c`` is the compiled floor.
"""

from ._cli import main
from ._run import run_report

__all__ = ["main", "run_report"]
