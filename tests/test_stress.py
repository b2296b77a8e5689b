"""Stress tests: threads that really run in parallel must not break the core's invariants.

The C-level hammers drive one breaker and one budget through the nogil C API from several Python
threads, each inside a ``with nogil:`` loop (see ``capi_ext/fb_capi_client.pyx``), so they run in
parallel on every build, GIL or not. Every thread logs what it did; the checks run afterwards:

* every state change is claimed by exactly one caller: the generations the callers report are
  1..final, each once, and they chain (each change starts in the state the previous one made);
* each trip is observed once: changes into OPEN == ``metrics().opened``;
* a half-open episode admits at most ``half_open_max_calls`` probes;
* a reader that sees OPEN never sees a trip time older than that OPEN's own;
* every admitted call is accounted for: permitted == successes + failures + ignored + stale
  (+ the probes deliberately never reported back), and the breaker never stays stuck;
* budget tokens are conserved: deposits - withdrawals (+ accrual) == change, within rounding.

The negative control runs the same hammers against a copy of the core compiled with
``FB_RACY_FOR_TESTS`` (compare-and-swap replaced by load + compare + store) and must find
violations: that is what shows these tests can fail.

``TestPythonAPIUnderThreads`` exercises the public Python API from threads on both
implementations; the free-threaded CI leg also runs it under pytest-run-parallel.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import fractions
import os
import sysconfig
import threading
import time
import types
from typing import Any

import pytest

import capi_ext
import fastbreaker

CLOSED, OPEN, HALF_OPEN = 0, 1, 2
THREADS = 4
SECONDS = float(os.environ.get("FB_STRESS_SECONDS", "1.5"))
RACY_ATTEMPTS = 4  # up to this many 1 s runs until the racy core shows a violation
# rounds until the threads of the stripe test have overlapped once: a quiet machine needs one, a
# machine loaded by other jobs ran 4 rounds one thread after another (a CI run beside 4 builds)
STRIPE_ATTEMPTS = 12

needs_c = pytest.mark.skipif(not fastbreaker.COMPILED, reason="the C API needs the compiled core")
needs_cc = pytest.mark.skipif(not capi_ext.have_compiler(), reason="no Cython or no C compiler")
# The hammers start their own threads and run for a set time: copies run by pytest-run-parallel
# would only share the two cores between them.
own_threads = pytest.mark.thread_unsafe(reason="starts its own threads")


@pytest.fixture(scope="session")
def client(tmp_path_factory: pytest.TempPathFactory) -> types.ModuleType:
    return capi_ext.cached("client", tmp_path_factory)


@pytest.fixture(scope="session")
def racy(tmp_path_factory: pytest.TempPathFactory) -> types.SimpleNamespace:
    if capi_ext.core_source_dir() is None:
        pytest.skip("the core's .pyx sources are not available to build the racy control")
    return capi_ext.cached("racy", tmp_path_factory)  # type: ignore[return-value]


@pytest.fixture(scope="session")
def striped(tmp_path_factory: pytest.TempPathFactory) -> types.SimpleNamespace:
    if capi_ext.core_source_dir() is None:
        pytest.skip("the core's .pyx sources are not available to build the striped copy")
    return capi_ext.cached("striped", tmp_path_factory)  # type: ignore[return-value]


# -- the breaker hammer --------------------------------------------------------------------------
BREAKER_CONFIGS = {
    # success_threshold=1 and probes never neutral: an episode ends with its first probe outcome,
    # so `half_open_max_calls` bounds the probes *admitted* in it, not only those in flight.
    # probe_timeout is explicit: the default has a 1 s floor, and leaked probes must be
    # reclaimed many times per run.
    "consecutive": dict(
        failure_threshold=3,
        reset_timeout=20e-6,
        probe_timeout=20e-6,
        half_open_max_calls=2,
    ),
    "window": dict(
        failure_threshold=3,
        window=16,
        min_calls=4,
        failure_rate=0.5,
        reset_timeout=20e-6,
        probe_timeout=20e-6,
        half_open_max_calls=3,
    ),
}


@dataclasses.dataclass
class HammerReport:
    figures: dict[str, int]
    violations: collections.Counter[str]
    examples: list[str]

    def __str__(self) -> str:
        return f"figures={self.figures} violations={dict(self.violations)} e.g. {self.examples[:5]}"


def hammer_breaker(
    client: Any,
    breaker: Any,
    seconds: float,
    *,
    threads: int = THREADS,
    fail_pct: int = 20,
    leak_pct: int = 1,
) -> HammerReport:
    cap = 200_000  # per thread; a 1.5 s run logs ~40,000 changes per thread
    logs: list[Any] = [None] * threads
    barrier = threading.Barrier(threads + 1)
    end = [0]

    def worker(i: int) -> None:
        claims = array.array("q", bytes(8 * 4 * cap))
        probes = array.array("q", bytes(8 * cap))
        samples = array.array("q", bytes(8 * 2 * cap))
        barrier.wait()
        res = client.hammer_breaker(
            breaker, i + 1, end[0], fail_pct, leak_pct, claims, probes, samples
        )
        logs[i] = (res, claims, probes, samples)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    end[0] = time.monotonic_ns() + int(seconds * 1e9)
    barrier.wait()
    for t in workers:
        t.join()
    return check_breaker(client, breaker, logs)


def check_breaker(client: Any, breaker: Any, logs: list[Any]) -> HammerReport:
    v: collections.Counter[str] = collections.Counter()
    examples: list[str] = []

    def bad(kind: str, detail: str) -> None:
        v[kind] += 1
        if len(examples) < 20:
            examples.append(f"{kind}: {detail}")

    totals: collections.Counter[str] = collections.Counter()
    claims: dict[int, list[tuple[int, int, int]]] = collections.defaultdict(list)
    probes: collections.Counter[int] = collections.Counter()
    samples: list[tuple[int, int]] = []
    for res, c, p, s in logs:
        totals.update({k: int(x) for k, x in res.items()})
        for j in range(res["n_claims"]):
            gen, old, new, now = c[4 * j : 4 * j + 4]
            claims[gen].append((old, new, now))
        probes.update(p[: res["n_probes"]])
        samples.extend(zip(s[0 : 2 * res["n_samples"] : 2], s[1 : 2 * res["n_samples"] : 2]))
    if totals["odd"]:
        bad("unexpected return code", f"{totals['odd']} calls")

    m = breaker.metrics()
    state, busy, final_gen, _ = client.raw_state(breaker)
    max_probes = breaker._config.options.half_open_max_calls
    if busy:
        bad("busy at quiescence", "a claim was never published")
    if final_gen > capi_ext_gen_mask(client) // 2:
        pytest.fail(f"generation {final_gen} too close to wrapping: shorten the run")

    # each state change claimed by exactly one caller, generations 1..final, chained
    prev_new = CLOSED
    for gen in range(1, final_gen + 1):
        got = claims.get(gen, [])
        if not got:
            bad("change claimed by nobody", f"generation {gen}")
            prev_new = -1
            continue
        if len(got) > 1:
            bad("change claimed twice", f"generation {gen}: {got}")
        old, new, _ = got[0]
        if prev_new != -1 and old != prev_new:
            bad(
                "changes do not chain",
                f"generation {gen} starts in {old}, previous ended in {prev_new}",
            )
        prev_new = new
    for gen in claims:
        if not 1 <= gen <= final_gen:
            bad("claim beyond the final generation", f"generation {gen} > {final_gen}")
    if final_gen and prev_new not in (-1, state):
        bad("final state differs from the last change", f"{prev_new} != {state}")
    trips = sum(1 for got in claims.values() for old, new, _ in got if new == OPEN)
    if trips != m.opened:
        bad("trips != metrics.opened", f"{trips} != {m.opened}")

    # at most half_open_max_calls probes per half-open episode, and only in half-open ones
    for gen, n in probes.items():
        kinds = {new for _, new, _ in claims.get(gen, [])}
        if kinds != {HALF_OPEN}:
            bad("probe outside a half-open episode", f"generation {gen} entered {kinds}")
        if n > max_probes:
            bad("too many probes in one episode", f"generation {gen}: {n} > {max_probes}")

    # a reader that sees OPEN sees that OPEN's trip time (or a later one), never an older one
    for gen, since in samples:
        trip_times = [now for _, new, now in claims.get(gen, []) if new == OPEN]
        if not trip_times:
            bad("OPEN seen in a generation nobody opened", f"generation {gen}")
        elif since < max(trip_times):
            bad("trip time older than its state", f"generation {gen}: {since} < {max(trip_times)}")

    # every admitted call accounted for
    if totals["admitted"] != m.permitted:
        bad("admitted != metrics.permitted", f"{totals['admitted']} != {m.permitted}")
    if totals["rejected"] != m.rejected:
        bad("rejected != metrics.rejected", f"{totals['rejected']} != {m.rejected}")
    reported = m.successes + m.failures + m.ignored + m.stale
    if reported != totals["released"] or m.permitted != reported + totals["leaked"]:
        bad(
            "outcomes not accounted for",
            f"permitted {m.permitted} != successes {m.successes} + failures {m.failures} + ignored "
            f"{m.ignored} + stale {m.stale} + never reported {totals['leaked']}",
        )

    # never stuck: with time moving on, a permit comes within a few calls
    now = max([time.monotonic_ns()] + [t for got in claims.values() for _, _, t in got])
    for _ in range(4):
        now += 10**9
        permit, _info = client.acquire_ex(breaker, now)
        if permit >= 0:
            break
    else:
        bad("stuck", f"no permit in 4 calls a second apart, state {client.raw_state(breaker)}")

    figures = dict(
        threads=len(logs),
        operations=totals["ops"],
        admitted=totals["admitted"],
        rejected=totals["rejected"],
        state_changes=sum(len(g) for g in claims.values()),
        trips=trips,
        probes=sum(probes.values()),
        half_open_episodes=sum(1 for g in claims.values() if any(n == HALF_OPEN for _, n, _ in g)),
        never_reported=totals["leaked"],
        stale=m.stale,
        trip_time_samples=len(samples),
        logs_full=totals["full"],
    )
    return HammerReport(figures, v, examples)


def capi_ext_gen_mask(client: Any) -> int:
    return int(client.CONSTANTS["GEN_MASK"])


@needs_c
@needs_cc
@own_threads
@pytest.mark.parametrize("mode", sorted(BREAKER_CONFIGS))
def test_breaker_invariants_hold_under_parallel_hammer(client: Any, mode: str) -> None:
    breaker = fastbreaker.CircuitBreaker(**BREAKER_CONFIGS[mode])
    report = hammer_breaker(client, breaker, SECONDS)
    print(f"\n[stress breaker {mode}] {report}")
    assert not report.violations, str(report)
    # the run exercised what it claims to check
    f = report.figures
    assert f["trips"] > 100 and f["half_open_episodes"] > 100, str(report)
    assert f["probes"] > 100 and f["trip_time_samples"] > 100, str(report)


@needs_c
@needs_cc
@own_threads
def test_config_swaps_under_parallel_hammer_keep_the_invariants(client: Any) -> None:
    """Safe reclamation of configs: native threads hammer map breakers through the C API (they
    read the config pointer without the GIL) while the main thread evicts those breakers (their
    config is swapped for the map's detached one) and registers callbacks on them (swapped for a
    private copy). A replaced config stays reachable from its replacement, so no reader is left
    with a freed one; the invariants of every hammered breaker and the map's count of
    non-CLOSED breakers must hold, and the retired configs must not pile up."""
    m = fastbreaker.BreakerMap(max_keys=64, **BREAKER_CONFIGS["consecutive"])
    reports = []
    swapped = 0
    for round_ in range(6):
        victim = m[f"victim-{round_}"]
        result: list[HammerReport] = []
        runner = threading.Thread(
            target=lambda: result.append(hammer_breaker(client, victim, 0.25))
        )
        runner.start()
        i = 0
        while runner.is_alive():
            m.allow(f"churn-{round_}-{i}")  # the map is full: eviction runs, and may drop victim
            if i % 50 == 0:
                m[f"churn-{round_}-{i}"].on_state_change(lambda *a: None)
            i += 1
        runner.join()
        reports.extend(result)
        swapped += victim._config is not m._config  # dropped (detached) while hammered
    for report in reports:
        assert not report.violations, str(report)
    held_open = sum(
        1 for key in m if m.get(key) is not None and m.get(key).state != fastbreaker.State.CLOSED
    )
    assert m._group.open == held_open
    assert len(m._detached.retired) <= 1
    assert sum(r.figures["trips"] for r in reports) > 100
    assert swapped >= 1, "no hammered breaker was ever dropped: the test exercised no swap"
    print(f"\n[stress config swaps] {swapped} of 6 hammered breakers swapped while hammered")


@pytest.mark.slow  # a racy control: needs both cores to itself (`.ci/run slow`)
@needs_c
@needs_cc
@own_threads
def test_racy_breaker_core_is_caught(racy: Any) -> None:
    """The negative control: the same hammer and checks find a CAS that is not atomic."""
    reports = []
    for _ in range(RACY_ATTEMPTS):
        breaker = racy.CircuitBreaker(**BREAKER_CONFIGS["consecutive"])
        reports.append(hammer_breaker(racy.client, breaker, 1.0))
        if reports[-1].violations:
            break
    print(f"\n[stress breaker racy] {reports[-1]}")
    assert reports[-1].violations, f"the racy core went undetected: {[str(r) for r in reports]}"


# -- striped counters (free-threaded builds; _fb_stripe.h) ----------------------------------------
# THREADS threads call one CLOSED breaker at once: once they have taken turns on it, it counts
# admissions and successes per CPU, and metrics() adds the stripes up. At quiescence the sums
# must be exact. The shipped core stripes on a free-threaded build; the "striped" copy forces
# stripes on any build; the racy copy (non-atomic stripe adds) must lose counts.
COUNTS_PER_THREAD = 300_000
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def hammer_counts(client: Any, breaker: Any) -> int:
    """THREADS threads of COUNTS_PER_THREAD admissions + successes; the total admitted."""
    admitted = [0] * THREADS
    start = threading.Barrier(THREADS)

    def run(i: int) -> None:
        start.wait()
        admitted[i] = client.hammer_counts(breaker, COUNTS_PER_THREAD)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(admitted)


@needs_c
@needs_cc
@own_threads
@pytest.mark.parametrize("core", ["shipped", "striped"])
def test_striped_counts_are_exact_at_quiescence(client: Any, striped: Any, core: str) -> None:
    lib = fastbreaker._breaker_c if core == "shipped" else striped.breaker_module
    cli = client if core == "shipped" else striped.client
    breaker = lib.CircuitBreaker(failure_threshold=5, reset_timeout=3600)
    want_stripes = (core == "striped" or FREE_THREADED) and (os.cpu_count() or 1) > 1
    total = 0
    for _ in range(STRIPE_ATTEMPTS):  # until the threads have overlapped (a loaded machine may
        # run them one after another): exact after every round
        total += hammer_counts(cli, breaker)
        m = breaker.metrics()
        assert (m.permitted, m.successes, m.failures, m.stale) == (total, total, 0, 0)
        if not want_stripes or lib._test_striped(breaker):
            break
    assert total % (THREADS * COUNTS_PER_THREAD) == 0  # CLOSED throughout: all admitted
    if want_stripes:
        assert lib._test_striped(breaker), "threads took turns, yet the breaker has no stripes"
    # a breaker that one thread calls never gets stripes
    alone = lib.CircuitBreaker(reset_timeout=3600)
    assert cli.hammer_counts(alone, 10_000) == 10_000
    assert not lib._test_striped(alone)
    assert alone.metrics().permitted == alone.metrics().successes == 10_000


@pytest.mark.slow  # a racy control: needs both cores to itself (`.ci/run slow`)
@needs_c
@needs_cc
@own_threads
def test_racy_striped_counts_are_caught(racy: Any) -> None:
    """The negative control: stripe adds that are a plain load + store lose counts."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: a breaker never gets stripes")
    found = []
    for _ in range(RACY_ATTEMPTS):
        breaker = racy.CircuitBreaker(failure_threshold=5, reset_timeout=3600)
        total = hammer_counts(racy.client, breaker)
        m = breaker.metrics()
        found.append((total, m.permitted, m.successes))
        if m.permitted != total or m.successes != total:
            break
    print(f"\n[stress striped racy] admitted, permitted, successes: {found}")
    total, permitted, successes = found[-1]
    assert permitted != total or successes != total, f"the racy stripes went undetected: {found}"


