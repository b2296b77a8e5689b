"""SharedRegion: breakers, retry budgets and bulkheads whose state lives in shared memory.

Every worker process of a host that asks one named region for the same object name gets the same
state: a trip in one worker is seen by the next ``allow()`` in every other, a retry budget is
spent once for the host, a bulkhead bounds the host's concurrency. The objects returned are the
ordinary classes (``CircuitBreaker``, ``RetryBudget``, ``Bulkhead``) of the core in use; only
their state lives in the region.

The segment (``multiprocessing.shared_memory``) has a fixed layout, and holds no pointers, only
offsets::

    0       header: magic, layout version, size, core, allocation cursor, entries used
    64      directory: DIR_ENTRIES entries of ENTRY_SIZE bytes (name, kind, offset, size,
            options hash, options text offset and length)
    DATA    the objects' state blocks and their options texts, allocated upward, never freed

The directory changes under an exclusive ``fcntl`` record lock on its first byte (plus a thread
lock, since record locks belong to a process). The kernel drops a record lock when its process
dies, so a worker killed while it adds an object stops no one. An object is written completely
(state initialised, options text stored) before its entry is, so a process that finds a name
finds a whole object. Objects are found once, when a process asks for them; the hot paths never
touch the directory.

Options: each object's options that define what its shared state means (thresholds, windows,
durations, exception types by qualified name) are stored as text with a hash; asking for a name
with other options is a ``ValueError`` naming the first option that differs. Options that are
per process by nature (callbacks, a predicate's identity, the clock) stay per process.

The compiled core changes the state with the same C atomics as a local object (they work on
memory shared between processes). The pure-Python twin keeps each state block as two copies and
a selector under a record lock (``RecordLock``): a writer fills the copy not in use and flips the
selector, so a process killed in the middle of a write leaves the previous state whole, and its
lock is released by the kernel.
"""

from __future__ import annotations

import errno
import gc
import hashlib
import os
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any, Optional, cast

from ._keywords import checks_keywords
from ._process import lock_holder, stopped

if TYPE_CHECKING:
    from ._breaker_py import CircuitBreaker
    from ._budget_py import RetryBudget
    from ._bulkhead_py import Bulkhead
    from ._map_py import BreakerMap
    from ._ratelimit import RateSpec
    from ._ratelimit_py import RateLimiter, RateLimiterMap

__all__ = [
    "LAYOUT_VERSION",
    "RecordLock",
    "SharedRecord",
    "SharedRegion",
    "region_class",
]

MAGIC = 0x4E4F494745524246  # b"FBREGION", little-endian
LAYOUT_VERSION = 2  # 2 (issue 26): owner words survive pid reuse; rarer counts moved
"""The layout version written in the header; attaching to another version is a ValueError."""

HEADER_SIZE = 64
DIR_ENTRIES = 255
ENTRY_SIZE = 128
NAME_MAX = 63
"""Object names are at most 63 bytes of UTF-8."""
DATA = HEADER_SIZE + DIR_ENTRIES * ENTRY_SIZE  # 32,704
DATA = (DATA + 63) & ~63  # 32,768
MIN_SIZE = DATA + 4096
MAX_SIZE = 1 << 40
ALIGN = 64  # each block starts on its own cache line

# header fields (int64 each)
_H_MAGIC, _H_VERSION, _H_SIZE, _H_CORE, _H_CURSOR, _H_ENTRIES = range(0, 48, 8)
# directory entry: name (64 bytes, NUL padded), then int64 fields
_E_KIND, _E_OFFSET, _E_NBYTES, _E_HASH, _E_OPTS, _E_OPTS_LEN = range(64, 112, 8)

KIND_BREAKER, KIND_MAP, KIND_BUDGET, KIND_BULKHEAD = 1, 2, 3, 4
KIND_RATE, KIND_RATE_MAP = 5, 6
KIND_LIMITS = 7  # contrib.limits' table (_region_limits)
_KIND_NAMES = {
    KIND_BREAKER: "breaker",
    KIND_MAP: "breaker_map",
    KIND_BUDGET: "retry_budget",
    KIND_BULKHEAD: "bulkhead",
    KIND_RATE: "rate_limiter",
    KIND_RATE_MAP: "rate_limiter_map",
    KIND_LIMITS: "limits_storage",
}
_CORES = {"c": 1, "python": 2}

# The longest region name: POSIX shared memory names are one path component; macOS allows 31
# bytes with the leading slash (PSHMNAMLEN), Linux 255 (NAME_MAX).
REGION_NAME_MAX = 30 if sys.platform == "darwin" else 250

_i64 = struct.Struct("<q")


def _get(buf: memoryview, offset: int) -> int:
    return int(_i64.unpack_from(buf, offset)[0])


