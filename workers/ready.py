"""The batches a worker has received and not yet launched, most urgent first.

A GPU worker serves several schedulers (decision 14), each keeping up to two batches on
it; those of a job are large and wait for hours, a sync batch waits at most its caller's
timeout. Launched in arrival order, a sync batch queued behind other schedulers' job
batches waited 120-250 ms for them (r17, docs/bench/gpu-host.md). So the worker launches
next the batch of the scheduler whose queued batches hold the earliest deadline
(decision 76): a scheduler's results must come back in the order it sent its batches
(scheduler/runtime/workerpool.py), so a scheduler's batches keep their order and its
head batch goes first on behalf of an urgent batch behind it. Batches without a
deadline (a scheduler that sends none) come after those with one, in arrival order.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Waiting:
    seq: int  # arrival order over every scheduler
    deadline: float  # epoch s; inf: none
    item: Any


def pick(queues: Mapping[K, Sequence[Waiting]]) -> K | None:
    """Which scheduler's head batch goes next: the one whose queued batches hold the
    earliest deadline; between equal deadlines, the one whose head arrived first. Pure."""
    best: tuple[float, int] | None = None
    chosen: K | None = None
    for key, waiting in queues.items():
        if not waiting:
            continue
        rank = (min(w.deadline for w in waiting), waiting[0].seq)
        if best is None or rank < best:
            best, chosen = rank, key
    return chosen


class ReadyQueue(Generic[K]):
    """Thread-safe: readers ``put`` what each scheduler sent, the launching thread
    ``get``s the next one (``pick``)."""

    def __init__(self) -> None:
        self._queues: dict[K, deque[Waiting]] = {}
        self._seq = 0
        self._cond = threading.Condition()

    def put(self, key: K, item: Any, deadline: float | None) -> None:
        with self._cond:
            self._seq += 1
            wait = Waiting(self._seq, math.inf if deadline is None else deadline, item)
            self._queues.setdefault(key, deque()).append(wait)
            self._cond.notify()

    def get(self, timeout_s: float) -> tuple[K, Any] | None:
        """The next (scheduler, item), or None when nothing came within ``timeout_s``."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while (key := pick(self._queues)) is None:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            waiting = self._queues[key]
            item = waiting.popleft().item
            if not waiting:
                del self._queues[key]
            return key, item

    def __len__(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._queues.values())
