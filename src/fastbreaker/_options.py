"""Breaker options: validated once, shared by both cores, by every breaker of a BreakerMap.

``BreakerOptions`` turns the public keyword arguments into the integers the state machine uses
(durations in ns, the effective ``min_calls``) and holds the exception classification. Both the
compiled core and the pure-Python twin build their configuration from it, so validation and its
messages exist once.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import logging
from typing import Any, Callable, Concatenate, ParamSpec, Sequence, Union

from ._durations import check_clock, check_count, check_rate, seconds_to_ns
from ._errors import BulkheadFullError, LoadShedError

__all__ = [
    "BreakerOptions",
    "FailurePredicate",
    "OUT_SUCCESS",
    "OUT_SLOW",
    "OUT_FAILURE",
    "OUT_NEUTRAL",
    "OUT_TIMEOUT",
    "MAX_WINDOW",
    "MAX_PROBES",
    "MAX_BUCKETS",
    "BUCKET_MAX",
    "DEFAULT_LATENCY_BUCKETS",
    "DRY_RUN_PERMIT",
    "TOKEN_UNIT",
    "budget_units",
]

#: Outcome codes passed from the call paths to the cores.
OUT_SUCCESS, OUT_SLOW, OUT_FAILURE, OUT_NEUTRAL = 0, 1, 2, 3
#: A failure whose exception is a ``TimeoutError`` (``DeadlineExceeded`` included): the cores
#: record it as OUT_FAILURE and count it in ``timeouts`` too.
OUT_TIMEOUT = 4
#: The permit of a call admitted only because of ``dry_run``: it matches no generation, so its
#: outcome is stale in both cores.
DRY_RUN_PERMIT = 1 << 62

#: The compiled core packs window counts and probe counts into 64-bit words; these are the limits.
MAX_WINDOW = 1_000_000
MAX_PROBES = 65_535
MAX_THRESHOLD = 2**40 - 1
#: The time window: at most this many buckets, each at least 1 ms wide.
MAX_BUCKETS = 1000
MIN_BUCKET_NS = 1_000_000
#: A bucket of the time window packs its epoch tag and three counters into one 64-bit word:
#: each counter saturates at this value (see README, "Time window").
BUCKET_MAX = 2**14 - 1
#: Prometheus's default histogram buckets (seconds), the default of ``latency_buckets``.
MAX_LATENCY_BUCKETS = 100
MAX_LATENCY_BOUND = 1e6
DEFAULT_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
#: The default probe_timeout is reset_timeout, but never less than this (1 s): with a tiny
#: reset_timeout, a probe still running must not be declared lost by the next caller.
MIN_DEFAULT_PROBE_TIMEOUT_NS = 1_000_000_000
#: Options that Config.reconfigure() may change in place; the others fix a breaker's shape.
RECONFIGURABLE = (
    "failure_threshold",
    "min_calls",
    "half_open_max_calls",
    "success_threshold",
    "reset_ns",
    "max_reset_ns",
    "probe_timeout_ns",
)

FailurePredicate = Callable[[BaseException], bool]
ExcTypes = Union[type[BaseException], tuple[type[BaseException], ...]]
Duration = Union[float, int, datetime.timedelta]


P = ParamSpec("P")


def signature_of(
    source: Callable[Concatenate[Any, P], None],
) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, P], None]]:
    """Give a constructor that delegates ``*args, **kwargs`` the signature of ``source``.

    Type checkers see ``source``'s parameters (through the ParamSpec) and ``inspect.signature``
    and ``help()`` show them (through ``__signature__``), so an option list is written once.
    """
    sig = inspect.signature(source)

    def apply(init: Callable[..., None]) -> Callable[Concatenate[Any, P], None]:
        init.__signature__ = sig  # type: ignore[attr-defined]
        return init

    return apply


def class_signature(init_signature: inspect.Signature) -> inspect.Signature:
    """A constructor's signature as ``inspect.signature(cls)`` shows it (without ``self``): the
    compiled classes carry it as ``__signature__``, since Cython cannot embed a class's."""
    return init_signature.replace(parameters=list(init_signature.parameters.values())[1:])


