"""Shedding an admitted sync request as soon as the queue says it will miss its deadline,
not when the deadline comes. Pure; the clock is passed in (decision 62).

Admission (ingest/admission/capacity.py) decides on reports up to half a second old and
on rates measured at the API. Under strict priority a lower class gets only what the
classes above it leave, and when those arrive in clumps (an API instance short of CPU
sends them so) a request admitted on the average can wait several seconds of its
deadline out in the queue and end as a 504. The scheduler sees each class's queue and
arrivals first hand, so it drops such a request early and its caller gets a 503 with
Retry-After while retrying elsewhere still helps.

A queued request of class r starts, at the earliest one can expect, once the requests
of the classes above it queued now have run (at the workers' full rate) and then the
requests of its own class before it (in deadline order) have run at the rate the
classes above leave: the workers' rate less those classes' arrivals, measured over
``RATE_WINDOW_S`` and taken at the LOW end of their noise (so a noisy reading never
sheds what would have made it). It is shed when that start, its own batch and the
scheduler's margin pass its deadline. Job items are never shed (they wait, decision 11).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from core.bucket_counts import BucketCounts

# Arrivals are counted over this window (two report periods of every scheduler and the
# admission's own window, decision 24: what the API decides on and what sheds agree).
RATE_WINDOW_S = 5.0
BUCKET_S = 0.25
# The queues are checked at most this often: a batch of the fastest models takes a few
# ms, and a request shed 0.1 s later has lost nothing its caller could have used.
SHED_PERIOD_S = 0.1
# ...and at most this many queued items are read a second (a long queue is checked less
# often: its requests have seconds to go, and the check costs about a microsecond each).
SHED_SCAN_ITEMS_S = 50_000
# One-sided 95% point of a normal: the arrival rate above a class is taken this many
# standard deviations low (a Poisson count's), so shedding errs towards keeping.
LOW_Z = 1.645
# Retry-After for a class left no capacity at all by the classes above it.
NO_CAPACITY_RETRY_S = 5.0


class Arrivals(BucketCounts):
    """Requests queued per key (model, rank), counted in buckets over ``window_s``
    (core/bucket_counts.py). A rate is over the whole window, even while counting is
    younger (a burst, or a backlog read again after a rebalance, is not a rate to expect
    for the seconds to come; reading it low only sheds less)."""

    def __init__(self, window_s: float = RATE_WINDOW_S, bucket_s: float = BUCKET_S):
        super().__init__(window_s, bucket_s)

    def add(self, key: Hashable, now: float, n: int = 1) -> None:
        start = self._start(now)
        q = self._buckets.setdefault(key, deque())
        self._total[key] = self._total.get(key, 0.0) + n
        if q and q[-1][0] >= start:  # an earlier consumed time counts in the newest bucket
            q[-1][1] += n
        else:
            q.append([start, n])


def left_rate(items_s: float, above_s: float, span_s: float) -> float:
    """Items/s the workers leave to a class whose classes above arrive at ``above_s``
    (measured over ``span_s``), that rate taken at the low end of its noise."""
    low = max(0.0, above_s - LOW_Z * math.sqrt(above_s / max(span_s, 1e-9)))
    return max(0.0, items_s - low)


def start_in_s(ahead_above: float, before: int, items_s: float, left_s: float) -> float:
    """Seconds until a request starts that has ``ahead_above`` requests of higher classes
    queued and ``before`` of its own class ahead of it (``items_s``: the workers' rate,
    ``left_s``: what the classes above leave of it)."""
    if items_s <= 0:
        return math.inf
    first = ahead_above / items_s
    if before == 0 and ahead_above == 0:
        return 0.0
    return first + before / left_s if left_s > 0 else math.inf


def retry_after_s(wait_s: float, budget_s: float) -> float:
    """When a request like the one shed could be served: once the wait it faced is down
    to what its deadline allows (at least a second)."""
    if not math.isfinite(wait_s):
        return NO_CAPACITY_RETRY_S
    return max(1.0, wait_s - max(0.0, budget_s))


def live_rates(
    workers: Iterable[Any], sizing: Callable[[str], Any]
) -> tuple[dict[Any, float], dict[Any, float]]:
    """For each model version the live workers serve: their items a second together at
    full batches (each at its class's cost curve), and the longest full batch's time."""
    items_s: dict[Any, float] = {}
    batch_s: dict[Any, float] = {}
    for w in workers:
        if not w.alive:
            continue
        s = sizing(w.worker_class)
        for ref in w.refs:
            full = s.predicted_s(ref, s.limit(ref))
            items_s[ref] = items_s.get(ref, 0.0) + s.limit(ref) / max(full, 1e-6)
            batch_s[ref] = max(batch_s.get(ref, 0.0), full)
    return items_s, batch_s


def by_retry_after(shed: Sequence[tuple[Any, float]]) -> list[tuple[int, list[Any]]]:
    """Shed requests grouped by their Retry-After in whole seconds (as the header
    carries it): one write each."""
    groups: dict[int, list[Any]] = {}
    for p, retry in shed:
        groups.setdefault(math.ceil(retry), []).append(p)
    return sorted(groups.items())