def _put(buf: memoryview, offset: int, value: int) -> None:
    _i64.pack_into(buf, offset, value)


def _check_name(name: object, what: str, limit: int) -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {name!r}")
    raw = name.encode("utf-8")
    if not raw or "\x00" in name or "/" in name:
        raise ValueError(f"{what} must be a non-empty str without '/' or NUL, got {name!r}")
    if len(raw) > limit:
        raise ValueError(
            f"{what} must be at most {limit} bytes of UTF-8 on this platform, got {len(raw)} "
            f"({name!r})"
        )
    return raw


LOCK_TIMEOUT = 0.1
"""The longest a process waits for a region lock held by another process (seconds); the
directory's lock (creating and finding objects) waits ``DIR_LOCK_TIMEOUT``. Past it the holder
is taken as stopped or stuck: what needs the lock goes on without it as docs/shared-memory.md
says, or raises ``SharedStateTimeout``. After a timeout, the same lock is tried once, without
waiting, until it is taken again, so callers do not wait one bound each behind a process that
stays stopped."""
DIR_LOCK_TIMEOUT = 2.0
LOCK_STUCK_TIMEOUT = 2.0
"""The longest a process waits for a region lock whose holder is not seen stopped: on Linux a
holder that runs (descheduled on a busy machine, not stopped) is waited for up to this bound, so
that load alone never drops an outcome; where a holder's state cannot be read, every holder is
waited for this long before the lock counts as stalled."""


class RecordLock:
    """An exclusive lock on one byte of a segment, for threads and processes alike, with a
    bounded wait (``LOCK_TIMEOUT``, or ``timeout`` seconds): ``SharedStateTimeout`` past it.

    A thread lock orders the threads of this process; an ``fcntl`` record lock (which belongs to
    the process, and is released by the kernel when the process dies) orders the processes. The
    record lock is asked for without blocking and asked again with a growing pause (1 us to
    1 ms), so a process never blocks in the kernel on a holder that is stopped.
    """

    __slots__ = ("_fd", "_offset", "_thread_lock", "_timeout", "_where", "_stalled")

    def __init__(
        self, fd: int, offset: int, timeout: Optional[float] = None, where: str = ""
    ) -> None:
        self._fd = fd
        self._offset = offset
        self._thread_lock = threading.Lock()
        self._timeout = timeout
        self._where = where
        self._stalled = False  # the last wait timed out: try once, until the lock is taken

    def __enter__(self) -> None:
        self._enter(False)

    def enter_or_stall(self) -> bool:
        """Like ``with``, but when another process holds the record lock past the bound, hold
        only the thread lock and return False (then ``leave_stalled()``, not ``__exit__``)."""
        return self._enter(True)

    def leave_stalled(self) -> None:
        self._thread_lock.release()

    def _enter(self, stall_ok: bool) -> bool:
        import fcntl

        bound = LOCK_TIMEOUT if self._timeout is None else self._timeout
        start = time.monotonic()
        deadline = start if self._stalled else start + bound
        stuck = start + max(bound, LOCK_STUCK_TIMEOUT)  # for a holder not seen stopped
        # The threads of this process wait for each other without a bound of their own: a
        # holder's wait for another process is bounded, and its work under the lock is short.
        self._thread_lock.acquire()
        delay = 1e-6
        try:
            while True:
                try:
                    fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, self._offset)
                    self._stalled = False
                    return True
                except OSError as exc:
                    # EAGAIN/EACCES: another process holds it. EDEADLK: the kernel's deadlock
                    # detection takes the process as a lock's owner, and process A asking for a
                    # lock of B while another thread of A holds one B waits for looks like a
                    # cycle. It is not one (a holder never waits for a second lock): retry.
                    if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EDEADLK):
                        raise
                now = time.monotonic()
                if now >= deadline and deadline < stuck and not self._holder_stopped():
                    deadline = stuck  # it runs (a busy machine): wait for it, up to the bound
                if now >= deadline:
                    self._stalled = True
                    if stall_ok:
                        return False
                    raise self._timed_out(max(bound, deadline - start))
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 1e-3)
        except BaseException:
            self._thread_lock.release()
            raise

    def _holder_stopped(self) -> bool:
        """Whether the process holding the record lock is seen stopped (Linux)."""
        pid = lock_holder(self._fd, self._offset)
        return pid > 0 and stopped(pid)

    def _timed_out(self, bound: float) -> Exception:
        from ._errors import SharedStateTimeout

        return SharedStateTimeout(
            f"{self._where or 'a lock of a shared region'}: held by another process for more "
            f"than {bound:g} s (it is stopped or stuck)"
        )

    def __exit__(self, *exc: object) -> None:
        import fcntl

        try:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, self._offset)
        finally:
            self._thread_lock.release()


