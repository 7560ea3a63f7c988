"""core/memory.py: malloc's free pages given back, arenas limited, the trim loops stop."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from core import memory


def _private_kib() -> int:
    """This process's private dirty memory (KiB), from /proc."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1])
    raise AssertionError("no Private_Dirty in smaps_rollup")


def _burst_and_trim() -> tuple[int, int, int, bool]:
    """In a fresh process: private memory before, at the peak of a burst freed in a
    thread of its own, and after a trim (KiB), and whether the trim ran. A fresh process,
    because a long test process's arenas hold freed pages a burst reuses unseen."""
    # A burst in a thread of its own lands in that thread's arena; freed, it stays
    # resident until trimmed. Blocks of 64 KiB: below the mmap threshold, so in the arena.
    peak: list[int] = []

    def burst() -> None:
        blocks = [bytearray(64 << 10) for _ in range(1600)]  # 100 MiB
        for b in blocks:  # calloc'd pages fresh from the kernel are not resident until written
            b[::4096] = b"\x01" * 16
        peak.append(_private_kib())
        del blocks

    before = _private_kib()
    t = threading.Thread(target=burst)
    t.start()
    t.join()
    trimmed = memory.trim()
    return before, peak[0], _private_kib(), trimmed


@pytest.mark.skipif(memory._libc() is None, reason="not glibc")
def test_a_trim_gives_back_what_a_thread_freed() -> None:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        before, peak, after, trimmed = pool.submit(_burst_and_trim).result(timeout=120)
    assert peak > before + 80 * 1024
    assert trimmed is True
    assert after < before + 20 * 1024  # the burst went back, whatever free() kept


def test_limit_arenas_keeps_an_operators_own_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(memory.ARENA_ENV, "4")
    memory.limit_arenas()
    assert os.environ[memory.ARENA_ENV] == "4"
    monkeypatch.delenv(memory.ARENA_ENV)
    memory.limit_arenas()
    assert os.environ[memory.ARENA_ENV] == str(memory.ARENAS)


def test_the_thread_loop_ends_when_told() -> None:
    stopping = threading.Event()
    t = threading.Thread(target=memory.trim_every, args=(stopping, 0.01))
    t.start()
    time.sleep(0.05)
    stopping.set()
    t.join(timeout=1)
    assert not t.is_alive()


def test_the_task_loop_trims_until_cancelled() -> None:
    async def run() -> None:
        task = asyncio.create_task(memory.trim_periodically(0.01))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
