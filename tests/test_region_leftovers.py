"""SharedRegion and the segments it finds under its name: another user's, an empty one left by
a creator that died before sizing it, a smaller one left by an earlier run, and a state block
written by something other than fastbreaker.

The segments are made as the adversary or the dead process would make them: with ``os.open``
on ``/dev/shm`` (Linux), ``fchown`` to another uid (the tests run as root there), or a child
process killed between creating and sizing.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import struct
import sys
import types
import uuid
from collections.abc import Iterator

import pytest

from fastbreaker import _region

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="makes /dev/shm files"),
    pytest.mark.thread_unsafe(reason="starts processes and maps named segments"),
]

SIZE = _region.MIN_SIZE


@pytest.fixture
def name() -> Iterator[str]:
    n = "fbl-" + uuid.uuid4().hex[:12]
    yield n
    try:
        _region.SharedRegion.unlink_name(n)
    except FileNotFoundError:
        pass


def squat(name: str, mode: int, uid: int | None = None, size: int = SIZE) -> None:
    fd = os.open(f"/dev/shm/{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # past the umask
        os.ftruncate(fd, size)
        if uid is not None:
            os.fchown(fd, uid, -1)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("owner", "mode", "shown"),
    [("other", 0o600, "uid 54321 with mode 0600"), ("self", 0o666, "mode 0666")],
)
def test_a_segment_another_user_owns_or_may_write_is_refused(
    fb: types.SimpleNamespace, name: str, owner: str, mode: int, shown: str
) -> None:
    if owner == "other" and os.geteuid() != 0:
        pytest.skip("fchown to another uid needs root")
    squat(name, mode, 54321 if owner == "other" else None)
    for create in (True, False):
        with pytest.raises(PermissionError, match=shown) as info:
            fb.SharedRegion(name, size=SIZE, create=create)
        assert "trust_foreign=True" in str(info.value) and f"unlink_name('{name}')" in str(
            info.value
        )
    # opting in attaches (the squatter's zero-filled segment becomes a region)
    with fb.SharedRegion(name, size=SIZE, trust_foreign=True) as region:
        b = region.breaker("up", failure_threshold=1)
        assert b.allow()
    with pytest.raises(TypeError, match="trust_foreign must be True or False"):
        fb.SharedRegion(name, trust_foreign=1)


def create_then_die(name: str) -> None:
    """A creator killed between creating the segment and sizing it."""
    import _posixshmem  # type: ignore[import-not-found]

    _posixshmem.shm_open("/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode=0o600)
    os.kill(os.getpid(), signal.SIGKILL)


def test_an_empty_leftover_is_taken_over_by_create(fb: types.SimpleNamespace, name: str) -> None:
    p = multiprocessing.get_context("fork").Process(target=create_then_die, args=(name,))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL and os.stat(f"/dev/shm/{name}").st_size == 0
    # attaching only: a clear error that says what to do, after a short wait for a creator
    with pytest.raises(ValueError, match="exists but is empty") as info:
        fb.SharedRegion(name, create=False)
    assert f"SharedRegion('{name}', create=True) takes it over" in str(info.value)
    assert f"SharedRegion.unlink_name('{name}')" in str(info.value)
    assert f"rm /dev/shm/{name}" in str(info.value)
    # create=True sizes it and makes it a region; the others attach to it
    region = fb.SharedRegion(name, size=2 * SIZE)
    assert region.size == 2 * SIZE
    region.breaker("up", failure_threshold=1).allow()
    other = multiprocessing.get_context("fork").Process(
        target=attach_and_check, args=(fb.impl, name)
    )
    other.start()
    other.join(60)
    assert other.exitcode == 0
    region.close()


def attach_and_check(core: str, name: str) -> None:
    region = _region.region_class(core)(name, create=False)
    assert region.size == 2 * SIZE and "up" in region.objects()


def test_a_smaller_leftover_is_refused_with_what_to_do(
    fb: types.SimpleNamespace, name: str
) -> None:
    fb.SharedRegion(name, size=SIZE).close()
    with pytest.raises(ValueError, match=f"exists with {SIZE} bytes") as info:
        fb.SharedRegion(name, size=2 * SIZE)
    text = str(info.value)
    assert f"size={2 * SIZE}" in text and f"ask for size={SIZE}" in text
    assert f"SharedRegion.unlink_name('{name}')" in text and f"rm /dev/shm/{name}" in text
    # the same size (or a smaller one) attaches; the advice, followed, works
    fb.SharedRegion(name, size=SIZE).close()
    fb.SharedRegion.unlink_name(name)
    with fb.SharedRegion(name, size=2 * SIZE) as region:
        assert region.size == 2 * SIZE
    with pytest.raises(FileNotFoundError):
        fb.SharedRegion.unlink_name(name + "-none")


def test_a_full_region_says_how_to_make_a_larger_one(fb: types.SimpleNamespace, name: str) -> None:
    region = fb.SharedRegion(name, size=SIZE)
    with pytest.raises(ValueError, match="larger size") as info:
        region.breaker_map("big", capacity=4096)
    assert f"unlink_name('{name}')" in str(info.value)
    region.close()


def corrupt(region: _region.SharedRegion, obj: str, at: int, data: bytes) -> None:
    """Write ``data`` at byte ``at`` of both copies of the twin record of object ``obj``."""
    buf = region._buf
    for entry, raw in region._entries():
        if raw == obj.encode():
            offset = _region._get(buf, entry + _region._E_OFFSET)
            nbytes = _region._get(buf, entry + _region._E_NBYTES)
    half = (nbytes - 8) // 2
    for copy in (8, 8 + half):
        buf[offset + copy + at : offset + copy + at + len(data)] = data


@pytest.mark.parametrize(("at", "value"), [(0, 7), (0, -1), (8, -5), (8 * 8, -1)])
def test_a_corrupted_breaker_block_fails_clearly_on_the_twin(
    name: str, at: int, value: int
) -> None:
    # state 7 or -1, generation -5, the window's recorded count -1 (positions in the record)
    region = _region.region_class("python")(name, size=SIZE)
    b = region.breaker("api", failure_threshold=3, window=10)
    assert b.allow()
    corrupt(region, "api", at, struct.pack("<q", value))
    for call in (b.allow, b.record_success, b.metrics, lambda: b.state):
        with pytest.raises(RuntimeError, match="is corrupted") as info:
            call()
        text = str(info.value)
        assert f"CircuitBreaker 'api' in the shared region '{name}'" in text
        assert f"unlink_name('{name}')" in text
    region.close()