class SharedRecord:
    """A fixed-size record in a segment kept as two copies and a selector (the pure-Python
    twin's state blocks): ``store`` fills the copy not in use, then flips the selector with one
    aligned 8-byte store, so a reader under the record's lock always finds a whole record, even
    after a writer was killed halfway. Use only under the record's ``RecordLock``."""

    __slots__ = ("_view", "_size")

    def __init__(self, view: memoryview, size: int) -> None:
        if len(view) < self.footprint(size):
            raise ValueError("the record's view is too small")
        self._view = view
        self._size = size

    @staticmethod
    def footprint(size: int) -> int:
        """The bytes a record of ``size`` bytes takes in the segment."""
        return 8 + 2 * ((size + 7) & ~7)

    def _copy(self, which: int) -> int:
        return 8 + which * ((self._size + 7) & ~7)

    def load(self) -> bytes:
        which = _get(self._view, 0) & 1
        start = self._copy(which)
        return bytes(self._view[start : start + self._size])

    def store(self, data: bytes) -> None:
        if len(data) != self._size:
            raise ValueError(f"a record of {self._size} bytes, got {len(data)}")
        which = (_get(self._view, 0) & 1) ^ 1
        start = self._copy(which)
        self._view[start : start + self._size] = data
        _put(self._view, 0, which)


def _canonical(value: Any) -> str:
    """The text of one option value, the same in every process."""
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_canonical(v) for v in value) + ")"
    if callable(value):
        module = getattr(value, "__module__", "?")
        return f"<callable {module}.{getattr(value, '__qualname__', type(value).__qualname__)}>"
    return repr(value)


def options_text(options: dict[str, Any]) -> str:
    """The options of an object as stored in the region: one ``name=value`` line each."""
    return "\n".join(f"{k}={_canonical(v)}" for k, v in options.items())


class _Segment:
    """One mapping of a named segment per process, shared by the SharedRegion objects of this
    process that name it (record locks belong to the process: closing a second descriptor of
    the same file would drop the first one's locks)."""

    def __init__(self, shm: shared_memory.SharedMemory, name: str) -> None:
        self.shm = shm
        assert shm.buf is not None
        self.buf: memoryview = shm.buf
        self.users = 0
        self.lock_file = -1
        fd = _lockable_fd(shm, name)
        if fd != getattr(shm, "_fd", -1):
            self.lock_file = fd
        self.fd = fd
        self.dir_lock = RecordLock(
            fd, 0, DIR_LOCK_TIMEOUT, f"the directory of the shared region {name!r}"
        )
        self.locks: dict[int, RecordLock] = {}
        self.live = 0  # objects made from this mapping and still alive
        self.name = name
        self.unmapped = False

    def release_if_unused(self) -> None:
        """Unmap the segment once no region object of this process and no object made by one
        uses it (called with _segments_lock held)."""
        if self.users > 0 or self.live > 0 or self.unmapped:
            return
        try:
            self.shm.close()
        except BufferError:
            # A view of the mapping outlived its object (one in a reference cycle that the
            # collector is still freeing; on a free-threaded build, one freed a moment late):
            # map it again, so that nothing is left half closed, and try again after the next
            # collection.
            self.shm._buf = self.buf = memoryview(self.shm._mmap)  # type: ignore[attr-defined]
            _retry_after_gc(self)
            return
        _pending.discard(self)
        self.unmapped = True
        if self.lock_file >= 0:
            os.close(self.lock_file)
        if _segments.get(self.name) is self:
            del _segments[self.name]

    def object_gone(self) -> None:
        with _segments_lock:
            self.live -= 1
            self.release_if_unused()

    def lock_at(self, offset: int) -> RecordLock:
        lock = self.locks.get(offset)
        if lock is None:
            where = f"the lock at offset {offset} of the shared region {self.name!r}"
            lock = self.locks.setdefault(offset, RecordLock(self.fd, offset, None, where))
        return lock


def region_of(lock: object) -> str:
    """The name of the region whose ``RecordLock`` is ``lock`` (for errors), else "?"."""
    fd = getattr(lock, "_fd", None)
    for name, seg in list(_segments.items()):
        if seg.fd == fd:
            return name
    return "?"


FORCE_LOCK_FILE = False
"""Tests: lock a lock file beside the segment even where the segment itself can be locked (every
process of the region must then set it: they must all lock the same file)."""


