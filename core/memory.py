"""Giving freed memory back to the operating system (issue 30: memory flat for hours).

glibc keeps what a program frees for its own reuse. Every thread that allocates gets an
arena of its own (up to eight per core), and a burst - a job's publish through the
producer's threads, a large batch of answers - leaves each arena at its high-water mark.
The hour-long soak saw an API process step up by about 40 MiB at each of its first
uploads and stay there. Two measures, for every long-lived process:

* fewer arenas (``MALLOC_ARENA_MAX``, read by glibc when a process starts, so it is set
  in the environment the API's uvicorn processes are spawned with);
* ``malloc_trim(0)`` after a known burst and once a minute, which returns free pages of
  every arena (a few milliseconds, outside any lock the request path takes).

Neither touches memory that is still referenced: a real leak still shows in the soak.
On a C library without these calls (musl, macOS) both are no-ops.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import threading
from functools import cache

ARENA_ENV = "MALLOC_ARENA_MAX"
ARENAS = 2  # one for the main thread's bursts, one shared by the client libraries' threads
TRIM_PERIOD_S = 60.0
_M_ARENA_MAX = -8  # mallopt's parameter number in glibc's malloc.h


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def limit_arenas() -> None:
    """This process, and those it starts from here on, use at most ``ARENAS`` malloc
    arenas, unless the operator set their own limit in the environment."""
    os.environ.setdefault(ARENA_ENV, str(ARENAS))
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(_M_ARENA_MAX, int(os.environ[ARENA_ENV]))


def trim() -> bool:
    """Return the free pages of every malloc arena to the OS; False where unsupported."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def trim_every(stopping: threading.Event, period_s: float = TRIM_PERIOD_S) -> None:
    """Trim once a period until ``stopping`` is set (a thread's loop)."""
    while not stopping.wait(period_s):
        trim()


async def trim_periodically(period_s: float = TRIM_PERIOD_S) -> None:
    """Trim once a period, off the event loop (an asyncio task's loop)."""
    while True:
        await asyncio.sleep(period_s)
        await asyncio.to_thread(trim)