def _exc_types(value: object, name: str) -> tuple[type[BaseException], ...]:
    if isinstance(value, type) and issubclass(value, BaseException):
        return (value,)
    if isinstance(value, (tuple, list, frozenset, set)) and all(
        isinstance(t, type) and issubclass(t, BaseException) for t in value
    ):
        return tuple(value)
    raise TypeError(
        f"{name} must be an exception type or a tuple of exception types"
        f"{' or a predicate exc -> bool' if name == 'failure_on' else ''}, got {value!r}"
    )


class BreakerOptions:
    """The validated configuration of a circuit breaker (see ``CircuitBreaker`` for meanings).

    ``failure_on`` is exception types or a predicate ``exc -> bool``; a predicate that raises
    counts the call as a failure and is logged, the caller's exception propagating unchanged
    (see ``classify``).
    """

    __slots__ = (
        "failure_threshold",
        "reset_ns",
        "window",
        "min_calls",
        "failure_rate",
        "slow_ns",
        "slow_rate",
        "half_open_max_calls",
        "success_threshold",
        "max_reset_ns",
        "probe_timeout_ns",
        "failure_types",
        "failure_predicate",
        "ignore",
        "clock",
        "name",
        "window_ns",
        "window_buckets",
        "bucket_ns",
        "dry_run",
        "record_latency",
        "latency_bounds",
        "latency_bounds_ns",
    )

    failure_threshold: int
    reset_ns: int
    window: int
    min_calls: int
    failure_rate: float
    slow_ns: int
    slow_rate: float
    half_open_max_calls: int
    success_threshold: int
    max_reset_ns: int
    probe_timeout_ns: int
    failure_types: tuple[type[BaseException], ...]
    failure_predicate: FailurePredicate | None
    ignore: tuple[type[BaseException], ...]
    clock: Callable[[], int] | None
    name: str | None
    window_ns: int
    window_buckets: int
    bucket_ns: int
    dry_run: bool
    record_latency: bool
    latency_bounds: tuple[float, ...]
    latency_bounds_ns: tuple[int, ...]

    def __init__(
        self,
        failure_threshold: int = 5,
        reset_timeout: Duration = 30.0,
        *,
        window: int = 0,
        min_calls: int = 20,
        failure_rate: float = 0.5,
        slow_call_duration: Duration | None = None,
        slow_call_rate: float = 1.0,
        half_open_max_calls: int = 1,
        success_threshold: int = 1,
        max_reset_timeout: Duration | None = None,
        probe_timeout: Duration | None = None,
        failure_on: ExcTypes | FailurePredicate = (Exception,),
        ignore: ExcTypes = (),
        name: str | None = None,
        clock: Callable[[], int] | None = None,
        window_seconds: Duration | None = None,
        window_buckets: int = 10,
        dry_run: bool = False,
        record_latency: bool = False,
        latency_buckets: Sequence[float] | None = None,
    ) -> None:
        """Validate every option of a circuit breaker (the one place they are spelled out).

        ``CircuitBreaker`` takes exactly these arguments, and ``BreakerMap`` all but ``name``
        (plus its own ``max_open_ratio`` and ``max_keys``). Durations are seconds (int or float)
        or ``datetime.timedelta``. Bad values raise ``TypeError``/``ValueError`` naming the
        option and its accepted range.

        Args:
            failure_threshold: consecutive failures that trip the breaker (consecutive mode,
                ``window=0``), in [1, 2**40 - 1].
            reset_timeout: how long the breaker stays OPEN before a probe may pass (>= 0).
            window: 0 for consecutive mode, else the size of the ring of the last outcomes
                (count window, at most 1,000,000).
            min_calls: outcomes the window needs before it can trip (capped at ``window``).
            failure_rate: the failed share of the window that trips it, in (0, 1].
            slow_call_duration: a success at least this slow counts as slow (None: off).
            slow_call_rate: the slow share of the window that trips it, in (0, 1].
            half_open_max_calls: probes admitted at once in HALF_OPEN, in [1, 65535].
            success_threshold: probe successes that close the breaker, in [1, 65535].
            max_reset_timeout: with it, the open period doubles on each re-trip up to this cap.
            probe_timeout: a probe outstanding this long without another probe admitted is
                counted as failed (default: ``reset_timeout``, at least 1 s).
            failure_on: exception types that are failures, or a predicate ``exc -> bool`` (a
                predicate that raises counts the call as a failure and is logged).
            ignore: exception types that are neutral (neither success nor failure).
            name: the breaker's name (in errors, reprs and metrics); a str or None.
            clock: a zero-argument callable returning monotonic int nanoseconds (default: the
                C ``CLOCK_MONOTONIC``), such as ``fastbreaker.testing.FakeClock``.
            window_seconds: a time window instead of a count window (> 0; excludes
                ``window``): the failed and slow shares of the last ``window_seconds``. The trip
                is checked only when a failure or a slow call is recorded; ``min_calls`` is not
                capped. A CLOSED breaker in this mode reads the clock on each record.
            window_buckets: the buckets of the time window, an int in [1, 1000]; each covers
                ``window_seconds / window_buckets``, which must be at least 1 ms. A bucket
                counts at most 16,383 outcomes of each kind: its counters saturate (stop
                counting) rather than wrap.
            dry_run: never reject: a call the breaker would reject is admitted and counted in
                ``permitted`` and ``would_reject``, and its outcome is stale. Everything else
                (counting, transitions, callbacks, metrics) runs as usual.
            record_latency: time every call (as ``slow_call_duration`` does) into the latency
                histogram of ``metrics().latency``.
            latency_buckets: the histogram's upper bounds in seconds, increasing and > 0 (None:
                Prometheus's defaults, 0.005 ... 10).
        """
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {name!r}")
        self.name = name
        self.failure_threshold = check_count(
            failure_threshold, "failure_threshold", 1, MAX_THRESHOLD
        )
        self.reset_ns = seconds_to_ns(reset_timeout, "reset_timeout")
        self.window = check_count(window, "window", 0, MAX_WINDOW)
        min_calls = check_count(min_calls, "min_calls", 1, MAX_THRESHOLD)
        self.min_calls = min(min_calls, self.window) if self.window else min_calls
        self.failure_rate = check_rate(failure_rate, "failure_rate")
        self.slow_ns = (
            0
            if slow_call_duration is None
            else seconds_to_ns(slow_call_duration, "slow_call_duration", positive=True)
        )
        self.slow_rate = check_rate(slow_call_rate, "slow_call_rate")
        self.half_open_max_calls = check_count(
            half_open_max_calls, "half_open_max_calls", 1, MAX_PROBES
        )
        self.success_threshold = check_count(success_threshold, "success_threshold", 1, MAX_PROBES)
        if max_reset_timeout is None:
            self.max_reset_ns = 0
        else:
            self.max_reset_ns = seconds_to_ns(max_reset_timeout, "max_reset_timeout", positive=True)
            if self.max_reset_ns < self.reset_ns:
                raise ValueError(
                    f"max_reset_timeout must be >= reset_timeout ({self.reset_ns / 1e9}s), "
                    f"got {max_reset_timeout!r}"
                )
        self.probe_timeout_ns = (
            max(self.reset_ns, MIN_DEFAULT_PROBE_TIMEOUT_NS)
            if probe_timeout is None
            else seconds_to_ns(probe_timeout, "probe_timeout", positive=True)
        )
        if callable(failure_on) and not isinstance(failure_on, type):
            self.failure_types = ()
            self.failure_predicate = failure_on
        else:
            self.failure_types = _exc_types(failure_on, "failure_on")
            self.failure_predicate = None
        self.ignore = _exc_types(ignore, "ignore") if ignore != () else ()
        check_clock(clock)
        self.clock = clock
        self.window_buckets = check_count(window_buckets, "window_buckets", 1, MAX_BUCKETS)
        if window_seconds is None:
            self.window_ns = self.bucket_ns = 0
        else:
            self.window_ns = seconds_to_ns(window_seconds, "window_seconds", positive=True)
            if self.window:
                raise ValueError(
                    "window and window_seconds are mutually exclusive: set window=0 (count "
                    f"window off) or window_seconds=None, got window={window!r}, "
                    f"window_seconds={window_seconds!r}"
                )
            self.bucket_ns = self.window_ns // self.window_buckets
            if self.bucket_ns < MIN_BUCKET_NS:
                raise ValueError(
                    f"window_buckets must divide window_seconds into buckets of at least 1 ms: "
                    f"at most {self.window_ns // MIN_BUCKET_NS} buckets for window_seconds="
                    f"{window_seconds!r}, got {window_buckets!r}"
                )
        self.dry_run = _check_bool(dry_run, "dry_run")
        self.record_latency = _check_bool(record_latency, "record_latency")
        self.latency_bounds = _latency_bounds(latency_buckets)
        self.latency_bounds_ns = _bounds_ns(self.latency_bounds)

    @property
    def timed(self) -> bool:
        """Whether the call paths time calls (``slow_call_duration`` or ``record_latency``)."""
        return bool(self.slow_ns) or self.record_latency

    def classify(self, exc: BaseException) -> int:
        """The outcome code of a call that raised ``exc``.

        Non-``Exception`` base exceptions (cancellation, KeyboardInterrupt, GeneratorExit),
        ``BulkheadFullError``, ``LoadShedError`` and ``ignore`` matches are neutral; ``failure_on``
        matches are failures; anything else means the dependency answered, so it is a success.

        A ``failure_on`` predicate that raises counts the call as a failure: its error is logged
        on the ``fastbreaker`` logger and never replaces ``exc``, and every call path (and each
        compat layer) records the outcome, so a broken predicate cannot leak a permit or a probe.
        Failure is the safe side: a predicate that raises on every error still lets the breaker
        open, where "neutral" would hide a failing dependency.
        """
        if not isinstance(exc, Exception) or (self.ignore and isinstance(exc, self.ignore)):
            return OUT_NEUTRAL
        if isinstance(exc, (BulkheadFullError, LoadShedError)):
            return OUT_NEUTRAL  # a full bulkhead or a shed request says nothing about the dependency's health
        failure = OUT_TIMEOUT if isinstance(exc, TimeoutError) else OUT_FAILURE
        if self.failure_predicate is not None:
            try:
                return failure if self.failure_predicate(exc) else OUT_SUCCESS
            except Exception:
                logging.getLogger("fastbreaker").exception(
                    "fastbreaker: failure_on predicate %r raised on %r; counted as a failure",
                    self.failure_predicate,
                    exc,
                )
                return failure
        return failure if isinstance(exc, self.failure_types) else OUT_SUCCESS

    def check_reconfigure(self, new: "BreakerOptions") -> None:
        """Raise ValueError unless ``new`` differs from these options only in what
        ``Config.reconfigure`` may change in place (thresholds and durations)."""
        for option in self.__slots__:
            if (
                option not in RECONFIGURABLE
                and option != "name"
                and (getattr(new, option) != getattr(self, option))
            ):
                raise ValueError(f"{option} cannot change on an existing breaker")

    def update_from(self, new: "BreakerOptions") -> None:
        """Take the reconfigurable values of ``new`` (see ``check_reconfigure``)."""
        for option in RECONFIGURABLE:
            setattr(self, option, getattr(new, option))

    def kwargs(self) -> dict[str, Any]:
        """The options as keyword arguments (durations in seconds), for copies and reprs."""
        return {
            "failure_threshold": self.failure_threshold,
            "reset_timeout": self.reset_ns / 1e9,
            "window": self.window,
            "min_calls": self.min_calls,
            "failure_rate": self.failure_rate,
            "slow_call_duration": self.slow_ns / 1e9 if self.slow_ns else None,
            "slow_call_rate": self.slow_rate,
            "half_open_max_calls": self.half_open_max_calls,
            "success_threshold": self.success_threshold,
            "max_reset_timeout": self.max_reset_ns / 1e9 if self.max_reset_ns else None,
            "probe_timeout": self.probe_timeout_ns / 1e9,
            "failure_on": self.failure_predicate or self.failure_types,
            "ignore": self.ignore,
            "name": self.name,
            "clock": self.clock,
            "window_seconds": self.window_ns / 1e9 if self.window_ns else None,
            "window_buckets": self.window_buckets,
            "dry_run": self.dry_run,
            "record_latency": self.record_latency,
            "latency_buckets": self.latency_bounds,
        }