def lock_file_path(name: str) -> str:
    """Where the record locks of region ``name`` live when its segment cannot be locked (macOS
    refuses record locks on POSIX shared memory): a file in the temporary directory."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"fastbreaker-region-{name}.lock")


def _lockable_fd(shm: shared_memory.SharedMemory, name: str) -> int:
    """A descriptor whose fcntl record locks every process of the region shares: the segment's
    own (Linux), else the region's lock file (macOS)."""
    import fcntl

    fd = getattr(shm, "_fd", -1)
    if fd >= 0 and not FORCE_LOCK_FILE:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
            return int(fd)
        except BlockingIOError:
            return int(fd)  # another process holds it: it works
        except OSError:
            pass
    try:
        return os.open(lock_file_path(name), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise OSError(
            f"SharedRegion needs record locks: neither the segment nor {lock_file_path(name)!r} "
            f"can be locked here ({exc})"
        ) from exc


_pending: set[_Segment] = set()


def _retry_after_gc(seg: _Segment) -> None:
    if not _pending:
        gc.callbacks.append(_sweep)
    _pending.add(seg)


def _sweep(phase: str, info: dict[str, Any]) -> None:
    """A gc callback while some segment waits to be unmapped: try again after a collection."""
    if phase != "stop" or not _segments_lock.acquire(blocking=False):
        return
    try:
        for seg in list(_pending):
            seg.release_if_unused()
            if seg.unmapped or seg.users or seg.live:
                _pending.discard(seg)
        if not _pending and _sweep in gc.callbacks:
            gc.callbacks.remove(_sweep)
    finally:
        _segments_lock.release()


_segments: dict[str, _Segment] = {}
# Re-entrant: an object made by a region can be freed (and tell its segment) while this thread
# holds the lock.
_segments_lock = threading.RLock()


def _after_fork_in_child() -> None:
    # A thread of the parent may have held these locks at the fork; the child has one thread.
    global _segments_lock
    _segments_lock = threading.RLock()
    for seg in _segments.values():
        seg.dir_lock._thread_lock = threading.Lock()
        for lock in seg.locks.values():
            lock._thread_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _untrack(shm: shared_memory.SharedMemory) -> None:
    """Keep multiprocessing's resource tracker away from the segment: before Python 3.13 it
    unlinks every segment a process created or attached to when that process exits, which would
    destroy the region under the other workers. The region is unlinked only by ``unlink()``."""
    if sys.version_info >= (3, 13):
        return
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    except Exception:
        pass


class _Mapping(shared_memory.SharedMemory):
    """A SharedMemory that stays quiet when it is collected while objects still use it (at
    interpreter exit, with shared breakers alive): the OS unmaps it with the process."""

    def __del__(self) -> None:
        try:
            self.close()
        except (BufferError, OSError):
            pass


def _open(
    name: str, size: int, create: bool, trust_foreign: bool
) -> tuple[shared_memory.SharedMemory, bool]:
    import _posixshmem  # type: ignore[import-not-found]

    # Created (or found) and sized here, not by SharedMemory(create=True): its creator sizes the
    # segment after creating it, so a creator killed in between leaves an empty segment that
    # nobody could attach to. Here whoever finds it empty sizes it, under the lock that every
    # process of the region takes on its first byte: a creator killed before sizing leaves a
    # segment that the next process takes over, and a live one is never sized twice.
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    try:
        fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no shared region named {name!r}: create it first (create=True)"
        ) from None
    try:
        st = os.fstat(fd)
        if not trust_foreign:
            _check_owner(name, st)
        if st.st_size == 0:
            _size_empty(fd, name, size, create)
        elif create and st.st_size < size:
            raise ValueError(
                f"the shared region {name!r} exists with {st.st_size} bytes, fewer than the "
                f"size={size} asked: it is left over from a run with a smaller size; "
                f"{_remove_hint(name)}, or ask for size={st.st_size}"
            )
    finally:
        os.close(fd)  # this process holds no record lock on the segment yet: none is dropped
    kwargs: dict[str, Any] = {"track": False} if sys.version_info >= (3, 13) else {}
    shm = _Mapping(name, create=False, **kwargs)
    _untrack(shm)
    return shm, st.st_size == 0


def _remove_hint(name: str) -> str:
    """How to remove the segment ``name`` (once no process uses it)."""
    hint = f"remove it once no process uses it: SharedRegion.unlink_name({name!r})"
    if sys.platform.startswith("linux"):
        hint += f" (or: rm /dev/shm/{name})"
    return hint


def _check_owner(name: str, st: os.stat_result) -> None:
    """Refuse a segment that another user owns or may write: whoever can write it can trip,
    isolate or reset every breaker in it through the public API."""
    mode = st.st_mode & 0o777
    if st.st_uid == os.geteuid() and not mode & 0o022:
        return
    try:
        import pwd

        owner = f"user {pwd.getpwuid(st.st_uid).pw_name!r} (uid {st.st_uid})"
    except (ImportError, KeyError):
        owner = f"uid {st.st_uid}"
    raise PermissionError(
        f"the shared memory segment {name!r} belongs to {owner} with mode {mode:04o}, and this "
        f"process runs as uid {os.geteuid()}: a segment owned by another user, or writable by "
        "group or others, lets them change every object in it. SharedRegion refuses it; "
        f"{_remove_hint(name)}, or pass trust_foreign=True "
        "if it is shared on purpose"
    )


