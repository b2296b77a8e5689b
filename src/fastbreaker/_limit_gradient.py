"""The ``algorithm="gradient"`` limit: a latency gradient in the style of Netflix's Gradient2.

Plain Python shared by both cores (one lock per limiter; the compiled core calls it with the GIL).
No absolute threshold: each sample compares the short-term round trip with the long-term one.

For each sample ``(rtt, dropped, now, in_flight)`` of a call that started at ``start = now -
rtt``:

* **Stale samples are ignored.** A call that started before the last decrease (``start <
  last_cut``) measured the old limit's queue, so it says nothing about the new one; only fresh
  samples count (one cut per round trip, as in the AIMD; and the baseline is never fed a sample
  from before it was re-measured: the Envoy PR #11579 trap).
* **Long-term RTT** ``baseline``: the lowest fresh round trip seen (the dependency's unloaded
  latency). The first ``WARMUP`` fresh samples only set it. It goes down at once; it goes up only
  when the limit has sat at ``min_limit`` for ``REBASE`` fresh samples that were all still above
  it: at the lowest concurrency the dependency is slower by itself, so the old minimum is stale
  and the window's minimum replaces it (otherwise a dependency that became permanently slower
  would pin the limit at ``min_limit`` for ever).
* **Short-term RTT** ``short``: the sample itself.
* **Gradient** ``g = clamp(TOLERANCE * baseline / short, 0.5, 1.0)``; a drop counts as ``g =
  0.5``.
* **Queue allowance** ``q = sqrt(limit)``: ``target = limit * g + q``. A cut (``target <
  limit``) takes the whole step at once, and only once per round trip (see the stale samples
  above), like AIMD's multiplicative decrease. Growth is spread over a round trip: a round trip
  completes about ``limit`` calls, so each sample moves ``(target - limit) / limit``, and the
  limit grows by about ``q`` per round trip (the additive increase). The result is clamped to
  ``[min_limit, max_limit]``.
* **Growth needs use.** At ``g == 1`` the limit grows only while ``2 * in_flight >= limit``
  (an unused limit is not evidence of capacity).

Why this is bounded (the concurrency-limits PR #134 trap, unbounded growth when the gradient sits
near 0.8): with an allowance that grows like ``sqrt(limit)``, the update has the fixed point
``limit = (q / (1 - g))**2 = 1 / (1 - g)**2`` for any ``g < 1`` (25 at g = 0.8), so a gradient
stuck below 1 cannot push the limit up without bound, unlike an allowance proportional to the
limit. In the simulation of the tests (latency ``base * max(1, in_flight / C)``) the fixed point
is ``limit = C + sqrt(limit)``: 57.6 for C = 50.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Optional

__all__ = ["Gradient"]

TOLERANCE = 1.0
"""How far above the baseline the short-term RTT may be before the limit is cut."""
WARMUP = 10
"""Fresh samples that set the first baseline before the limit moves."""
REBASE = 32
"""Fresh samples at ``min_limit``, all above the baseline, that replace a stale baseline."""


class Gradient:
    """The state of one gradient limiter. ``sample`` changes the core's limit under its lock."""

    __slots__ = ("_lock", "_min", "_max", "baseline", "last_cut", "warm", "floor_n", "floor_min")

    def __init__(self, cfg: Any) -> None:
        self._lock = threading.Lock()
        self._min: float = cfg.min_limit
        self._max: float = cfg.max_limit
        self.baseline: Optional[int] = None
        self.last_cut = -(2**63)
        self.warm = 0
        self.floor_n = 0
        self.floor_min = 0

    def sample(
        self, core: Any, rtt: Optional[int], dropped: bool, now: int, in_flight: int
    ) -> None:
        with self._lock:
            start = now - (rtt or 0)
            if start < self.last_cut:
                return  # stale: started before the last cut
            limit: float = core._get_limit()
            if rtt is not None and (self.baseline is None or rtt < self.baseline):
                self.baseline = rtt
            if self.warm < WARMUP and not dropped:
                self.warm += 1
                return
            if dropped:
                g = 0.5
            elif rtt is None or self.baseline is None:
                return
            else:
                g = min(1.0, max(0.5, TOLERANCE * self.baseline / max(rtt, 1)))
            if g >= 1.0:
                self.floor_n = 0
                if 2 * in_flight < limit:
                    return
            elif limit <= self._min and rtt is not None:
                # At the lowest limit and still above the baseline: is the baseline stale?
                self.floor_min = rtt if self.floor_n == 0 else min(self.floor_min, rtt)
                self.floor_n += 1
                if self.floor_n >= REBASE:
                    self.baseline = self.floor_min
                    self.floor_n = 0
                return
            target = limit * g + math.sqrt(limit)
            if target < limit:
                new = max(self._min, target)  # a cut takes the whole step, once per round trip
            else:
                new = min(self._max, limit + (target - limit) / limit)
            if new < limit:
                self.last_cut = now
            if new != limit:
                core._set_limit(new)
