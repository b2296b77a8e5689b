"""A fleet that learns together: local-first breaker coordination over Redis.

``FleetCoordinator`` shares what the breakers of many processes see, without putting Redis on
the call path. ``allow()`` and the C API never do I/O: the local breaker decides every call. The
coordinator, run explicitly by the user, flushes outcome counts and pulls the fleet's state with
one Lua script call per sync (one per Redis Cluster slot group), batched for every breaker and
map it holds::

    import redis
    from fastbreaker.contrib.redis import FleetCoordinator

    coord = FleetCoordinator(redis.Redis(), namespace="shop")
    coord.add_breaker(payments)                 # matched across the fleet by its name
    coord.add_map(hosts, name="hosts")          # matched by name, then per (str) key
    handle = coord.run_in_thread(interval=1.0)  # or: await coord.run(interval=1.0) (redis.asyncio)
    ...                                         # or: coord.sync_once() from any scheduler
    handle.stop()

The semantics, stated once:

* **Nodes, and the fleet rule.** An instance's node is its ``instance_id`` up to the first
  ``:`` (by default the host, so a restarted process is the same node). Each sync adds the
  outcomes counted locally since the previous sync to time buckets of the fleet
  (``fleet_window`` seconds in 10 buckets, timed by the server's ``TIME``) and tells whether the
  local breaker is tripped on its own. The fleet breaker opens on evidence from at least
  ``min_instances`` nodes (default 2) that are also at least ``failure_rate`` of the nodes that
  reported it within the window: nodes whose own breaker is tripped (a recent local OPEN
  verdict), or nodes reporting failures while the window's counts reach ``min_calls`` with a
  failure share of at least ``failure_rate`` (the breaker's own options; slow calls count as
  successes). One sick node never opens the fleet for the others, while its own breaker still
  protects it; an outage every node sees opens it within two syncs. A fleet transition to
  CLOSED starts a fresh window.
* **Fencing.** Every fleet transition gets a new fleet generation (``max(gen + 1, server
  ms)``). The coordinator applies a generation only if it is newer than the last it applied
  (or grants new leases), through ``CircuitBreaker._fleet``, which applies it only if the
  breaker made no local transition since the coordinator read it: replies that arrive late,
  twice or out of order never move it backwards, and ``reset()`` wins over a fleet state
  already applied. A fleet CLOSED closes only a breaker whose current state the fleet put
  there: a breaker that opened on its own (a sick instance) recovers on its own.
  ``reset(name, key)`` closes a breaker fleet-wide at the next sync.
* **Nothing read from Redis is trusted.** A malformed entry (record, version, bucket, pool, a
  key of the wrong type) skips only its own key, map, breaker or budget (counted in
  ``malformed``, logged once); a generation more than 10 minutes ahead of the server's clock is
  malformed; a fleet open period is cut to the breaker's longest. A server that lost its data
  restarts its generations, maybe behind: that is detected (``data_losses``) and applied.
* **Clocks.** The open period reaches each process as a remaining duration, converted to the
  breaker's own clock. A breaker the fleet holds OPEN stays OPEN for that duration plus a *hold*
  of ``max(reset_timeout, 2 * interval + sync_timeout)``, renewed by every sync that brings a new
  generation; if the syncs stop (Redis down), the breaker falls back to its own recovery when the
  hold ends.
* **Fleet probes.** When the fleet's open period ends, it becomes HALF_OPEN for rounds of
  ``reset_timeout``. An instance that has rejected calls asks for probe leases; the script grants
  at most ``half_open_max_calls`` leases fleet-wide (a sorted set scored by the round's end, so
  the lease of a holder that died expires with its round). A holder's breaker goes HALF_OPEN
  admitting exactly its leases; everyone else stays OPEN. ``success_threshold`` successful probes
  close the fleet, one failed probe re-opens it.
* **Redis down or slow.** A sync is bounded by ``sync_timeout`` seconds whatever the client's own
  timeouts and retries: it runs on the coordinator's own connection, made from the client's
  connection settings with those timeouts and no retries (``asyncio.wait_for`` for an asyncio
  client). A failed sync counts in ``fleet_sync_failures``, sets ``fleet_degraded`` and fires the
  ``"degraded"`` event (``"recovered"`` when a sync succeeds again); every process goes on with
  its local breakers.
* **No double counting: counts are delivered at most once.** The counts of a sync that failed
  are dropped, never sent again: such a sync may have run on the server with only its reply
  lost. Counts made after the last failed attempt go with the next sync. During an outage the
  fleet therefore forgets what happened, as a window of ``fleet_window`` seconds would anyway.
* **A fleet-wide retry budget** (``add_budget``). The fleet keeps one pool of ``capacity`` x
  instances tokens (instances that synced within ``fleet_window``; a new one brings a full
  bucket), charged at every sync with each instance's local change (deposits, retries, the
  ``min_per_sec`` accrual); each instance's budget is then set to pool / instances (at most
  ``capacity``). The bound on overshoot: between two syncs an instance spends only from its
  local share, so in one sync interval the fleet spends at most its pool, plus its new
  deposits, plus ``min_per_sec`` x instances x interval, plus what shares computed before
  another instance's spending was reported still count (at most one pool per interval); the
  next sync charges every retry, so the overshoot never accumulates.
* **Redis Cluster.** All keys of a standalone breaker, and all keys of a map, share one hash tag
  (a map in one slot: its index of non-CLOSED keys and its keys are updated by one atomic
  script). A sync's batch is grouped by slot: one script call per slot group.
* **Memory in Redis.** CLOSED keys have no state record; count buckets and failing-instance sets
  expire after the window; an index per map holds its non-CLOSED keys.

Nothing runs on its own: no thread, task or timer starts unless ``run``/``run_in_thread`` is
called. Constructing a coordinator and adding to it do no I/O and work while Redis is down.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import math
import os
import socket
import threading
import time
import uuid
import weakref
from typing import Any, Callable, Optional

from .. import BreakerMap, CircuitBreaker, RetryBudget
from .._options import TOKEN_UNIT as _TOKEN_UNIT
from .._permit import options as _options_of
from ._fleet_script import SCRIPT

__all__ = ["FleetCoordinator", "FleetMetrics", "SyncReport", "RunHandle"]

_log = logging.getLogger("fastbreaker.fleet")
_BUCKETS = 10
_SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()
# A fleet generation is the server's clock in ms (or one more than the last): one further ahead
# of the server's clock than this is not plausible, and its record is malformed.
_AHEAD_MS = 600_000
_LOGGED_MAX = 1000  # malformed entries remembered (to log each once)


@dataclasses.dataclass(frozen=True)
class FleetMetrics:
    """A snapshot of a coordinator's counters.

    ``syncs``: syncs attempted; ``fleet_sync_failures``: those that failed (Redis down, slow or
    erroring); ``fleet_degraded``: the last sync failed (local-only until one succeeds);
    ``applied``: fleet states applied to local breakers; ``stale_applies``: replies refused
    because the breaker made a local transition meanwhile (it gets the state at the next sync);
    ``last_error``: the last failure, as text; ``malformed``: entries found malformed in Redis
    and skipped (a record, key or field of a key, map, breaker or budget; counted at each sync
    that meets one, logged once per entry); ``data_losses``: times the server was found to have
    lost the fleet's data (its generations restart, and are applied as news).
    """

    syncs: int
    fleet_sync_failures: int
    fleet_degraded: bool
    applied: int
    stale_applies: int
    last_error: Optional[str]
    malformed: int = 0
    data_losses: int = 0


@dataclasses.dataclass(frozen=True)
class SyncReport:
    """What one sync did: ``ok``; ``error`` (text) when it failed; ``keys`` sent; fleet states
    ``received``; ``applied`` to local breakers; ``seconds`` it took."""

    ok: bool
    error: Optional[str]
    keys: int
    received: int
    applied: int
    seconds: float


class RunHandle:
    """The thread of ``run_in_thread``: ``stop()`` ends it (after the sync in progress)."""

    def __init__(self, thread: threading.Thread, stop: threading.Event) -> None:
        self._thread = thread
        self._stop = stop

    @property
    def running(self) -> bool:
        """Whether the loop's thread is still running."""
        return self._thread.is_alive()

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stop the loop and wait for the thread (at most ``timeout`` seconds)."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


