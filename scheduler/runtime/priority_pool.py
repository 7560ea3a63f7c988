"""A thread pool that runs the most urgent task first, with threads kept for urgent work.

Used for persistence: when PostgreSQL falls behind (a big job, a slow disk),
the results of sync requests must not wait behind thousands of job batches in
a FIFO. Lower priority numbers run first; equal priorities run in order. And
since a job batch already being written cannot be overtaken, ``reserved``
threads only ever run tasks more urgent than ``background_from``: a sync
result finds a free thread even while every other thread writes job results. And a
``hold_background`` rule may keep background tasks waiting while urgent ones run
(job writes while commits are slow: scheduler/core/write_yield.py).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
from collections.abc import Callable
from typing import Any

from scheduler.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)

_Task = tuple[float, int, Callable[..., Any], tuple[Any, ...]]
# A held background task is looked at again at least this often (s): the hold may end
# with time alone (a slow commit measured as it runs).
HOLD_RECHECK_S = 0.05


class PriorityPool:
    def __init__(
        self,
        workers: int,
        *,
        name: str,
        reserved: int = 0,
        background_from: float = math.inf,
        supervisor: Supervisor | None = None,
        hold_background: Callable[[bool, int], bool] | None = None,
    ):
        """``hold_background(urgent_busy, background_running)``: whether a background
        task at the front of the queue must wait before it starts (asked again whenever
        a task ends, and every ``HOLD_RECHECK_S``)."""
        if not 0 <= reserved < workers:
            raise ValueError("reserved threads must leave at least one for background work")
        self._background_from = background_from
        self._hold = hold_background
        self._running = [0, 0]  # urgent, background tasks under way
        self._cv = threading.Condition()
        self._heap: list[_Task] = []
        self._seq = itertools.count(1)
        self._stopping = False
        supervisor = supervisor or Supervisor()
        self._threads = [
            supervisor.start(self._run, i < reserved, name=f"{name}-{i}") for i in range(workers)
        ]

    def submit(self, priority: float, fn: Callable[..., Any], *args: Any) -> None:
        with self._cv:
            heapq.heappush(self._heap, (priority, next(self._seq), fn, args))
            self._cv.notify_all()

    def take_while(
        self, priority: float, fn: Callable[..., Any], accept: Callable[..., bool]
    ) -> list[tuple[Any, ...]]:
        """The arguments of queued ``fn`` tasks at ``priority`` from the front of the
        queue, while ``accept(*args)`` says yes: a running task takes on work queued
        just like it (nothing more urgent is passed over)."""
        out: list[tuple[Any, ...]] = []
        with self._cv:
            while self._heap:
                prio, _, f, args = self._heap[0]
                if prio != priority or f != fn or not accept(*args):
                    break
                heapq.heappop(self._heap)
                out.append(args)
        return out

    def pending(self) -> int:
        with self._cv:
            return len(self._heap)

    def _held(self) -> bool:
        """The front task is background work that must wait (caller holds the lock)."""
        if self._hold is None or self._stopping:
            return False
        urgent_busy = self._running[0] > 0  # the front is background: none urgent queued
        return self._hold(urgent_busy, self._running[1])

    def _next(self, urgent_only: bool) -> _Task | None:
        with self._cv:
            while True:
                if self._heap:
                    background = self._heap[0][0] >= self._background_from
                    if not background:
                        task = heapq.heappop(self._heap)
                        self._running[0] += 1
                        return task
                    if not urgent_only and not self._held():
                        task = heapq.heappop(self._heap)
                        self._running[1] += 1
                        return task
                if self._stopping and (urgent_only or not self._heap):
                    return None
                self._cv.wait(HOLD_RECHECK_S if self._hold is not None else None)

    def _run(self, urgent_only: bool) -> None:
        while (task := self._next(urgent_only)) is not None:
            prio, _, fn, args = task
            try:
                fn(*args)
            except Exception:  # a task logs its own failures; never kill the pool thread
                log.exception("task failed")
            finally:
                with self._cv:
                    self._running[prio >= self._background_from] -= 1
                    self._cv.notify_all()

    def shutdown(self, wait: bool = True) -> None:
        """Run what is queued, then stop."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if wait:
            for t in self._threads:
                t.join()