# -- the time window's buckets -------------------------------------------------------------------
# Rounds of WINDOW_BUCKETS epochs: within a round every outcome stays in the window, so the
# window must hold all of them at the round's end; each round starts on buckets that hold the
# previous round's epochs, so the first writer of each epoch resets one (the reset CAS).
WINDOW_BUCKETS = 100
WINDOW_PER_EPOCH = 1000  # per thread: THREADS * this stays below a bucket's saturation


def hammer_window(client: Any, breaker: Any, clock: Any, seconds: float) -> list[str]:
    """Run rounds from THREADS threads for ``seconds``; the violations found at round ends."""
    width = breaker._config.options.bucket_ns
    barrier = threading.Barrier(THREADS + 1)
    first = [0]
    stop = [False]
    released = [0] * THREADS

    def worker(i: int) -> None:
        while True:
            barrier.wait()
            if stop[0]:
                return
            released[i] = client.hammer_window(
                breaker, first[0], width, WINDOW_BUCKETS, WINDOW_PER_EPOCH
            )
            barrier.wait()

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in workers:
        t.start()
    found: list[str] = []
    end = time.monotonic() + seconds
    epoch = 10**6  # far from the buckets' initial tag
    try:
        while time.monotonic() < end and len(found) < 5:
            first[0] = epoch * width
            stale = breaker.metrics().stale
            barrier.wait()  # start the round
            barrier.wait()  # wait for its end
            epoch += WINDOW_BUCKETS
            clock.set_ns((epoch - 1) * width)
            m = breaker.metrics()
            want = THREADS * WINDOW_BUCKETS * WINDOW_PER_EPOCH
            if sum(released) != want or m.recorded != want or m.stale != stale:
                found.append(
                    f"round at epoch {epoch}: reported {sum(released)}, window holds "
                    f"{m.recorded} of {want}, {m.stale - stale} stale"
                )
    finally:
        stop[0] = True
        barrier.wait()
        for t in workers:
            t.join()
    return found


