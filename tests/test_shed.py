"""LoadShedder on both cores: admission, queue_full, orders, CoDel, priorities, deadlines,
cancellation exactness, threads, metrics, AdaptiveLimiter samples, validation and memory.

Waiters are asyncio tasks on one loop (their serving order is observable) or threads; tests move
CoDel's sojourn times with a FakeClock and wait for states by yielding, never by sleeping.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
import types
from typing import Any, Optional

import pytest
from memory_support import ameasure_growth, not_on_free_threading

from fastbreaker.testing import FakeClock

LEVELS = ("SHEDDABLE", "SHEDDABLE_PLUS", "CRITICAL", "CRITICAL_PLUS")


def _yield_cpu() -> None:
    """Let other threads run (no timed sleep: nothing waits for a duration)."""
    if hasattr(os, "sched_yield"):
        os.sched_yield()


def until(cond: Any, what: str = "condition", limit_s: float = 10.0) -> None:
    """Yield the CPU until ``cond()`` holds (a safety bound only; no timed sleep)."""
    end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        _yield_cpu()


async def spin(n: int = 10) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


class Jobs:
    """Tasks that enter a shedder, record that they run, and hold their slot until finished."""

    def __init__(self, fb: types.SimpleNamespace, shedder: Any) -> None:
        self.fb = fb
        self.s = shedder
        self.served: list[str] = []
        self.shed: dict[str, str] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def spawn(self, tag: str, level: Optional[str] = None, dl: Any = None) -> asyncio.Task[None]:
        fb = self.fb

        async def job() -> None:
            gate = self.gates[tag] = asyncio.Event()
            try:
                if level is not None:
                    with fb.priority(level):
                        await self._run(tag, gate, dl)
                else:
                    await self._run(tag, gate, dl)
            except fb.LoadShedError as exc:
                assert exc.retry_after >= 0.0 and isinstance(exc.retry_after, float)
                self.shed[tag] = exc.reason

        t = self.tasks[tag] = asyncio.create_task(job())
        return t

    async def _run(self, tag: str, gate: asyncio.Event, dl: Any) -> None:
        if dl is not None:
            with dl:
                async with self.s:
                    self.served.append(tag)
                    await gate.wait()
        else:
            async with self.s:
                self.served.append(tag)
                await gate.wait()

    async def finish(self, tag: str) -> None:
        assert tag in self.served, (tag, self.served)
        self.gates[tag].set()
        await self.tasks[tag]
        await spin()


# --- admission ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["int", "bulkhead", "limiter"])
def test_a_free_slot_admits_at_once(fb: types.SimpleNamespace, kind: str) -> None:
    limit: Any = {
        "int": 2,
        "bulkhead": fb.Bulkhead(2),
        "limiter": fb.AdaptiveLimiter(2, min_limit=1),
    }[kind]
    s = fb.LoadShedder(limit)
    with s:
        with s:
            m = s.metrics()
            assert (m.admitted, m.in_flight, m.queue_len, m.queued) == (2, 2, 0, 0)
    assert s.limit.in_flight == 0
    assert s.call(lambda x: x + 1, 41) == 42
    assert s.metrics().admitted == 3
    if kind != "int":
        assert s.limit is limit


async def test_async_call_and_decorator(fb: types.SimpleNamespace) -> None:
    s = fb.LoadShedder(fb.Bulkhead(1))

    async def double(x: int) -> int:
        return 2 * x

    @s
    async def triple(x: int) -> int:
        return 3 * x

    @s
    def plain(x: int) -> int:
        return x - 1

    assert await s.call_async(double, 4) == 8
    assert await triple(2) == 6
    assert plain(5) == 4
    async with s:
        assert s.limit.in_flight == 1
    assert s.metrics().admitted == 4 and s.limit.in_flight == 0
    with pytest.raises(TypeError, match="generator"):

        @s
        def gen() -> Any:
            yield 1


async def test_queue_full(fb: types.SimpleNamespace) -> None:
    s = fb.LoadShedder(fb.Bulkhead(1), max_queue=2, name="api")
    jobs = Jobs(fb, s)
    for tag in ("hold", "a", "b", "c"):
        jobs.spawn(tag)
        await spin()
    assert jobs.served == ["hold"] and jobs.shed == {"c": "queue_full"}
    m = s.metrics()
    assert (m.queued, m.queue_len, m.shed_queue_full, m.in_flight) == (2, 2, 1, 1)
    with pytest.raises(fb.LoadShedError, match="api") as info:
        with s:
            pass
    assert info.value.reason == "queue_full" and isinstance(info.value, fb.BreakerError)
    for tag in ("hold", "a", "b"):
        await jobs.finish(tag)
    m = s.metrics()
    assert (m.admitted, m.shed_queue_full, m.in_flight, m.queue_len) == (3, 2, 0, 0)


async def test_max_queue_zero_and_queue_timeout_zero_never_wait(fb: types.SimpleNamespace) -> None:
    for opts, reason in (({"max_queue": 0}, "queue_full"), ({"queue_timeout": 0}, "too_old")):
        s = fb.LoadShedder(1, **opts)
        with s:
            with pytest.raises(fb.LoadShedError) as info:
                with s:
                    pass
            assert info.value.reason == reason
        m = s.metrics()
        assert (m.admitted, m.queued, m.in_flight) == (1, 0, 0)


# --- serving order -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("order", "expect"),
    [("fifo", ["a", "b", "c", "d"]), ("lifo", ["d", "c", "b", "a"]), ("adaptive", list("abcd"))],
)
async def test_serving_order(
    fb: types.SimpleNamespace, clock: FakeClock, order: str, expect: list[str]
) -> None:
    s = fb.LoadShedder(fb.Bulkhead(1), order=order, clock=clock)
    jobs = Jobs(fb, s)
    jobs.spawn("hold")
    await spin()
    for tag in "abcd":
        jobs.spawn(tag)
        await spin()
    assert s.metrics().queue_len == 4
    await jobs.finish("hold")
    for _ in range(4):
        await jobs.finish(jobs.served[-1])
    assert jobs.served[1:] == expect
    assert not s.metrics().congested  # healthy: no time passed


async def test_release_hands_the_slot_to_the_waiter_not_a_newcomer(
    fb: types.SimpleNamespace,
) -> None:
    bh = fb.Bulkhead(1)
    s = fb.LoadShedder(bh)
    jobs = Jobs(fb, s)
    jobs.spawn("hold")
    await spin()
    jobs.spawn("waiter")
    await spin()
    jobs.gates["hold"].set()
    await jobs.tasks["hold"]
    # the slot moved to the waiter before anyone else could run: a newcomer finds none free
    assert bh.in_flight == 1 and not bh.try_acquire()
    with pytest.raises(fb.LoadShedError):
        with fb.LoadShedder(bh, max_queue=0):
            pass
    await spin()
    assert jobs.served == ["hold", "waiter"]
    await jobs.finish("waiter")
    assert bh.in_flight == 0


# --- CoDel --------------------------------------------------------------------------------------


async def test_codel_enters_drops_too_old_and_serves_newest_while_congested(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    s = fb.LoadShedder(fb.Bulkhead(1), queue_timeout=60, clock=clock)
    jobs = Jobs(fb, s)
    jobs.spawn("hold")
    await spin()
    for tag in "abcde":
        jobs.spawn(tag)
        await spin()
    clock.advance(0.05)  # every waiter is above the 5 ms target...
    await jobs.finish("hold")  # ...first_above_time = now + interval: not yet congested
    assert jobs.served == ["hold", "a"] and not s.metrics().congested
    clock.advance(0.1)  # above the target for a whole interval
    await jobs.finish("a")
    m = s.metrics()
    assert m.congested and m.shed_too_old == 1 and jobs.shed == {"b": "too_old"}
    assert jobs.served[-1] == "e"  # LIFO while congested: the newest first
    await jobs.finish("e")  # before drop_next: no drop, the newest again
    assert jobs.served[-1] == "d" and s.metrics().shed_too_old == 1
    clock.advance(0.1)  # drop_next = entry + interval / sqrt(1)
    await jobs.finish("d")
    m = s.metrics()
    assert jobs.shed == {"b": "too_old", "c": "too_old"}
    assert (m.shed_too_old, m.queue_len, m.in_flight, m.congested) == (2, 0, 0, False)
    assert m.admitted == 4 and m.queued == 5


async def test_codel_leaves_when_a_dequeue_sees_a_short_sojourn(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    s = fb.LoadShedder(fb.Bulkhead(1), order="fifo", queue_timeout=60, clock=clock)
    jobs = Jobs(fb, s)
    jobs.spawn("hold")
    await spin()
    for tag in "abcd":
        jobs.spawn(tag)
        await spin()
    clock.advance(0.05)
    await jobs.finish("hold")
    clock.advance(0.1)
    await jobs.finish("a")  # enters drop state: drops b, serves c (FIFO)
    assert s.metrics().congested and jobs.served[-1] == "c" and jobs.shed == {"b": "too_old"}
    # SHEDDABLE requests are not queued while congested; others still are
    jobs.spawn("low", "SHEDDABLE")
    await spin()
    assert jobs.shed["low"] == "priority" and s.metrics().queue_len == 1
    with pytest.raises(fb.LoadShedError) as info, fb.priority("SHEDDABLE"):
        with s:
            pass
    assert info.value.retry_after == 0.1  # codel_interval while congested
    jobs.tasks["d"].cancel()
    await spin()
    jobs.spawn("fresh")
    await spin()
    await jobs.finish("c")  # the head waited 0 s < target: CoDel leaves drop state
    m = s.metrics()
    assert not m.congested and jobs.served[-1] == "fresh"
    assert (m.shed_priority, m.shed_too_old) == (2, 1)
    await jobs.finish("fresh")
    m = s.metrics()
    assert (m.in_flight, m.queue_len, m.congested) == (0, 0, False)


async def test_queue_timeout_while_healthy(fb: types.SimpleNamespace, clock: FakeClock) -> None:
    s = fb.LoadShedder(fb.Bulkhead(1), queue_timeout=0.02, clock=clock)
    jobs = Jobs(fb, s)
    jobs.spawn("hold")
    await spin()
    jobs.spawn("a")
    await spin()
    clock.advance(0.03)  # the waiter's own bounded wait re-checks and finds itself too old
    await asyncio.wait_for(jobs.tasks["a"], 10)
    m = s.metrics()
    assert jobs.shed == {"a": "too_old"} and (m.shed_too_old, m.queue_len) == (1, 0)
    assert not m.congested
    await jobs.finish("hold")
    assert s.metrics().in_flight == 0


# --- priorities ---------------------------------------------------------------------------------


async def test_full_queue_displaces_the_lowest_priority_most_recent(
    fb: types.SimpleNamespace,
) -> None:
    s = fb.LoadShedder(fb.Bulkhead(1), max_queue=3)
    jobs = Jobs(fb, s)
    jobs.spawn("hold")
    await spin()
    jobs.spawn("p1", "SHEDDABLE_PLUS")
    jobs.spawn("s1", "SHEDDABLE")
    jobs.spawn("s2", "SHEDDABLE")
    await spin()
    jobs.spawn("c1", "CRITICAL")
    await spin()
    assert jobs.shed == {"s2": "priority"}  # the lowest, most recent
    jobs.spawn("s3", "SHEDDABLE")  # not more important than anyone: refused
    await spin()
    assert jobs.shed["s3"] == "queue_full"
    jobs.spawn("p2", "SHEDDABLE_PLUS")  # displaces s1, the only SHEDDABLE left
    await spin()
    assert jobs.shed["s1"] == "priority"
    m = s.metrics()
    assert (m.shed_priority, m.shed_queue_full, m.queue_len) == (2, 1, 3)
    await jobs.finish("hold")
    while len(jobs.served) < 4:
        await jobs.finish(jobs.served[-1])
    await jobs.finish(jobs.served[-1])
    assert jobs.served == ["hold", "c1", "p1", "p2"]
    assert s.metrics().in_flight == 0


async def test_serving_picks_the_highest_priority_first(fb: types.SimpleNamespace) -> None:
    for order in ("fifo", "lifo", "adaptive"):
        s = fb.LoadShedder(fb.Bulkhead(1), order=order)
        jobs = Jobs(fb, s)
        jobs.spawn("hold")
        await spin()
        for tag, level in (("s", "SHEDDABLE"), ("c1", "CRITICAL"), ("p", "CRITICAL_PLUS")):
            jobs.spawn(tag, level)
            await spin()
        jobs.spawn("c2")  # no priority set: CRITICAL
        await spin()
        await jobs.finish("hold")
        while len(jobs.served) < 5:
            await jobs.finish(jobs.served[-1])
        await jobs.finish(jobs.served[-1])
        within = ["c1", "c2"] if order != "lifo" else ["c2", "c1"]
        assert jobs.served == ["hold", "p", *within, "s"], order


# --- deadlines ----------------------------------------------------------------------------------


async def test_a_queued_request_is_dropped_when_its_deadline_passes(
    fb: types.SimpleNamespace,
) -> None:
    s = fb.LoadShedder(fb.Bulkhead(1), queue_timeout=30)
    jobs = Jobs(fb, s)
    jobs.spawn("hold")
    await spin()
    t0 = time.monotonic()
    jobs.spawn("late", dl=fb.deadline(0.05))
    await asyncio.wait_for(jobs.tasks["late"], 10)  # its own bounded wait ends it, no timer
    assert 0.04 <= time.monotonic() - t0 < 5
    m = s.metrics()
    assert jobs.shed == {"late": "deadline"} and (m.shed_deadline, m.queue_len) == (1, 0)
    await jobs.finish("hold")
    assert jobs.served == ["hold"] and s.metrics().in_flight == 0


async def test_a_waiter_past_its_deadline_is_never_run(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    s = fb.LoadShedder(fb.Bulkhead(1), queue_timeout=30, clock=clock)
    jobs = Jobs(fb, s)
    jobs.spawn("hold")
    await spin()
    jobs.spawn("late", dl=fb.deadline(0.5, clock=clock))
    jobs.spawn("other")
    await spin()
    clock.advance(0.6)
    await jobs.finish("hold")  # the serve drops "late" at once and hands the slot on
    assert jobs.shed == {"late": "deadline"} and jobs.served == ["hold", "other"]
    await jobs.finish("other")
    m = s.metrics()
    assert (m.shed_deadline, m.admitted, m.in_flight) == (1, 2, 0)


def test_refused_when_no_time_remains(fb: types.SimpleNamespace, clock: FakeClock) -> None:
    s = fb.LoadShedder(fb.Bulkhead(2), clock=clock)
    with fb.deadline(0.1, clock=clock):
        with s:
            pass
        clock.advance(0.1)
        with pytest.raises(fb.LoadShedError) as info:
            with s:
                raise AssertionError("ran past its deadline")
        assert info.value.reason == "deadline" and info.value.retry_after >= 0
    m = s.metrics()
    assert (m.admitted, m.shed_deadline, m.in_flight) == (1, 1, 0)


# --- cancellation, timeouts and threads ------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
async def test_thousands_of_cancelled_and_timed_out_waiters_balance(
    fb: types.SimpleNamespace, seed: int
) -> None:
    """3,000 queued tasks: every fifth has a 20 ms deadline (it times out in its own bounded
    wait, or the serve drops it), random others are cancelled at random points (waiting, being
    handed a slot, running), the rest are served. Deadline tasks are never cancelled, so each
    task ends in exactly one of: admitted, shed, cancelled before admission."""
    rng = random.Random(seed)
    n = 3000
    # CoDel out of reach (a 10 s target): no drop may race a cancellation
    s = fb.LoadShedder(
        fb.Bulkhead(8), max_queue=n, queue_timeout=30, codel_target=10, codel_interval=20
    )
    entered: set[int] = set()
    shed: list[str] = []

    async def job(i: int) -> None:
        try:
            if i % 5 == 0:
                with fb.deadline(0.02):
                    async with s:
                        entered.add(i)
                        await asyncio.sleep(0)
            else:
                async with s:
                    entered.add(i)
                    for _ in range(rng.randrange(3)):
                        await asyncio.sleep(0)
        except fb.LoadShedError as exc:
            shed.append(exc.reason)

    tasks = [asyncio.create_task(job(i)) for i in range(n)]
    pending = [t for i, t in enumerate(tasks) if i % 5]
    while pending:
        for _ in range(rng.randrange(1, 4)):
            await asyncio.sleep(0)
        for t in rng.sample(pending, min(len(pending), rng.randrange(0, 12))):
            t.cancel()
        pending = [t for t in pending if not t.done()]
    await asyncio.gather(*tasks, return_exceptions=True)
    m = s.metrics()
    cancelled = sum(1 for i, t in enumerate(tasks) if t.cancelled() and i not in entered)
    print(f"\n[shed storm {fb.impl} seed={seed}] {m} cancelled={cancelled}")
    assert (m.in_flight, m.queue_len) == (0, 0)
    assert m.admitted == len(entered)
    total_shed = m.shed_queue_full + m.shed_too_old + m.shed_priority + m.shed_deadline
    assert total_shed == len(shed) == m.shed_deadline
    assert m.admitted + total_shed + cancelled == n
    assert cancelled > 100 and m.queued > 1000 and m.admitted > 100 and m.shed_deadline > 10
    async with s:  # still fully usable
        assert s.metrics().in_flight == 1


async def test_a_slot_handed_to_a_cancelled_waiter_is_passed_on(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1)
    s = fb.LoadShedder(bh)
    for _ in range(500):
        s.__enter__()
        t1 = asyncio.create_task(s.call_async(asyncio.sleep, 0))
        t2 = asyncio.create_task(s.call_async(asyncio.sleep, 0))
        await spin(2)
        assert s.metrics().queue_len == 2
        s.__exit__(None, None, None)  # hand the slot to t1...
        t1.cancel()  # ...which gives up before it runs: t2 gets it
        await asyncio.gather(t1, t2, return_exceptions=True)
        assert t1.cancelled() and t2.done() and not t2.cancelled()
        assert (bh.in_flight, s.metrics().queue_len) == (0, 0)
    assert s.metrics().admitted == 1000


def test_threads_never_exceed_the_limit(fb: types.SimpleNamespace) -> None:
    s = fb.LoadShedder(fb.Bulkhead(2), max_queue=16, queue_timeout=5)
    lock = threading.Lock()
    state = {"now": 0, "peak": 0, "in": 0, "shed": 0}
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        for i in range(200):
            try:
                with s:
                    with lock:
                        state["now"] += 1
                        state["in"] += 1
                        state["peak"] = max(state["peak"], state["now"])
                    for _ in range(i % 3):
                        _yield_cpu()
                    with lock:
                        state["now"] -= 1
            except fb.LoadShedError:
                with lock:
                    state["shed"] += 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m = s.metrics()
    print(f"\n[shed threads {fb.impl}] {state} {m}")
    assert state["peak"] <= 2 and state["peak"] >= 1
    assert (m.in_flight, m.queue_len) == (0, 0)
    assert m.admitted == state["in"] and state["in"] + state["shed"] == 1600


def test_a_thread_waits_and_is_handed_the_slot(fb: types.SimpleNamespace) -> None:
    s = fb.LoadShedder(fb.Bulkhead(1), queue_timeout=30)
    got: list[int] = []
    s.__enter__()
    t = threading.Thread(target=lambda: got.append(s.call(lambda: s.limit.in_flight)))
    t.start()
    until(lambda: s.metrics().queue_len == 1, "the thread to queue")
    s.__exit__(None, None, None)
    t.join()
    assert got == [1] and s.metrics().in_flight == 0 and s.metrics().admitted == 2


# --- metrics, AdaptiveLimiter, validation ------------------------------------------------------


def test_metrics_is_an_immutable_named_tuple(fb: types.SimpleNamespace) -> None:
    m = fb.LoadShedder(3).metrics()
    assert isinstance(m, fb.ShedderMetrics) and isinstance(m, tuple)
    assert fb.ShedderMetrics._fields == (
        "admitted",
        "queued",
        "shed_queue_full",
        "shed_too_old",
        "shed_priority",
        "shed_deadline",
        "in_flight",
        "queue_len",
        "congested",
    )
    assert m == (0, 0, 0, 0, 0, 0, 0, 0, False)
    with pytest.raises(AttributeError):
        m.admitted = 1  # type: ignore[misc]


async def test_the_adaptive_limiter_receives_rtt_samples(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    lim = fb.AdaptiveLimiter(4, min_limit=1, max_limit=10, rtt_threshold=0.1, clock=clock)
    s = fb.LoadShedder(lim, clock=clock)
    with s:
        clock.advance(0.5)  # a slow round trip: the limit decreases
    assert lim.limit == pytest.approx(3.6) and lim.in_flight == 0

    async def held() -> None:
        await asyncio.sleep(0)

    for _ in range(3):  # fast round trips at full use: the limit grows
        with s, s, s:
            clock.advance(0.01)
    assert lim.limit > 3.6

    # through the queue: a waiter is served after a release that carried a sample
    small = fb.AdaptiveLimiter(1, min_limit=1, max_limit=1, rtt_threshold=0.1, clock=clock)
    s2 = fb.LoadShedder(small, clock=clock)
    jobs = Jobs(fb, s2)
    jobs.spawn("hold")
    await spin()
    jobs.spawn("w")
    await spin()
    await jobs.finish("hold")
    assert jobs.served == ["hold", "w"]
    await jobs.finish("w")
    assert small.in_flight == 0 and s2.metrics().admitted == 2

    with pytest.raises(TimeoutError):
        with s:
            clock.advance(0.01)
            raise TimeoutError  # a drop: the limiter's drop_on
    assert lim.in_flight == 0


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"limit": 0}, ValueError, r"limit must be an int in \[1, "),
        ({"limit": True}, TypeError, "limit must be an int"),
        ({"limit": "4"}, TypeError, "limit must be an int .* Bulkhead or an AdaptiveLimiter"),
        ({"max_queue": -1}, ValueError, r"max_queue must be in \[0, "),
        ({"max_queue": 1.5}, TypeError, r"max_queue must be an int in \[0, "),
        (
            {"queue_timeout": -1},
            ValueError,
            "queue_timeout must be a finite number of seconds >= 0",
        ),
        ({"codel_target": 0}, ValueError, "codel_target must be a finite number of seconds > 0"),
        ({"codel_interval": -1}, ValueError, "codel_interval must be a finite number .* > 0"),
        ({"codel_target": 0.1}, ValueError, r"codel_target must be < codel_interval \(0.1\)"),
        ({"codel_target": 0.2}, ValueError, "codel_target must be < codel_interval"),
        ({"order": "random"}, ValueError, "order must be one of .*fifo.*lifo.*adaptive"),
        ({"order": 1}, TypeError, "order must be one of"),
        ({"name": 3}, TypeError, "name must be a str or None"),
        ({"clock": 5}, TypeError, "clock must be None or a zero-argument callable"),
    ],
)
def test_validation_names_the_parameter(
    fb: types.SimpleNamespace, kwargs: dict[str, Any], exc: type[Exception], match: str
) -> None:
    args = {"limit": 2, **kwargs}
    with pytest.raises(exc, match=match):
        fb.LoadShedder(args.pop("limit"), **args)


def test_load_shed_error_is_neutral_and_never_retried(fb: types.SimpleNamespace) -> None:
    breaker = fb.CircuitBreaker(failure_threshold=1)
    s = fb.LoadShedder(1, max_queue=0)
    with s:
        for _ in range(3):
            with pytest.raises(fb.LoadShedError):
                with breaker:
                    with s:
                        pass
    assert breaker.state == fb.State.CLOSED


# --- memory -------------------------------------------------------------------------------------


@not_on_free_threading
async def test_long_runs_of_queued_and_shed_requests_do_not_grow_memory(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    s = fb.LoadShedder(fb.Bulkhead(1), max_queue=3, queue_timeout=30, clock=clock)

    async def one() -> None:
        await asyncio.sleep(0)

    async def step() -> None:
        s.__enter__()
        tasks = [asyncio.create_task(s.call_async(one)) for _ in range(3)]
        await spin(2)
        with fb.priority("CRITICAL_PLUS"):
            tasks.append(asyncio.create_task(s.call_async(one)))  # displaces one
        tasks.append(asyncio.create_task(s.call_async(one)))  # queue_full
        await spin(2)
        tasks[1].cancel()
        clock.advance(0.001)
        s.__exit__(None, None, None)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def measure(n: int) -> int:
        return await ameasure_growth(step, n, warmup=100)

    small, large = await measure(200), await measure(1400)
    per = (large - small) / 1200
    print(f"\n[shed memory {fb.impl}] {small} B after 200 rounds, {large} B after 1400")
    assert per < 8, f"memory grows with the work: {per:.1f} B/round"
    m = s.metrics()
    assert (m.in_flight, m.queue_len) == (0, 0)
    assert sum(len(d) for d in s._levels) == 0  # type: ignore[attr-defined]
    assert m.shed_priority > 0 and m.shed_queue_full > 0