class _Key:
    """What the coordinator remembers of one local breaker."""

    __slots__ = (
        "breaker",
        "succ",
        "fail",
        "rej",
        "held",
        "fleet_state",
        "gen",
        "fgen",
        "leases",
        "tripped",
    )

    def __init__(self, breaker: Any) -> None:
        self.breaker = breaker
        self.succ = self.fail = self.rej = 0
        self.held = -1  # the local generation the fleet's last apply produced, or -1
        self.fleet_state = 0  # as last heard; a key not CLOSED is sent at every sync
        self.gen = -1  # the local generation read for the sync in progress
        self.fgen = -1  # the fleet generation (and leases) last applied: the coordinator's fence
        self.leases = 0
        self.tripped = False  # the local breaker's own verdict, as last sent


class _Budget:
    """A coordinated RetryBudget: ``level`` is the token units it was left at by the last sync
    (the local change since then is what the next sync sends)."""

    __slots__ = ("tag", "budget", "level", "delta", "read")

    def __init__(self, tag: str, budget: Any) -> None:
        self.tag = tag
        self.budget = budget
        self.level: Optional[int] = None
        self.delta = 0
        self.read = 0


class _Group:
    """One hash tag: a standalone breaker (one key) or a map."""

    __slots__ = ("tag", "options", "keys", "since", "breaker", "map", "resets", "epoch")

    def __init__(self, tag: str, options: Any, breaker: Any = None, bmap: Any = None) -> None:
        self.tag = tag
        self.options = options
        self.breaker = breaker
        self.map = bmap
        self.keys: dict[str, _Key] = {}
        self.since = 0
        self.resets: set[str] = set()  # fleet resets asked for, sent until a sync succeeds
        self.epoch = ""  # names the group's data in Redis: a new one when the server lost it

    def items(self) -> list[tuple[str, Any]]:
        if self.breaker is not None:
            return [(self.breaker.name, self.breaker)]
        out = []
        m = self.map
        for key in m:
            if type(key) is str:  # noqa: E721 - str keys only (README)
                b = m.get(key)
                if b is not None:
                    out.append((key, b))
        return out

    def lookup(self, key: str) -> Any:
        if self.breaker is not None:
            return self.breaker if key == self.breaker.name else None
        return self.map.get(key)