def _check_bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def _latency_bounds(value: object) -> tuple[float, ...]:
    """Validate ``latency_buckets``: None (the defaults) or increasing positive finite seconds."""
    if value is None:
        return DEFAULT_LATENCY_BUCKETS
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"latency_buckets must be a sequence of seconds or None, got {value!r}")
    bounds = []
    for b in value:
        if isinstance(b, bool) or not isinstance(b, (int, float)):
            raise TypeError(f"latency_buckets must hold numbers of seconds, got {b!r}")
        if not 0 < b <= MAX_LATENCY_BOUND:  # also rejects NaN
            raise ValueError(
                f"latency_buckets must be in (0, {MAX_LATENCY_BOUND}] seconds, got {b!r}"
            )
        bounds.append(float(b))
    if not bounds or len(bounds) > MAX_LATENCY_BUCKETS:
        raise ValueError(
            f"latency_buckets must hold 1 to {MAX_LATENCY_BUCKETS} bounds, got {len(bounds)}"
        )
    if any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"latency_buckets must be strictly increasing, got {value!r}")
    return tuple(bounds)


# Breakers with the same bounds (most often the defaults) share one tuple of ns: made per
# breaker, its 14 large ints cost 600 bytes each (issue 26's regression of a standalone breaker).
@functools.lru_cache(maxsize=64)
def _bounds_ns(bounds: tuple[float, ...]) -> tuple[int, ...]:
    return tuple(round(b * 1e9) for b in bounds)


