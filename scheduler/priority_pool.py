"""A thread pool that runs the most urgent task first.

Used for persistence: when PostgreSQL falls behind (a big job, a slow disk),
the results of sync requests must not wait behind thousands of job batches in
a FIFO. Lower priority numbers run first; equal priorities run in order.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gristmill.scheduler.pool")

_STOP = (float("inf"), 0, None, ())


class PriorityPool:
    def __init__(self, workers: int, *, name: str):
        self._q: queue.PriorityQueue[tuple[float, int, Callable[..., Any] | None, tuple[Any, ...]]]
        self._q = queue.PriorityQueue()
        self._seq = itertools.count(1)
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, priority: float, fn: Callable[..., Any], *args: Any) -> None:
        self._q.put((priority, next(self._seq), fn, args))

    def pending(self) -> int:
        return self._q.qsize()

    def _run(self) -> None:
        while True:
            _, _, fn, args = self._q.get()
            if fn is None:
                return
            try:
                fn(*args)
            except Exception:  # a task logs its own failures; never kill the pool thread
                log.exception("task failed")

    def shutdown(self, wait: bool = True) -> None:
        """Run what is queued, then stop (stop markers sort after every real task)."""
        for _ in self._threads:
            self._q.put(_STOP)
        if wait:
            for t in self._threads:
                t.join()