class _SetClock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns

    def set_ns(self, ns: int) -> None:
        self.ns = ns


def window_breaker(core: Any) -> tuple[Any, _SetClock]:
    clock = _SetClock()
    breaker = core(
        window_seconds=WINDOW_BUCKETS, window_buckets=WINDOW_BUCKETS, min_calls=1, clock=clock
    )
    return breaker, clock


@needs_c
@needs_cc
@own_threads
def test_time_window_buckets_lose_nothing_under_parallel_hammer(client: Any) -> None:
    from fastbreaker import _breaker_c

    breaker, clock = window_breaker(_breaker_c.CircuitBreaker)
    found = hammer_window(client, breaker, clock, SECONDS)
    print(f"\n[stress time window] {breaker.metrics().recorded} in the last round; {found}")
    assert not found


@pytest.mark.slow  # a racy control: needs both cores to itself (`.ci/run slow`)
@needs_c
@needs_cc
@own_threads
def test_racy_time_window_is_caught(racy: Any) -> None:
    """The negative control: bucket updates and resets by a CAS that is not atomic lose counts."""
    found: list[str] = []
    for _ in range(RACY_ATTEMPTS):
        breaker, clock = window_breaker(racy.CircuitBreaker)
        found = hammer_window(racy.client, breaker, clock, 1.0)
        if found:
            break
    print(f"\n[stress time window racy] {found}")
    assert found, "the racy time window went undetected"