def _check_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{what} must be a non-empty str, got {value!r}")
    if "{" in value or "}" in value:
        raise ValueError(f"{what} must not contain braces (they delimit the hash tag): {value!r}")
    return value


def _seconds(value: object, what: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    v = float(value)
    if not (lo < v <= hi) or math.isnan(v):
        raise ValueError(f"{what} must be in ({lo}, {hi}] seconds, got {value!r}")
    return v


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class FleetCoordinator:
    """Shares the breakers of many processes through Redis; see the module docstring.

    ``client``: a ``redis.Redis``, ``redis.cluster.RedisCluster`` or ``redis.asyncio.Redis`` (or
    the valkey equivalents). ``namespace``: the fleet's name (instances with the same namespace
    and the same breaker/map names share state). ``instance_id``: this process in the fleet
    (default: ``host:pid:random``); its part before the first ``:`` names its *node* (default:
    the host), which survives restarts: the fleet rule counts nodes, not processes.
    ``sync_timeout``: the most one sync may take, in seconds. ``min_instances``: how many nodes
    must give evidence of failure within the window for the fleet to open (default 2: one sick
    node never opens the fleet for the others). ``fleet_window``: the seconds of outcomes the
    fleet rule looks at.
    """

    def __init__(
        self,
        client: Any,
        *,
        namespace: str,
        instance_id: Optional[str] = None,
        sync_timeout: float = 0.2,
        min_instances: int = 2,
        fleet_window: float = 10.0,
    ) -> None:
        if client is None:
            raise TypeError("client must be a redis.Redis, redis.asyncio.Redis or valkey client")
        self._client = client
        self._namespace = _check_name(namespace, "namespace")
        if instance_id is None:
            instance_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._instance = _check_name(instance_id, "instance_id")
        self._node = self._instance.split(":", 1)[0] or self._instance
        self._timeout = _seconds(sync_timeout, "sync_timeout", 0.0, 60.0)
        if isinstance(min_instances, bool) or not isinstance(min_instances, int):
            raise TypeError(f"min_instances must be an int, got {min_instances!r}")
        if not 1 <= min_instances <= 1_000_000:
            raise ValueError(f"min_instances must be in 1..1000000, got {min_instances!r}")
        self._min_instances = min_instances
        self._window = _seconds(fleet_window, "fleet_window", 0.0, 86_400.0)
        self._is_async = _is_async_client(client)
        self._cluster = type(client).__name__ in ("RedisCluster", "ValkeyCluster")
        self._groups: dict[str, _Group] = {}
        self._budgets: dict[str, _Budget] = {}
        self._lock = threading.Lock()
        self._conns: dict[Any, Any] = {}
        self._interval = 1.0
        self._syncs = self._failures = self._applied = self._stale = 0
        self._degraded = False
        self._last_error: Optional[str] = None
        self._listeners: list[Callable[..., Any]] = []
        self._malformed = self._losses = 0
        self._logged: set[tuple[str, str]] = set()
        self._fence = 0

    # -- what is shared ----------------------------------------------------------------------------
    def _add(self, kind: str, name: str, group: _Group) -> None:
        with self._lock:
            if group.tag in self._groups:
                raise ValueError(f"a {kind} named {name!r} is already coordinated")
            self._groups[group.tag] = group

    def add_breaker(self, breaker: CircuitBreaker) -> CircuitBreaker:
        """Share ``breaker`` with the fleet, matched by ``breaker.name`` (required)."""
        if not hasattr(breaker, "_fleet") or isinstance(breaker, type):
            raise TypeError(f"breaker must be a fastbreaker.CircuitBreaker, got {breaker!r}")
        name = breaker.name
        if name is None:
            raise ValueError("breaker.name is required: it matches the breaker across the fleet")
        _check_name(name, "breaker.name")
        tag = f"{{{self._namespace}:b:{name}}}"
        self._add("breaker", name, _Group(tag, _options_of(breaker), breaker=breaker))
        return breaker

    def add_map(self, breaker_map: BreakerMap, name: str = "map") -> BreakerMap:
        """Share every str key of ``breaker_map`` with the fleet, matched by ``name`` then key."""
        if not hasattr(breaker_map, "open_keys") or not hasattr(breaker_map, "_options"):
            raise TypeError(f"breaker_map must be a fastbreaker.BreakerMap, got {breaker_map!r}")
        _check_name(name, "name")
        tag = f"{{{self._namespace}:m:{name}}}"
        self._add("map", name, _Group(tag, breaker_map._options, bmap=breaker_map))
        return breaker_map

    def add_budget(self, budget: RetryBudget, name: str = "budget") -> RetryBudget:
        """Reconcile ``budget`` with the fleet's budget of the same ``name``."""
        if not hasattr(budget, "allow_retry"):
            raise TypeError(f"budget must be a fastbreaker.RetryBudget, got {budget!r}")
        _check_name(name, "name")
        with self._lock:
            if name in self._budgets:
                raise ValueError(f"a budget named {name!r} is already coordinated")
            self._budgets[name] = _Budget(f"{{{self._namespace}:r:{name}}}", budget)
        return budget

    def on_event(self, callback: Callable[[FleetCoordinator, str, Optional[str]], Any]) -> Any:
        """Register ``callback(coordinator, event, error)``; events: ``"degraded"`` (a sync
        failed after one succeeded, or the first sync failed) and ``"recovered"``."""
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        self._listeners.append(callback)
        return callback

    def metrics(self) -> FleetMetrics:
        """A snapshot of the coordinator's counters."""
        return FleetMetrics(
            syncs=self._syncs,
            fleet_sync_failures=self._failures,
            fleet_degraded=self._degraded,
            applied=self._applied,
            stale_applies=self._stale,
            last_error=self._last_error,
            malformed=self._malformed,
            data_losses=self._losses,
        )

    @property
    def instance_id(self) -> str:
        """This instance's id in the fleet (given, or ``host:pid:random``)."""
        return self._instance

    def reset(self, name: str, key: Optional[str] = None) -> None:
        """Close a breaker fleet-wide: the breaker ``name`` (or the ``key`` of the map ``name``)
        is reset here at once, and the next successful sync writes CLOSED with a new fleet
        generation in Redis (replacing its record, even a malformed one), which closes it on
        every instance the fleet held OPEN. No I/O in this call."""
        _check_name(name, "name")
        if key is None:
            tag = f"{{{self._namespace}:b:{name}}}"
        else:
            tag = f"{{{self._namespace}:m:{name}}}"
        with self._lock:
            group = self._groups.get(tag)
            if group is None:
                what = "breaker" if key is None else "map"
                raise ValueError(f"no {what} named {name!r} is coordinated")
            target = name if key is None else _check_name(key, "key")
            group.resets.add(target)
        breaker = group.lookup(target)
        if breaker is not None:
            breaker.reset()

    # -- one sync ----------------------------------------------------------------------------------
    def sync_once(self) -> SyncReport:
        """One sync, bounded by ``sync_timeout``: flush counts, pull and apply the fleet state."""
        if self._is_async:
            raise TypeError("an asyncio client: use 'await coordinator.sync_once_async()'")
        with self._lock:
            start = time.monotonic()
            plan: list[Any] = []
            try:
                plan = self._prepare()
                replies = self._call_sync(plan, start + self._timeout)
                return self._finish(plan, replies, start)
            except Exception as exc:  # Redis failing, whatever the client raises, or its data
                return self._failed(plan, exc, start)

    async def sync_once_async(self) -> SyncReport:
        """``sync_once`` for a ``redis.asyncio`` client."""
        if not self._is_async:
            raise TypeError("a synchronous client: use coordinator.sync_once()")
        start = time.monotonic()
        plan: list[Any] = []
        try:
            plan = self._prepare()
            replies = await asyncio.wait_for(self._call_async(plan), self._timeout)
            return self._finish(plan, replies, start)
        except Exception as exc:
            return self._failed(plan, exc, start)

    async def run(self, interval: float = 1.0) -> None:
        """Sync every ``interval`` seconds until cancelled (an asyncio client); run it as a task
        you create: ``asyncio.create_task(coordinator.run())``."""
        self._interval = _seconds(interval, "interval", 0.0, 3600.0)
        while True:
            start = time.monotonic()
            await self.sync_once_async()
            await asyncio.sleep(max(0.0, self._interval - (time.monotonic() - start)))

    def run_in_thread(self, interval: float = 1.0) -> RunHandle:
        """Start a daemon thread (only this call starts one) that syncs every ``interval``
        seconds; ``handle.stop()`` ends it."""
        if self._is_async:
            raise TypeError("an asyncio client: use 'await coordinator.run()' in a task")
        self._interval = _seconds(interval, "interval", 0.0, 3600.0)
        stop = threading.Event()
        ref = weakref.ref(self)

        def loop() -> None:
            while not stop.is_set():
                coord = ref()
                if coord is None:
                    return
                start = time.monotonic()
                try:
                    coord.sync_once()
                except Exception:  # a bug must not kill the loop silently
                    _log.exception("fleet sync raised")
                wait = max(0.0, coord._interval - (time.monotonic() - start))
                del coord
                stop.wait(wait)

        thread = threading.Thread(target=loop, name="fastbreaker-fleet", daemon=True)
        thread.start()
        return RunHandle(thread, stop)

    # -- the steps of a sync -------------------------------------------------------------------------
    def _hold(self, options: Any) -> float:
        return max(float(options.reset_ns) / 1e9, 2 * self._interval + self._timeout)

    def _prepare(self) -> list[tuple[Any, Optional[list[Any]], list[tuple[str, _Key]]]]:
        """Read every local breaker once: the count deltas to send (taken now, sent at most
        once) and the keys whose fleet state matters."""
        plan: list[tuple[Any, Optional[list[Any]], list[tuple[str, _Key]]]] = []
        for group in list(self._groups.values()):
            args: list[Any] = []
            sent: list[tuple[str, _Key]] = []
            known = group.keys
            fresh: dict[str, _Key] = {}
            for key, breaker in group.items():
                k = known.get(key)
                if k is None or k.breaker is not breaker:
                    k = _Key(breaker)
                fresh[key] = k
                _, gen, state, succ, fail, rej = breaker._fleet(0, -1, 0, 0.0, 0)
                ds, df, dr = succ - k.succ, fail - k.fail, rej - k.rej
                k.succ, k.fail, k.rej, k.gen = succ, fail, rej, gen
                # the breaker's own verdict: tripped by itself, not held there by the fleet
                tripped = state in (1, 2) and gen != k.held
                reset = key in group.resets
                if ds or df or k.fleet_state or tripped or k.tripped or reset:
                    want = group.options.half_open_max_calls if (dr and k.fleet_state) else 0
                    args += (key, ds, df, want, int(tripped) | (2 if reset else 0))
                    sent.append((key, k))
                k.tripped = tripped
            for key in group.resets.difference(fresh):  # a key this instance does not hold
                args += (key, 0, 0, 0, 2)
            group.keys = fresh
            plan.append((group, args, sent))
        for b in list(self._budgets.values()):
            b.read = b.budget._fleet(0)
            # sent once: a failed sync drops it (the next one starts from what was read here)
            b.delta = 0 if b.level is None else b.read - b.level
            b.level = b.read
            plan.append((b, None, []))
        return plan

    def _script_args(self, plan: list[Any]) -> tuple[list[str], list[Any]]:
        budgets = [item[0] for item in plan if item[1] is None]
        keys: list[str] = []
        argv: list[Any] = [
            self._instance,
            self._node,
            int(self._window * 1000),
            self._min_instances,
            _BUCKETS,
            len(budgets),
            int((2 * self._interval + self._timeout) * 1000),  # how long a node's verdict holds
            _AHEAD_MS,
        ]
        for group, args, _sent in plan:
            if args is None:
                continue
            o = group.options
            keys.append(group.tag)
            argv += (
                group.since,
                len(args) // 5,
                repr(float(o.failure_rate)),
                o.min_calls,
                o.half_open_max_calls,
                o.success_threshold,
                max(1, o.reset_ns // 1_000_000),
                max(1, o.reset_ns // 1_000_000),
                _max_open_ms(o),
            )
            argv += args
        for b in budgets:
            keys.append(b.tag)
            argv += (b.delta, int(round(b.budget.capacity * _TOKEN_UNIT)))
        return keys, argv

    @staticmethod
    def _pair(batch: list[Any], reply: list[Any]) -> list[tuple[Any, Any]]:
        """The script answers the groups of a batch first, then its budgets."""
        ordered = [i for i in batch if i[1] is not None] + [i for i in batch if i[1] is None]
        return list(zip(ordered, reply))

    def _batches(self, plan: list[Any]) -> list[list[Any]]:
        """One batch in standalone Redis; in a Cluster, one per slot."""
        if not self._cluster:
            return [plan] if plan else []
        key_slot = self._lib("crc").key_slot
        by_slot: dict[int, list[Any]] = {}
        for item in plan:
            by_slot.setdefault(key_slot(item[0].tag.encode()), []).append(item)
        return list(by_slot.values())

    def _call_sync(self, plan: list[Any], deadline: float) -> list[Any]:
        replies: list[Any] = []
        for batch in self._batches(plan):
            keys, argv = self._script_args(batch)
            replies += self._pair(batch, self._eval_bounded(keys, argv, deadline))
        return replies

    async def _call_async(self, plan: list[Any]) -> list[Any]:
        NoScriptError = self._lib("exceptions").NoScriptError
        replies: list[Any] = []
        for batch in self._batches(plan):
            keys, argv = self._script_args(batch)
            try:
                reply = await self._client.evalsha(_SHA, len(keys), *keys, *argv)
            except NoScriptError:
                reply = await self._client.eval(SCRIPT, len(keys), *keys, *argv)
            replies += self._pair(batch, reply)
        return replies

    def _connection(self, first_key: str) -> Any:
        """The coordinator's own connection to the node of ``first_key``: the client's settings
        (address, credentials, TLS, protocol) with this coordinator's timeouts and no retries."""
        client = self._client
        if self._cluster:
            node = client.get_node_from_key(first_key)
            ident: Any = node.name
            client = node.redis_connection
        else:
            ident = None
        conn = self._conns.get(ident)
        if conn is None:
            NoBackoff = self._lib("backoff").NoBackoff
            Retry = self._lib("retry").Retry

            pool = client.connection_pool
            kwargs = dict(pool.connection_kwargs)
            kwargs.update(
                socket_timeout=self._timeout,
                socket_connect_timeout=self._timeout,
                retry=Retry(NoBackoff(), 0),
                health_check_interval=0,
            )
            kwargs.pop("retry_on_timeout", None)
            kwargs.pop("retry_on_error", None)
            conn = pool.connection_class(**kwargs)
            self._conns[ident] = conn
        return conn

    def _eval_bounded(self, keys: list[str], argv: list[Any], deadline: float) -> Any:
        errors = self._lib("exceptions")
        NoScriptError, RedisTimeout = errors.NoScriptError, errors.TimeoutError
        conn = self._connection(keys[0])
        try:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RedisTimeout("sync_timeout elapsed before the call")
            conn.socket_connect_timeout = left
            conn.socket_timeout = left
            conn.connect()
            try:
                conn.send_command("EVALSHA", _SHA, len(keys), *keys, *argv)
                return self._read(conn, deadline)
            except NoScriptError:
                conn.send_command("EVAL", SCRIPT, len(keys), *keys, *argv)
                return self._read(conn, deadline)
        except BaseException:
            # a reply that may still come must never be read as the next sync's
            conn.disconnect()
            raise

    def _read(self, conn: Any, deadline: float) -> Any:
        RedisTimeout = self._lib("exceptions").TimeoutError
        left = deadline - time.monotonic()
        if left <= 0:
            raise RedisTimeout("sync_timeout elapsed")
        try:
            return conn.read_response(timeout=left)
        except TypeError:  # an older client without read_response(timeout=)
            return conn.read_response()

    def _failed(self, plan: list[Any], exc: BaseException, start: float) -> SyncReport:
        self._syncs += 1
        self._failures += 1
        error = f"{type(exc).__name__}: {exc}"
        self._last_error = error
        sent = sum(len(p[2]) for p in plan)
        if not self._degraded:
            self._degraded = True
            _log.warning("fleet sync failed, local breakers only until Redis answers: %s", error)
            self._emit("degraded", error)
        return SyncReport(False, error, sent, 0, 0, time.monotonic() - start)

    def _finish(self, plan: list[Any], replies: list[Any], start: float) -> SyncReport:
        received = applied = 0
        for (group, args, _), reply in replies:
            if args is None:
                share = int(reply)  # the budget's share of the fleet's pool, in token units
                if share < 0:
                    self._bad(group.tag, "")
                    continue
                group.budget._fleet(share - group.read)
                group.level = share
                continue
            version, entries, bad, epoch = reply
            for key in bad:
                self._bad(group.tag, _text(key))
            epoch = _text(epoch)
            if epoch:
                if group.epoch and epoch != group.epoch:
                    self._lost(group)
                group.epoch = epoch
            group.since = int(version)
            group.resets.clear()
            for i in range(0, len(entries), 5):
                key = _text(entries[i])
                state, gen, rem, leases = (int(x) for x in entries[i + 1 : i + 5])
                received += 1
                applied += self._apply(group, key, state, gen, rem, leases)
        self._syncs += 1
        if self._degraded:
            self._degraded = False
            _log.warning("fleet sync succeeded again")
            self._emit("recovered", None)
        self._applied += applied
        sent = sum(len(p[2]) for p in plan)
        return SyncReport(True, None, sent, received, applied, time.monotonic() - start)

    def _bad(self, tag: str, key: str) -> None:
        """A malformed entry met in Redis: counted each time, logged once."""
        self._malformed += 1
        if (tag, key) not in self._logged and len(self._logged) < _LOGGED_MAX:
            self._logged.add((tag, key))
            what = f"key {key!r} of {tag}" if key else tag
            _log.warning("fleet: malformed entry in Redis, skipped (fix or delete it): %s", what)

    def _lost(self, group: _Group) -> None:
        """The server lost this group's data: its generations restart, possibly behind the
        ones applied before (a server clock behind); they are news all the same."""
        self._losses += 1
        _log.warning("fleet: Redis lost the state of %s; its generations restart", group.tag)
        for k in group.keys.values():
            k.fgen, k.leases = -1, 0

    def _next_fence(self) -> int:
        # The breaker's own fence only moves forward: feed it this process's monotonic clock
        # (never behind what an earlier coordinator fed it), while fleet generations (which
        # the server may restart) are compared here, in ``_apply``.
        self._fence = max(self._fence + 1, time.monotonic_ns())
        return self._fence

    def _apply(self, group: _Group, key: str, state: int, gen: int, rem: int, leases: int) -> int:
        k = group.keys.get(key)
        if k is None:
            breaker = group.lookup(key)
            if breaker is None:
                return 0  # a key this instance does not hold: it is not created for the fleet
            k = group.keys[key] = _Key(breaker)
            _, k.gen, _, k.succ, k.fail, k.rej = breaker._fleet(0, -1, 0, 0.0, 0)
        k.fleet_state = state
        options = group.options
        leases = max(0, min(leases, options.half_open_max_calls))
        if (gen, leases) <= (k.fgen, k.leases):
            return 0  # old news or a duplicate (a lease granted in the same generation is news)
        if state == 0:
            if k.held < 0 or k.held != k.gen:
                return 0  # not put there by the fleet: it recovers on its own
            result = k.breaker._fleet(self._next_fence(), k.gen, 0, 0.0, 0)
        elif state == 2 and leases:
            result = k.breaker._fleet(self._next_fence(), k.gen, 2, 0.0, leases)
        else:
            # never longer than the breaker's own longest open period, whatever Redis says
            rem = max(0, min(rem, _max_open_ms(options)))
            seconds = min(rem / 1000.0 + self._hold(options), 1e7)
            result = k.breaker._fleet(self._next_fence(), k.gen, 1, seconds, 0)
        if result[0]:
            k.held = result[1] if state else -1
            k.gen = result[1]
            k.fgen, k.leases = gen, leases
            return 1
        if result[1] != k.gen:
            self._stale += 1
        return 0

    def _lib(self, module: str) -> Any:
        """``redis.<module>`` or ``valkey.<module>``: the client's own library."""
        import importlib

        top = type(self._client).__module__.split(".")[0]
        return importlib.import_module(f"{top if top in ('redis', 'valkey') else 'redis'}.{module}")

    def _emit(self, event: str, error: Optional[str]) -> None:
        for callback in list(self._listeners):
            try:
                callback(self, event, error)
            except Exception:
                _log.exception("fleet event callback raised")

    def __repr__(self) -> str:
        return (
            f"<FleetCoordinator namespace={self._namespace!r} instance={self._instance!r} "
            f"groups={len(self._groups)} degraded={self._degraded}>"
        )


def _max_open_ms(options: Any) -> int:
    """The breaker's longest open period, in ms: the most the fleet may hold it OPEN."""
    return max(1, int(max(options.reset_ns, options.max_reset_ns)) // 1_000_000)


def _is_async_client(client: Any) -> bool:
    import inspect

    execute = getattr(client, "execute_command", None)
    return execute is not None and inspect.iscoroutinefunction(execute)