def _size_empty(fd: int, name: str, size: int, create: bool) -> None:
    """Size the empty segment ``fd`` to ``size`` bytes under its lock (see ``_open``); without
    ``create``, wait a moment for its creator instead, then say what to do."""
    import fcntl

    lock_fd = fd
    if FORCE_LOCK_FILE:
        lock_fd = os.open(lock_file_path(name), os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + (2.0 if create else 0.5)
    try:
        while True:
            try:
                fcntl.lockf(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            except (BlockingIOError, PermissionError):
                pass  # held by a process sizing or initialising it: try again
            except OSError:
                if lock_fd != fd:
                    raise
                # the segment cannot be locked here (macOS): its lock file
                lock_fd = os.open(lock_file_path(name), os.O_RDWR | os.O_CREAT, 0o600)
                continue
            else:
                try:
                    if os.fstat(fd).st_size:
                        return  # sized by another process meanwhile
                    if create:
                        os.ftruncate(fd, size)
                        return
                finally:
                    fcntl.lockf(lock_fd, fcntl.LOCK_UN, 1, 0)
            if time.monotonic() > deadline:
                raise ValueError(
                    f"the shared region {name!r} exists but is empty: its creator died before "
                    f"sizing it (or holds its lock). SharedRegion({name!r}, create=True) takes "
                    f"it over; or {_remove_hint(name)}"
                )
            time.sleep(0.001)
    finally:
        if lock_fd != fd:
            os.close(lock_fd)


@checks_keywords
class SharedRegion:
    """A named shared-memory segment holding breakers, retry budgets and bulkheads that every
    process of the host can share.

    ``SharedRegion(name, *, size=1 << 20, create=True)``: the first process creates the segment
    (``size`` bytes, at least 36 KiB), the others attach to it (their ``size`` is not used);
    ``create=False`` only attaches (``FileNotFoundError`` if there is none). Then
    ``region.breaker(name, ...)``, ``region.breaker_map(name, *, capacity, ...)``,
    ``region.retry_budget(name, ...)``, ``region.bulkhead(name, max_concurrent)``,
    ``region.rate_limiter(name, *rates)`` and ``region.rate_limiter_map(name, *rates,
    capacity)`` return the ordinary objects, their state in the region: the same name gives the
    same state in every process. ``clock`` (tests) is the clock of the objects made, which every
    process must share (default: ``CLOCK_MONOTONIC``, the same for every process of the host).

    ``close()`` ends this region object; the segment is unmapped in this process once the
    objects it made are gone too. ``unlink()`` removes the segment's name (the processes that
    have it mapped keep it until they close it). Not available on Windows (``OSError``).

    Leftovers and other users: an empty segment (its creator died before sizing it) is taken
    over by ``create=True``. A segment smaller than the ``size`` asked with ``create=True`` is a
    ``ValueError`` that says how to remove it (``SharedRegion.unlink_name(name)``). A segment
    owned by another user, or writable by group or others, is a ``PermissionError`` naming its
    owner and mode (whoever can write it can trip or isolate its breakers), unless
    ``trust_foreign=True``.
    """

    _core = "python"

    def __init__(
        self,
        name: str,
        *,
        size: int = 1 << 20,
        create: bool = True,
        clock: Optional[Callable[[], int]] = None,
        trust_foreign: bool = False,
    ) -> None:
        if sys.platform == "win32":
            raise OSError(
                "SharedRegion needs POSIX shared memory and process record locks: it is not "
                "available on Windows"
            )
        _check_name(name, "name", REGION_NAME_MAX)
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"size must be an int in [{MIN_SIZE}, 2**40], got {size!r}")
        if not MIN_SIZE <= size <= MAX_SIZE:
            raise ValueError(f"size must be an int in [{MIN_SIZE}, 2**40], got {size!r}")
        if not isinstance(create, bool):
            raise TypeError(f"create must be True or False, got {create!r}")
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be a zero-argument callable or None, got {clock!r}")
        if not isinstance(trust_foreign, bool):
            raise TypeError(f"trust_foreign must be True or False, got {trust_foreign!r}")
        self._name = name
        self._clock = clock
        self._trust_foreign = trust_foreign
        self._closed = True
        with _segments_lock:
            seg = _segments.get(name)
            if seg is None:
                shm, _ = _open(name, size, create, trust_foreign)
                try:
                    seg = _Segment(shm, name)
                    with seg.dir_lock:
                        self._init_or_check(seg.buf)
                except BaseException:
                    shm.close()
                    raise
                _segments[name] = seg
            else:
                with seg.dir_lock:
                    self._init_or_check(seg.buf)
            seg.users += 1
        self._seg = seg
        self._closed = False

    def _init_or_check(self, buf: memoryview) -> None:
        magic = _get(buf, _H_MAGIC)
        if magic == 0:
            # New (the creator, or the first process to lock it): the memory is zero-filled.
            if len(buf) < MIN_SIZE:
                raise ValueError(f"the segment has {len(buf)} bytes, fewer than {MIN_SIZE}")
            _put(buf, _H_VERSION, LAYOUT_VERSION)
            _put(buf, _H_SIZE, len(buf))
            _put(buf, _H_CORE, _CORES[self._core])
            _put(buf, _H_CURSOR, DATA)
            _put(buf, _H_MAGIC, MAGIC)
            return
        if magic != MAGIC:
            raise ValueError(f"shared memory {self._name!r} is not a fastbreaker region")
        version = _get(buf, _H_VERSION)
        if version != LAYOUT_VERSION:
            raise ValueError(
                f"the shared region {self._name!r} has layout version {version}; this "
                f"fastbreaker uses layout version {LAYOUT_VERSION} (every process of a host "
                "must run the same fastbreaker)"
            )
        core = _get(buf, _H_CORE)
        if core != _CORES[self._core]:
            other = {v: k for k, v in _CORES.items()}.get(core, str(core))
            raise ValueError(
                f"the shared region {self._name!r} was made by the {other!r} core and this "
                f"process uses the {self._core!r} core (FASTBREAKER_NO_EXTENSIONS must be the "
                "same in every process)"
            )

    # -- lifecycle ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The segment's name, as given."""
        return self._name

    @property
    def size(self) -> int:
        """The segment's size in bytes."""
        return len(self._buf)

    @property
    def used(self) -> int:
        """Bytes allocated so far (header and directory included)."""
        return _get(self._buf, _H_CURSOR)

    @property
    def _buf(self) -> memoryview:
        if self._closed:
            raise ValueError(f"the shared region {self._name!r} is closed")
        return self._seg.buf

    def close(self) -> None:
        """This region object is done (a no-op if closed): it makes no more objects. The segment
        is unmapped in this process once the objects it made are gone too (they keep working
        until then: their state is in the mapping)."""
        if self._closed:
            return
        with _segments_lock:
            self._closed = True
            self._seg.users -= 1
            self._seg.release_if_unused()

    def unlink(self) -> None:
        """Remove the segment's name (``FileNotFoundError`` if it is already gone); processes
        that have it mapped keep using it."""
        self.unlink_name(self._name)

    @staticmethod
    def unlink_name(name: str) -> None:
        """Remove the segment named ``name`` without attaching to it (``FileNotFoundError`` if
        there is none): a leftover that cannot be attached (one smaller than the ``size=``
        asked, or another user's). Processes that have it mapped keep using it."""
        import _posixshmem

        _check_name(name, "name", REGION_NAME_MAX)
        _posixshmem.shm_unlink("/" + name)
        try:
            os.unlink(lock_file_path(name))
        except FileNotFoundError:
            pass

    def __enter__(self) -> "SharedRegion":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.used}/{self.size} bytes used"
        return f"<SharedRegion {self._name!r} ({self._core} core) {state}>"

    def __reduce__(self) -> Any:
        # A region crosses to a spawned process as its name: it attaches there.
        return (_attach, (type(self)._core, self._name, self._clock, self._trust_foreign))

    # -- the directory ---------------------------------------------------------------------------
    def _entries(self) -> Iterator[tuple[int, bytes]]:
        buf = self._buf
        for i in range(_get(buf, _H_ENTRIES)):
            at = HEADER_SIZE + i * ENTRY_SIZE
            yield at, bytes(buf[at : at + 64]).rstrip(b"\x00")

    def objects(self) -> dict[str, str]:
        """The objects in the region: ``{name: kind}``."""
        with self._seg.dir_lock:
            buf = self._buf
            return {
                raw.decode(): _KIND_NAMES.get(_get(buf, at + _E_KIND), "?")
                for at, raw in self._entries()
            }

    def _object(
        self,
        kind: int,
        name: str,
        options: dict[str, Any],
        nbytes: int,
        init: Callable[[memoryview], None],
    ) -> tuple[int, bool]:
        """The offset of object ``name`` (made with ``init`` on zeroed memory if new), and
        whether this call made it."""
        raw = _check_name(name, "name", NAME_MAX)
        _ = self._buf  # closed: ValueError
        text = options_text(options).encode()
        digest = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1
        with self._seg.dir_lock:
            buf = self._buf
            for at, found in self._entries():
                if found != raw:
                    continue
                found_kind = _get(buf, at + _E_KIND)
                if found_kind != kind:
                    raise ValueError(
                        f"{name!r} in the shared region {self._name!r} is a "
                        f"{_KIND_NAMES.get(found_kind, '?')}, not a {_KIND_NAMES[kind]}"
                    )
                if _get(buf, at + _E_HASH) != digest:
                    start, length = _get(buf, at + _E_OPTS), _get(buf, at + _E_OPTS_LEN)
                    theirs = bytes(buf[start : start + length]).decode()
                    raise ValueError(_differing(name, self._name, theirs, text.decode()))
                return _get(buf, at + _E_OFFSET), False
            used = _get(buf, _H_ENTRIES)
            if used >= DIR_ENTRIES:
                raise ValueError(
                    f"the shared region {self._name!r} holds {DIR_ENTRIES} objects, its most"
                )
            cursor = _get(buf, _H_CURSOR)
            offset = (cursor + ALIGN - 1) & ~(ALIGN - 1)
            opts_at = offset + ((nbytes + ALIGN - 1) & ~(ALIGN - 1))
            end = opts_at + len(text)
            if end > len(buf):
                raise ValueError(
                    f"the shared region {self._name!r} is too small for {_KIND_NAMES[kind]} "
                    f"{name!r}: it needs {end - cursor} more bytes and has {len(buf) - cursor} "
                    f"free (size={len(buf)}); create the region with a larger size (first "
                    f"{_remove_hint(self._name)})"
                )
            init(buf[offset : offset + nbytes])
            buf[opts_at:end] = text
            at = HEADER_SIZE + used * ENTRY_SIZE
            buf[at : at + 64] = raw.ljust(64, b"\x00")
            for field, value in (
                (_E_KIND, kind),
                (_E_OFFSET, offset),
                (_E_NBYTES, nbytes),
                (_E_HASH, digest),
                (_E_OPTS, opts_at),
                (_E_OPTS_LEN, len(text)),
            ):
                _put(buf, at + field, value)
            _put(buf, _H_CURSOR, end)
            _put(buf, _H_ENTRIES, used + 1)  # published: the entry is whole
            return offset, True

    def _view(self, offset: int, nbytes: int) -> memoryview:
        return self._buf[offset : offset + nbytes]

    def _lock_at(self, offset: int) -> RecordLock:
        return self._seg.lock_at(offset)

    # -- the objects (each core fills these in: see region_class) ------------------------------
    def breaker(self, name: str, /, *args: Any, **options: Any) -> "CircuitBreaker":
        """The shared ``CircuitBreaker`` ``name`` (also its name), with every CircuitBreaker
        option but ``name`` and ``clock`` (positional ``args`` and keyword ``options``); the same
        options in every process."""
        return self._breaker_of(self._cores()[0], name, args, options)  # type: ignore[no-any-return]

    def _breaker_of(self, core: Any, name: str, args: Any, options: dict[str, Any]) -> Any:
        """``breaker()`` with the breaker core module ``core`` (tests: a racy build)."""
        from ._options import BreakerOptions
        from ._region_map import BANNED_OPTIONS, breaker_key

        for banned in ("name", "clock"):
            if banned in options:
                raise TypeError(f"region.breaker() takes no {banned!r}: {BANNED_OPTIONS[banned]}")
        validated = BreakerOptions(*args, name=name, clock=self._clock, **options)
        nbytes = core.shared_size(validated)
        offset, _ = self._object(
            KIND_BREAKER,
            name,
            breaker_key(validated),
            nbytes,
            lambda view: core.shared_init(view, validated),
        )
        return self._made(
            core.CircuitBreaker._shared(
                core.Config(validated), name, self._view(offset, nbytes), self._lock_at(offset)
            )
        )

    def _made(self, obj: Any) -> Any:
        seg = self._seg
        with _segments_lock:
            seg.live += 1
        gone = weakref.finalize(obj, seg.object_gone)
        gone.atexit = False  # at exit the process unmaps everything; objects may still run
        return obj

    def breaker_map(
        self, name: str, /, *args: Any, capacity: int, max_open_ratio: float = 1.0, **options: Any
    ) -> "BreakerMap":
        """The shared ``BreakerMap`` ``name``: at most ``capacity`` str or bytes keys (up to 239
        bytes), one breaker each, shared by every process; every BreakerMap option but
        ``max_keys`` and ``clock`` (positional ``args``, keyword ``options``, and
        ``max_open_ratio``, which holds across all processes). See ``_region_map`` for the
        table and its eviction."""
        from ._region_map import breaker_map

        return cast("BreakerMap", breaker_map(self, name, args, capacity, max_open_ratio, options))

    def retry_budget(
        self, name: str, *, ratio: float = 0.1, capacity: float = 100.0, min_per_sec: float = 1.0
    ) -> "RetryBudget":
        """The shared ``RetryBudget`` ``name``: one token bucket for every process, with the
        ``RetryBudget`` options ``ratio``, ``capacity`` and ``min_per_sec``."""
        from ._options import budget_units

        deposit, cap, rate = budget_units(ratio, capacity, min_per_sec)  # validates
        core = self._cores()[1]
        nbytes = core.shared_size()
        offset, _ = self._object(
            KIND_BUDGET,
            name,
            {"ratio": deposit, "capacity": cap, "min_per_sec": rate},
            nbytes,
            lambda view: core.shared_init(view, cap, self._clock),
        )
        budget = core.RetryBudget._shared(
            ratio,
            capacity,
            min_per_sec,
            self._clock,
            self._view(offset, nbytes),
            self._lock_at(offset),
        )
        return cast("RetryBudget", self._made(budget))

    def bulkhead(self, name: str, max_concurrent: int) -> "Bulkhead":
        """The shared ``Bulkhead`` ``name``: at most ``max_concurrent`` calls at once over every
        process. It never waits (``max_wait=0``): a waiter in one process cannot be woken by a
        release in another without polling. A slot records the process that holds it; when a
        ``try_acquire()`` finds every slot taken, it frees the slots of processes that no longer
        exist (at most once every 100 ms)."""
        from ._bulkhead import check_bulkhead

        check_bulkhead(max_concurrent, 0.0, None, None, None)
        core = self._cores()[2]
        nbytes = core.shared_size(max_concurrent)
        offset, _ = self._object(
            KIND_BULKHEAD,
            name,
            {"max_concurrent": max_concurrent},
            nbytes,
            lambda view: core.shared_init(view, max_concurrent),
        )
        bulkhead = core.Bulkhead._shared(
            max_concurrent, name, self._clock, self._view(offset, nbytes), self._lock_at(offset)
        )
        return cast("Bulkhead", self._made(bulkhead))

    def rate_limiter(self, name: str, /, *rates: "RateSpec") -> "RateLimiter":
        """The shared ``RateLimiter`` ``name`` (also its name) over ``rates``: one limit for
        every process. Its TAT words live in the region (one CAS each in the compiled core, so a
        process killed at any point leaves no claim behind); its metrics are this process's."""
        from ._region_ratelimit import rate_limiter

        return rate_limiter(self, name, rates)

    def rate_limiter_map(self, name: str, /, *rates: "RateSpec", capacity: int) -> "RateLimiterMap":
        """The shared ``RateLimiterMap`` ``name`` over ``rates``: at most ``capacity`` str or
        bytes keys (up to 239 bytes), each key's limit shared by every process. A full map gives
        a new key the slot of an idle key, else of the least recently used; ``metrics()`` counts
        keys and evictions of every process, requests admitted and rejected by this one. See
        ``_region_ratelimit``."""
        from ._region_ratelimit import rate_limiter_map

        return rate_limiter_map(self, name, rates, capacity)

    def _cores(self) -> tuple[Any, Any, Any]:
        if self._core == "c":
            from . import _breaker_c, _budget_c, _bulkhead_c

            return _breaker_c, _budget_c, _bulkhead_c
        from . import _breaker_py, _budget_py, _bulkhead_py

        return _breaker_py, _budget_py, _bulkhead_py


