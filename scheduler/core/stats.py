"""What the dispatch core shows those who watch it: frozen snapshots. Pure.

vLLM's shape (``SchedulerInterface.make_stats``): the core copies what observers need
into a record in one call, made under the runtime's lock (scheduler/runtime/host.py),
and observers read the record outside it. Metrics, the model control, the service's
last log line: none of them reads the core's fields, so the core can change its insides
and keep its record (docs/decisions/0047-the-schedulers-core-and-runtime.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from core.vocab import ModelRef
from scheduler.core.batcher import Batch, Batcher, Pending
from scheduler.core.plans import Worker
from scheduler.core.shares import FairnessStats


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """One worker as the core sees it."""

    worker_id: str
    worker_class: str
    alive: bool
    serving: frozenset[ModelRef]  # the versions it takes batches of
    in_flight: int  # batches given to it whose result is not back (computing, queued)
    busy: frozenset[ModelRef]  # the models of those batches
    used_at: Mapping[ModelRef, float]  # when it last started a batch of each model (epoch s)


@dataclass(frozen=True, slots=True)
class CoreStats:
    """The dispatch core at one moment."""

    at: float  # epoch s
    counts: Mapping[str, int]  # consumed, rejected, batches, expired, cancelled, failed, ...
    queued: Mapping[tuple[ModelRef, int], int]  # (model, rank) -> requests in the batcher
    # (model, rank) -> when the API received the oldest request read and not yet
    # persisted: queued, on a worker, or waiting for a retry (epoch s)
    oldest: Mapping[tuple[ModelRef, int], float]
    workers: tuple[WorkerStats, ...]  # the live ones
    sized: frozenset[ModelRef]  # every version a worker announced (the core sizes its batches)
    # Per tier and tenant, device seconds received and entitled (decision 65).
    fairness: FairnessStats = field(default_factory=FairnessStats)


def oldest_of(items: Iterable[Pending], into: dict[tuple[ModelRef, int], float]) -> None:
    """Lower ``into``'s (model, rank) entries to the receipt times of ``items``."""
    for p in items:
        k = (p.key.ref, p.rank)
        if p.msg.received_at < into.get(k, math.inf):
            into[k] = p.msg.received_at


def worker_stats(w: Worker) -> WorkerStats:
    busy = frozenset(e.batch.key.ref for e in w.queue)
    return WorkerStats(
        w.worker_id, w.worker_class, w.alive, w.refs, len(w.queue), busy, dict(w.used_at)
    )


def snapshot(
    now: float,
    counts: Mapping[str, int],
    batcher: Batcher,
    workers: Sequence[Worker],
    retrying: Sequence[Batch],
    sized: Iterable[ModelRef],
    fairness: FairnessStats | None = None,
) -> CoreStats:
    """The dispatch core's ``make_stats``: its queues, its live workers, what they hold
    and what waits for a retry."""
    oldest = batcher.oldest_received()
    live = [w for w in workers if w.alive]
    for w in live:
        for e in w.queue:
            oldest_of(e.batch.items, oldest)
    for b in retrying:
        oldest_of(b.items, oldest)
    queued = {
        (ref, rank): n
        for ref, depths in batcher.depth_by_model().items()
        for rank, n in enumerate(depths)
    }
    return CoreStats(
        at=now,
        counts=dict(counts),
        queued=queued,
        oldest=oldest,
        workers=tuple(worker_stats(w) for w in live),
        sized=frozenset(sized),
        fairness=fairness or FairnessStats(),
    )
