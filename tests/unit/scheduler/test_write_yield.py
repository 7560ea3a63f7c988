"""scheduler/core/write_yield.py and the persist pool's hold: job writes step aside while
commits are slow, and only then."""

from __future__ import annotations

import threading
import time

from scheduler.core.write_yield import HISTORY, MIN_HISTORY, SLOW_FACTOR, WriteYield
from scheduler.runtime.priority_pool import PriorityPool


def paced(seconds: float = 0.004, n: int = MIN_HISTORY) -> WriteYield:
    w = WriteYield()
    for _ in range(n):
        w.sync_finished(seconds)
    return w


def test_no_baseline_no_hold() -> None:
    w = WriteYield()
    w.sync_finished(5.0)
    assert not w.slow(0.0)
    assert not w.hold_job(0.0, sync_busy=True, jobs_running=1)


def test_fast_commits_never_hold_a_job_write() -> None:
    w = paced()
    w.sync_started(10.0)
    assert not w.hold_job(10.001, sync_busy=True, jobs_running=2)


def test_a_slow_sync_write_under_way_holds_jobs_while_sync_is_busy() -> None:
    w = paced(0.004)
    w.sync_started(10.0)
    now = 10.0 + SLOW_FACTOR * 0.004 + 0.01  # still running, past the factor
    assert w.slow(now)
    assert w.hold_job(now, sync_busy=True, jobs_running=0)
    assert w.hold_job(now, sync_busy=False, jobs_running=1)  # one job write at a time
    assert not w.hold_job(now, sync_busy=False, jobs_running=0)  # never starved outright


def test_the_slow_moment_ends_with_a_fast_write_and_a_lasting_one_becomes_the_baseline() -> None:
    w = paced(0.004)
    w.sync_finished(0.5)
    assert w.slow(0.0)
    w.sync_finished(0.004)
    assert not w.slow(0.0)
    for _ in range(HISTORY):
        w.sync_finished(0.5)  # the disk stays slow: that is the new usual
    assert not w.slow(0.0)


def test_failed_write_does_not_count_as_under_way() -> None:
    w = paced()
    w.sync_started(0.0)
    w.sync_failed()
    assert not w.slow(100.0)


def test_the_pool_holds_background_work_while_the_rule_says_so() -> None:
    hold = threading.Event()
    hold.set()
    seen: list[tuple[bool, int]] = []
    ran = threading.Event()

    def rule(busy: bool, running: int) -> bool:
        seen.append((busy, running))
        return hold.is_set()

    pool = PriorityPool(2, name="t", reserved=1, background_from=3, hold_background=rule)
    pool.submit(3, ran.set)
    time.sleep(0.2)
    assert not ran.is_set() and pool.pending() == 1  # held, asked again and again
    assert len(seen) >= 2
    hold.clear()
    assert ran.wait(2)  # released by the periodic re-check alone
    pool.shutdown(wait=True)


def test_the_pool_tells_the_rule_what_runs() -> None:
    gate, started = threading.Event(), threading.Event()
    seen: list[tuple[bool, int]] = []

    def rule(busy: bool, running: int) -> bool:
        seen.append((busy, running))
        return False

    pool = PriorityPool(3, name="t", reserved=1, background_from=3, hold_background=rule)

    def sync_write() -> None:
        started.set()
        gate.wait()

    pool.submit(0, sync_write)
    assert started.wait(2)
    done = threading.Event()
    pool.submit(3, done.set)
    assert done.wait(2)
    assert (True, 0) in seen  # a sync write under way, no job write yet
    gate.set()
    pool.shutdown(wait=True)
