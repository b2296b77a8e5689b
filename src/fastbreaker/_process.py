"""Process identity for state shared between processes (the pure-Python side of _fb_process.h).

An owner is one int: the pid in the low 32 bits and, where the platform tells a process's start
time (Linux: field 22 of ``/proc/<pid>/stat``, clock ticks since boot), its low 31 bits above
them. A pid that the kernel gives to a new process after its holder died no longer matches the
owner (the start time differs), so a slot or claim of the dead holder is reclaimed even then.
Elsewhere the start time is 0 and an owner is its pid alone.
"""

from __future__ import annotations

import os
import sys

__all__ = ["lock_holder", "owner_gone", "owner_of", "owner_self", "start_time", "stopped"]

_START_MASK = 0x7FFFFFFF


def _stat_fields(pid: int) -> list[bytes]:
    """The fields of ``/proc/<pid>/stat`` from field 3 (the state) on; [] when unknown."""
    if not sys.platform.startswith("linux"):
        return []
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return []
    # the command name (field 2) may hold spaces and parentheses: count from the last ")"
    return data[data.rfind(b")") + 2 :].split()


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, a debugger): only where ``/proc`` says so.
    A process that is merely descheduled on a busy machine is not stopped."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] in (b"T", b"t")


def lock_holder(fd: int, offset: int) -> int:
    """The pid of the process holding the ``fcntl`` record lock on byte ``offset`` of ``fd``, 0
    when none or unknown (``struct flock``'s layout is read on Linux only)."""
    if not sys.platform.startswith("linux"):
        return 0
    import fcntl
    import struct

    probe = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0).ljust(64, b"\0")
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, probe)
    except OSError:
        return 0
    kind, _, _, _, pid = struct.unpack_from("hhqqi", answer)
    return 0 if kind == fcntl.F_UNLCK else pid


def start_time(pid: int) -> int:
    """The low 31 bits of process ``pid``'s start time; 0 when unknown (not Linux, no such
    process, or ``/proc`` hides it: with ``hidepid``, another user's process looks absent)."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) & _START_MASK  # field 22
    except (IndexError, ValueError):
        return 0


def owner_of(pid: int, start: int) -> int:
    """The owner word of process ``pid`` started at ``start`` (see the module docstring)."""
    return ((start & _START_MASK) << 32) | (pid & 0xFFFFFFFF)


def owner_self() -> int:
    """This process's owner word (computed again after a fork by its users)."""
    pid = os.getpid()
    return owner_of(pid, start_time(pid))


def owner_gone(owner: int) -> bool:
    """Whether the owner's process is gone: no process has its pid (a zombie, not yet reaped by
    its parent, still does), or the process with that pid started at another time. A start time
    that cannot be read counts as the same one: a live holder is never freed."""
    pid, recorded = owner & 0xFFFFFFFF, owner >> 32
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, run by another user
    if recorded == 0:
        return False
    now = start_time(pid)
    return now != 0 and now != recorded