# -- RetryBudget ---------------------------------------------------------------------------------
#: Fixed-point units per retry token (both budget cores count in these).
TOKEN_UNIT = 1_000_000
#: Upper bound of ``capacity`` and ``ratio``: capacity + deposit stays far below 2**63 units.
MAX_TOKENS = 10**12
#: Upper bound of ``min_per_sec``: the sub-second refill product stays below 2**63.
MAX_RATE = 10**6


def _token_units(value: object, name: str, lo: int, hi: int) -> int:
    """Validate a token amount in ``[lo, hi]`` and return it in fixed-point units."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number in [{lo}, {hi}], got {value!r}")
    if not lo <= value <= hi:  # also rejects NaN
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value!r}")
    return round(value * TOKEN_UNIT)


def budget_parameters(
    ratio: float = 0.1,
    capacity: float = 100.0,
    min_per_sec: float = 1.0,
    *,
    clock: Callable[[], int] | None = None,
) -> None:
    """``RetryBudget``'s parameters, which ``inspect.signature`` shows for the compiled class
    (Cython gives a class none); ``tests/test_signatures.py`` keeps them equal to the twin's."""


def budget_units(ratio: object, capacity: object, min_per_sec: object) -> tuple[int, int, int]:
    """Validate a RetryBudget's options; return ``(deposit, capacity, rate)`` in token units
    (rate: units per second). Both budget cores use it, so they round the options identically."""
    return (
        _token_units(ratio, "ratio", 0, MAX_TOKENS),
        _token_units(capacity, "capacity", 1, MAX_TOKENS),
        _token_units(min_per_sec, "min_per_sec", 0, MAX_RATE),
    )
