"""One batch key's queued requests: a fair queue per priority rank, plus a deadline heap.
Pure; the batcher (scheduler/core/batcher.py) keeps one per batch key."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from scheduler.core.fairness import FairQueue

if TYPE_CHECKING:
    from scheduler.core.batcher import Pending


def _deadline(p: Pending) -> float:
    return p.msg.deadline


class KeyQueue:
    """One batch key's requests: a fair queue per priority rank (tenants share it by
    device time, each flow earliest deadline first), plus a deadline heap."""

    def __init__(self, n_ranks: int, price: Callable[[Pending], float] | None):
        """``price``: what an item costs its tenant's turn (None: one a request)."""
        self.by_rank: list[FairQueue[Pending]] = [
            FairQueue(cost=price, order=_deadline) for _ in range(n_ranks)
        ]
        self.deadlines: list[tuple[float, int, Pending]] = []  # min-heap, lazily cleaned
        self.count = 0

    def push(self, p: Pending) -> None:
        self.by_rank[p.rank].append(p)
        heapq.heappush(self.deadlines, (p.deadline, p.seq, p))
        self.count += 1

    def oldest_at(self) -> float:
        return min(fq.oldest_at() for fq in self.by_rank)

    def earliest_deadline(self) -> float:
        if len(self.deadlines) > 2 * self.count + 64:
            # Mostly entries of taken requests: one rebuild costs less than popping each.
            self.deadlines = [e for e in self.deadlines if not e[2].gone]
            heapq.heapify(self.deadlines)
        while self.deadlines and self.deadlines[0][2].gone:
            heapq.heappop(self.deadlines)
        return self.deadlines[0][0] if self.deadlines else math.inf

    def best_rank(self) -> int:
        return next((r for r, fq in enumerate(self.by_rank) if fq), len(self.by_rank))

    def pop(self, n: int) -> list[Pending]:
        """Most urgent rank first; inside a rank, tenants share by deficit round robin."""
        out: list[Pending] = []
        for fq in self.by_rank:
            if len(out) >= n:
                break
            out.extend(fq.take(n - len(out)))
        for p in out:
            p.gone = True  # leaves the deadline heap lazily
        self.count -= len(out)
        return out

    def backlog(self, taken: list[Pending]) -> dict[int, dict[str, float]]:
        """Per rank, the tenants still queued and those of ``taken``, with weights."""
        out: dict[int, dict[str, float]] = {}
        for p in taken:
            out.setdefault(p.rank, {})[p.tenant] = p.weight
        for rank, mine in out.items():
            mine.update(self.by_rank[rank].weights())
        return out

    def discard(self, p: Pending) -> None:
        if not p.gone:
            p.gone = True
            self.count -= 1