def _differing(name: str, region: str, theirs: str, ours: str) -> str:
    a = dict(line.split("=", 1) for line in theirs.splitlines())
    b = dict(line.split("=", 1) for line in ours.splitlines())
    for option in list(a) + [k for k in b if k not in a]:
        if a.get(option) != b.get(option):
            return (
                f"{name!r} exists in the shared region {region!r} with {option}="
                f"{a.get(option, '(unset)')}, asked with {option}={b.get(option, '(unset)')}: "
                "every process must ask with the same options"
            )
    return f"{name!r} exists in the shared region {region!r} with other options"


_bound: dict[str, type[SharedRegion]] = {}


def region_class(core: str) -> type[SharedRegion]:
    """The SharedRegion class whose objects come from ``core`` (``"c"`` or ``"python"``)."""
    if core not in _CORES:
        raise ValueError(f"core must be 'c' or 'python', got {core!r}")
    cls = _bound.get(core)
    if cls is None:
        cls = type("SharedRegion", (SharedRegion,), {"_core": core, "__module__": __name__})
        cls = _bound.setdefault(core, cls)
    return cls


def _attach(core: str, name: str, clock: Any, trust_foreign: bool = False) -> SharedRegion:
    return region_class(core)(name, create=False, clock=clock, trust_foreign=trust_foreign)


def default_class() -> type[SharedRegion]:
    from ._select import COMPILED

    return region_class("c" if COMPILED else "python")


__all__ += ["default_class", "options_text"]
