"""Work held open (uploads, streams), counted per API instance across its processes.

An instance is several uvicorn processes on one port (``gristmill api --workers N``), and
the README's limits are per instance: a key may hold 2 uploads on an instance, not 2 in
each of its processes. The processes share the directory whoever started them emptied
for them (``PROMETHEUS_MULTIPROC_DIR``, core/metrics.py); a slot is one byte of a small
file there, held by a POSIX record lock (``lockf``): one file per tenant (``per_key``
bytes) and one for the instance (``total`` bytes). Taking a slot is a non-blocking lock
on a free byte of each; giving it back unlocks them. The kernel frees the locks of a
process that dies, so a crashed process never leaks a slot, and nothing else has to be
cleaned up (decision 43).

A process does not conflict with its own POSIX locks, so each process also remembers
which bytes it holds and never tries those again. Without the shared directory (one
process: tests, a bare ``uvicorn``) a private one is made: the same rules, one process.
All calls come from the event loop's thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import random
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from core.config import Settings
from core.metrics import multiprocess_dir

# What a tenant id may look like as a file name as it is; anything else is hashed.
_PLAIN = re.compile(r"[A-Za-z0-9-]{1,64}")
_INSTANCE = "_instance"


def slots_dir() -> Path:
    """The directory this instance's processes share, or a private one."""
    shared = multiprocess_dir()
    if shared is not None:
        return Path(shared) / "slots"
    return Path(tempfile.mkdtemp(prefix="gristmill-slots-"))


def _try_lock(fd: int, index: int) -> bool:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, index, os.SEEK_SET)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False  # another process holds it
        raise
    return True


def _unlock(fd: int, index: int) -> None:
    fcntl.lockf(fd, fcntl.LOCK_UN, 1, index, os.SEEK_SET)


class SharedSlots:
    """At most ``per_key`` slots per tenant and ``total`` in all, on this instance."""

    def __init__(self, directory: Path, name: str, *, total: int, per_key: int):
        self.total = total
        self.per_key = per_key
        self.dir = directory / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self._instance_fd = self._open(_INSTANCE)
        self._fds: dict[str, int] = {}  # tenant -> its file, while this process holds any
        self._held: dict[str, list[tuple[int, int]]] = {}  # tenant -> (its byte, instance byte)
        self._mine: set[int] = set()  # instance bytes this process holds

    def _open(self, name: str) -> int:
        return os.open(self.dir / name, os.O_RDWR | os.O_CREAT, 0o600)

    @staticmethod
    def _file(key: str) -> str:
        return (
            key
            if _PLAIN.fullmatch(key) and key != _INSTANCE
            else hashlib.sha256(key.encode()).hexdigest()
        )

    def _take(self, fd: int, n: int, mine: set[int], start: int = 0) -> int | None:
        for i in (*range(start, n), *range(min(start, n))):
            if i not in mine and _try_lock(fd, i):
                return i
        return None

    def try_acquire(self, key: str, per_key: int | None = None) -> str | None:
        """None when a slot was taken; else which bound refused it: "tenant" or
        "instance". ``per_key``: this tenant's bound, when it is not the default."""
        limit = self.per_key if per_key is None else per_key
        fd = self._fds.get(key)
        if fd is None:
            fd = self._fds[key] = self._open(self._file(key))
        held = self._held.setdefault(key, [])
        own = self._take(fd, limit, {k for k, _ in held})
        if own is None:
            self._close_if_idle(key)
            return "tenant"
        # From a random byte: processes taking slots at once rarely try the same ones.
        shared = self._take(self._instance_fd, self.total, self._mine, random.randrange(self.total))
        if shared is None:
            _unlock(fd, own)
            self._close_if_idle(key)
            return "instance"
        held.append((own, shared))
        self._mine.add(shared)
        return None

    def release(self, key: str) -> None:
        held = self._held.get(key)
        if not held:
            return
        own, shared = held.pop()
        _unlock(self._fds[key], own)
        _unlock(self._instance_fd, shared)
        self._mine.discard(shared)
        self._close_if_idle(key)

    def held_here(self, key: str) -> int:
        """Slots this process holds for ``key`` (tests)."""
        return len(self._held.get(key, ()))

    def _close_if_idle(self, key: str) -> None:
        if not self._held.get(key):
            self._held.pop(key, None)
            fd = self._fds.pop(key, None)
            if fd is not None:
                os.close(fd)  # holds no lock of this process now

    def close(self) -> None:
        for fd in (*self._fds.values(), self._instance_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        self._held.clear()
        self._mine.clear()


@dataclass(frozen=True)
class InstanceSlots:
    """The work an API process counts with its instance's others (AppState's)."""

    uploads: SharedSlots  # job and file uploads being staged and recorded
    follows: SharedSlots  # follow=true result streams
    read_streams: SharedSlots  # every other streamed answer (tier_max_streams per key)

    @classmethod
    def open(cls, directory: Path, s: Settings) -> InstanceSlots:
        return cls(
            SharedSlots(
                directory, "uploads", total=s.max_uploads, per_key=s.max_uploads_per_tenant
            ),
            SharedSlots(
                directory,
                "follows",
                total=s.max_follow_streams,
                per_key=s.max_follow_streams_per_tenant,
            ),
            SharedSlots(
                directory,
                "streams",
                total=s.max_streams,
                per_key=min(s.tier_max_streams.values()),
            ),
        )

    def close(self) -> None:
        for slots in (self.uploads, self.follows, self.read_streams):
            slots.close()
