"""What the shared rate limiter tests run in other processes (module-level, for ``spawn``)."""

from __future__ import annotations

from typing import Any

import region_support as rs

RATES = ("100/h", "60/h")  # the loose rate is charged first: the tight one refuses


def hammer(core: str, name: str, clock: Any, n: int, q: Any) -> None:
    """``n`` try_acquire() on the shared limiter ``"api"``; puts the number admitted."""
    lim = rs.region(core, name, clock).rate_limiter("api", *RATES)
    q.put(sum(lim.try_acquire() for _ in range(n)))
