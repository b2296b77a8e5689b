"""What the shared rate limiter tests run in other processes (module-level, for ``spawn``)."""

from __future__ import annotations

from typing import Any

import region_support as rs

RATES = ("100/h", "60/h")  # the loose rate is charged first: the tight one refuses


def hammer(core: str, name: str, clock: Any, n: int, q: Any) -> None:
    """``n`` try_acquire() on the shared limiter ``"api"``; puts the number admitted."""
    lim = rs.region(core, name, clock).rate_limiter("api", *RATES)
    q.put(sum(lim.try_acquire() for _ in range(n)))


MAP_KEYS = ("k0", "k1", "k2", "k3")


def hammer_map(core: str, name: str, clock: Any, n: int, worker: int, q: Any) -> None:
    """``n`` rounds of try_acquire() on every key of the shared map ``"api"``, in an order of
    this worker's; worker 0 advances the clock by 1 s every 10 rounds. Puts admitted per key."""
    import random

    m = rs.region(core, name, clock).rate_limiter_map("api", *RATES, capacity=8)
    rnd = random.Random(worker)
    got = dict.fromkeys(MAP_KEYS, 0)
    keys = list(MAP_KEYS)
    for i in range(n):
        rnd.shuffle(keys)
        for k in keys:
            got[k] += m.try_acquire(k)
        if worker == 0 and n > 1000 and i % 10 == 0:
            clock.advance(1.0)
    q.put(got)


def churn_map(core: str, name: str, clock: Any, seed: int) -> None:
    """try_acquire() over 24 keys on an 8-slot map until killed: insertions and evictions."""
    import random

    m = rs.region(core, name, clock).rate_limiter_map("m", *RATES, capacity=8)
    rnd = random.Random(seed)
    while True:
        m.try_acquire(f"k{rnd.randrange(24)}")
        if rnd.random() < 0.05:
            clock.advance(1.0)
