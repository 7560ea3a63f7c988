"""A thread pool that runs the most urgent task first, with threads kept for urgent work.

Used for persistence: when PostgreSQL falls behind (a big job, a slow disk),
the results of sync requests must not wait behind thousands of job batches in
a FIFO. Lower priority numbers run first; equal priorities run in order. And
since a job batch already being written cannot be overtaken, ``reserved``
threads only ever run tasks more urgent than ``background_from``: a sync
result finds a free thread even while every other thread writes job results.
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


class PriorityPool:
    def __init__(
        self,
        workers: int,
        *,
        name: str,
        reserved: int = 0,
        background_from: float = math.inf,
        supervisor: Supervisor | None = None,
    ):
        if not 0 <= reserved < workers:
            raise ValueError("reserved threads must leave at least one for background work")
        self._background_from = background_from
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

    def _next(self, urgent_only: bool) -> _Task | None:
        with self._cv:
            while True:
                if self._heap and (not urgent_only or self._heap[0][0] < self._background_from):
                    return heapq.heappop(self._heap)
                if self._stopping and (urgent_only or not self._heap):
                    return None
                self._cv.wait()

    def _run(self, urgent_only: bool) -> None:
        while (task := self._next(urgent_only)) is not None:
            _, _, fn, args = task
            try:
                fn(*args)
            except Exception:  # a task logs its own failures; never kill the pool thread
                log.exception("task failed")

    def shutdown(self, wait: bool = True) -> None:
        """Run what is queued, then stop."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if wait:
            for t in self._threads:
                t.join()
