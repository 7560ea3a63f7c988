"""Events counted per key in time buckets: the rate the API's admission
(ingest/admission/capacity.py) and the scheduler's shedding (scheduler/core/shedding.py)
measure arrivals by, so that what the API decides on and what sheds agree.
Pure; the clock is passed in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable


class BucketCounts:
    """Counts per key in buckets of ``bucket_s``, kept for ``horizon_s``, with a running
    total per key so a rate over the whole horizon costs no scan. How a count is added
    (and so the bucket order) is each subclass's ``add``; what a rate is measured over,
    its ``span``."""

    def __init__(self, horizon_s: float, bucket_s: float):
        self.horizon_s = horizon_s
        self.bucket_s = bucket_s
        # Per key: [bucket start, count] pairs, oldest first.
        self._buckets: dict[Hashable, deque[list[float]]] = {}
        self._total: dict[Hashable, float] = {}

    def _start(self, t: float) -> float:
        """The start of the bucket that holds time ``t``."""
        return math.floor(t / self.bucket_s) * self.bucket_s

    def _evict(self, key: Hashable, q: deque[list[float]], now: float) -> None:
        oldest = now - self.horizon_s
        while q and q[0][0] < oldest:
            self._total[key] -= q.popleft()[1]

    def span(self, now: float) -> float:
        """The time a rate is measured over: the whole horizon (a subclass may say less)."""
        return self.horizon_s

    def rate(self, key: Hashable, now: float) -> float:
        """Events/s over ``span``: what the horizon still holds of ``key``."""
        q = self._buckets.get(key)
        if not q:
            return 0.0
        self._evict(key, q, now)
        return self._total[key] / self.span(now)