# -- the budget hammer ---------------------------------------------------------------------------
UNIT = 1_000_000
ITERATIONS = 400_000


def hammer_budget(client: Any, budget: Any, *, step: int, threads: int = THREADS) -> dict[str, int]:
    tokens0, last0 = client.budget_units(budget)
    results: list[Any] = [None] * threads
    barrier = threading.Barrier(threads)

    def worker(i: int) -> None:
        barrier.wait()
        results[i] = client.hammer_budget(budget, ITERATIONS, last0, step)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    tokens, last = client.budget_units(budget)
    return dict(
        tokens0=tokens0,
        last0=last0,
        tokens=tokens,
        last=last,
        taken=sum(r[0] for r in results),
        take_calls=sum(r[1] for r in results),
        deposits=sum(r[2] for r in results),
    )


def budget_violations(budget: Any, r: dict[str, int], step: int) -> list[str]:
    """Conservation: tokens - start == deposits - withdrawals + accrual, accrual exact to one
    unit per refill (a refill credits whole units of at least one microsecond)."""
    deposit = round(budget.ratio * UNIT)
    rate = round(budget.min_per_sec * UNIT)  # units per second
    accrued = r["tokens"] - r["tokens0"] - r["deposits"] * deposit + r["taken"] * UNIT
    elapsed_ns = r["last"] - r["last0"]
    exact = fractions.Fraction(elapsed_ns // 1000 * rate, 10**6)
    refills_at_most = elapsed_ns // 1000
    out = []
    if r["tokens"] > round(budget.capacity * UNIT):
        out.append(f"tokens {r['tokens']} above capacity")
    if rate == 0 and accrued != 0:
        out.append(f"not conserved: {accrued:+} units beyond deposits - withdrawals")
    if rate and not exact - refills_at_most <= accrued <= exact:
        out.append(f"accrual {accrued} units outside [{exact - refills_at_most}, {exact}]")
    if rate and r["last"] != r["last0"] + (ITERATIONS - 1) * step:
        out.append(
            f"refill time {r['last']} != latest time seen {r['last0'] + (ITERATIONS - 1) * step}"
        )
    return out


BUDGET_CONFIGS = {
    # no accrual: exact conservation (the bucket never reaches capacity: each thread takes two
    # tokens before each deposit of a half)
    "exact": dict(ratio=0.5, capacity=1e9, min_per_sec=0.0),
    # with accrual at a rate that does not divide evenly into microseconds: rounding shows
    "accrual": dict(ratio=0.25, capacity=1e9, min_per_sec=1234.567),
}


@needs_c
@needs_cc
@own_threads
@pytest.mark.parametrize("mode", sorted(BUDGET_CONFIGS))
def test_budget_tokens_conserved_under_parallel_hammer(client: Any, mode: str) -> None:
    budget = fastbreaker.RetryBudget(**BUDGET_CONFIGS[mode])
    r = hammer_budget(client, budget, step=1000)
    print(f"\n[stress budget {mode}] {r}")
    assert r["taken"] == r["take_calls"], "the bucket was never meant to run dry here"
    assert budget_violations(budget, r, 1000) == [], r


@pytest.mark.slow  # a racy control: needs both cores to itself (`.ci/run slow`)
@needs_c
@needs_cc
@own_threads
def test_racy_budget_is_caught(racy: Any) -> None:
    found: list[str] = []
    for _ in range(RACY_ATTEMPTS):
        budget = racy.RetryBudget(**BUDGET_CONFIGS["exact"])
        r = hammer_budget(racy.client, budget, step=1000)
        found = budget_violations(budget, r, 1000)
        if found:
            break
    print(f"\n[stress budget racy] {found}")
    assert found, "the racy budget went undetected"


# -- the Python API from threads (both implementations) -------------------------------------------
def run_threads(n: int, target: Any, *args: Any) -> list[Any]:
    """Run ``target(i, *args)`` in ``n`` threads released together; re-raise the first error."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait()
            results[i] = target(i, *args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


class Boom(Exception):
    pass


class Ignored(Exception):
    pass


class TestPythonAPIUnderThreads:
    """Each test owns its objects, so pytest-run-parallel can run several copies at once."""

    def test_calls_from_threads_are_accounted_for(self, fb: Any) -> None:
        breaker = fb.CircuitBreaker(
            failure_threshold=2, reset_timeout=1e-5, half_open_max_calls=2, ignore=Ignored
        )
        changes: list[tuple[Any, Any]] = []
        breaker.on_state_change(lambda b, old, new: changes.append((old, new)))

        def body(i: int) -> collections.Counter[str]:
            seen: collections.Counter[str] = collections.Counter()
            for k in range(3000):
                exc = (Boom, Boom, Boom, Ignored, None, None, None, None)[(k + i) % 8]

                def fn() -> None:
                    if exc is not None:
                        raise exc()

                try:
                    breaker.call(fn)
                    seen["ok"] += 1
                except fastbreaker.CircuitOpenError:
                    seen["rejected"] += 1
                except (Boom, Ignored):
                    seen["raised"] += 1
                if k % 64 == 0:
                    breaker.metrics()  # snapshots taken while others call
            return seen

        seen = sum(run_threads(4, body), collections.Counter())
        m = breaker.metrics()
        assert m.permitted == seen["ok"] + seen["raised"]
        assert m.rejected == seen["rejected"]
        assert m.permitted == m.successes + m.failures + m.ignored + m.stale
        # every transition fired its callback exactly once
        assert sum(1 for _, new in changes if new == fastbreaker.State.OPEN) == m.opened
        assert m.opened > 0

    def test_listeners_registered_while_firing(self, fb: Any) -> None:
        breaker = fb.CircuitBreaker(failure_threshold=1, reset_timeout=60)
        calls = collections.Counter[int]()
        lock = threading.Lock()

        def body(i: int) -> int:
            registered = 0
            for k in range(200):
                if i % 2:

                    def cb(b: Any, old: Any, new: Any, key: int = i * 1000 + k) -> None:
                        with lock:
                            calls[key] += 1

                    breaker.on_state_change(cb)
                    registered += 1
                else:
                    breaker.trip()
                    breaker.reset()
            return registered

        registered = sum(run_threads(4, body))
        breaker.reset()
        with lock:
            before = dict(calls)
        breaker.trip()
        with lock:
            after = dict(calls)
        # every listener registered is in the list exactly once: the last trip called each once
        assert len(after) == registered
        assert all(after[k] - before.get(k, 0) == 1 for k in after)

    def test_metrics_snapshots_never_go_backwards(self, fb: Any) -> None:
        breaker = fb.CircuitBreaker(failure_threshold=1000)

        def body(i: int) -> None:
            last = breaker.metrics()
            for k in range(2000):
                if i % 2:
                    if breaker.allow():
                        breaker.record_success() if k % 3 else breaker.record_failure()
                else:
                    m = breaker.metrics()
                    for field in ("permitted", "successes", "failures"):
                        assert getattr(m, field) >= getattr(last, field)
                    last = m

        run_threads(4, body)
        m = breaker.metrics()
        assert m.permitted == m.successes + m.failures + m.stale == 2 * 2000

    def test_budget_from_threads_conserves_tokens(self, fb: Any) -> None:
        clock = fastbreaker.testing.FakeClock(10**12)  # never moves: no accrual
        budget = fb.RetryBudget(ratio=0.5, capacity=1000.0, min_per_sec=1.0, clock=clock)

        def body(i: int) -> int:
            taken = 0
            for _ in range(2000):
                taken += budget.allow_retry()
                taken += budget.allow_retry()
                budget.record_success()
            return taken

        taken = sum(run_threads(4, body))
        assert budget.tokens == pytest.approx(1000.0 - taken + 0.5 * 4 * 2000, abs=1e-9)

    def test_map_gives_each_key_one_breaker(self, fb: Any) -> None:
        m = fb.BreakerMap(failure_threshold=3)
        keys = [f"host-{k}" for k in range(400)]

        def body(i: int) -> dict[str, Any]:
            order = keys[i * 100 :] + keys[: i * 100]  # threads meet each key at different times
            if i % 2:
                order.reverse()
            return {k: m[k] for k in order}

        seen = run_threads(4, body)
        for k in keys:
            assert len({id(s[k]) for s in seen}) == 1, f"{k} got two breakers"
            assert m[k] is seen[0][k]
        assert len(m) == m.metrics().keys == len(keys)

    def test_map_stays_bounded_while_threads_create_and_evict(self, fb: Any) -> None:
        m = fb.BreakerMap(failure_threshold=2, reset_timeout=60, max_keys=32)
        sizes: list[int] = []

        def body(i: int) -> collections.Counter[str]:
            seen: collections.Counter[str] = collections.Counter()
            for n in range(3000):
                key = (n * 7919 + i * 104729) % 500
                fail = key % 50 == 0  # a few hosts are down: their breakers open and stay
                try:
                    m.call(key, _raise if fail else _ok)
                    seen["ok"] += 1
                except fastbreaker.CircuitOpenError:
                    seen["rejected"] += 1
                except Boom:
                    seen["raised"] += 1
                if n % 100 == 0:
                    sizes.append(len(m))
                    m.metrics()
            return seen

        seen = sum(run_threads(4, body), collections.Counter())
        mm = m.metrics()
        assert max(sizes) <= 32 and len(m) <= 32 and mm.keys == len(m)
        assert mm.evicted > 0 and seen["rejected"] > 0
        # the open hosts were never evicted: they are all still held, and still OPEN
        assert {k for k in range(0, 500, 50)} <= set(m.open_keys())

    def test_map_evicts_breakers_that_other_threads_are_calling(self, fb: Any) -> None:
        # Eviction swaps a breaker's config while other threads call that breaker: the
        # ThreadSanitizer run (.ci/tsan.sh) watches this for unsynchronized accesses.
        m = fb.BreakerMap(failure_threshold=10**6, max_keys=4)
        done = threading.Event()

        def body(i: int) -> int:
            n = 0
            if i == 0:
                try:
                    while not done.is_set() or n < 2000:
                        m.allow(f"new-{n}")
                        n += 1
                finally:
                    done.set()
                return n
            for _ in range(20000):
                if m.allow("hot"):
                    m.record_success("hot")
                    n += 1
            done.set()
            return n

        calls = run_threads(3, body)
        assert calls[1] == calls[2] == 20000  # never rejected: nothing fails
        assert len(m) <= 4 and m.metrics().evicted > 0


def _ok() -> None:
    return None


def _raise() -> None:
    raise Boom()
