"""What the dispatch core hands out and takes back: plain data. Pure.

A ``Step`` tells a free worker what to do next; an ``InFlight`` is a batch given to a
worker; a ``Write`` is rows to store in one transaction, after which their offsets are
done; a ``Reject`` is a message that cannot be queued; a ``Lost`` is what a lost worker
held. ``Worker`` is the core's record of one worker connection: the runtime holds it as
a handle to pass back, and reads what it needs through the core's interface
(scheduler/core/interface.py), never its fields.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.protocol import ModelInfo, WorkResult
from core.request_row import RequestRow
from core.vocab import ModelRef, PriorityClass, RequestStatus
from scheduler.core.batcher import Batch, Pending
from scheduler.core.offsets import TopicPartition
from scheduler.core.stagger import Running

if TYPE_CHECKING:
    import numpy as np

# Job items: background work, written after sync rows and started staggered across
# workers (scheduler/core/stagger.py).
BACKGROUND_RANK = PriorityClass.JOBS.rank
# A second batch is queued on a busy worker only when every model it serves computes a
# full batch within this (predicted): a sync request that arrives meanwhile waits for
# the queued batch too, so this bounds what pipelining can add to its latency
# (decision 0012).
PIPELINE_MAX_MS = 25.0
# Batches on one worker at most: the one computing and the one queued behind it.
MAX_IN_FLIGHT = 2

# The class of a worker that names none (and of the curve ``DispatchCore.cost``).
DEFAULT_CLASS = "cpu"

EXPIRED_ERROR = "deadline passed before a worker could run it"
CANCELLED_ERROR = "the job was cancelled"


@dataclass(eq=False, slots=True)
class InFlight:
    """A batch given to a worker and not yet answered."""

    batch: Batch
    predicted_s: float
    sent: bool = False  # the bytes went out: its result may be awaited
    background: bool = False  # job items only (they may be passed: DispatchCore.schedule)


@dataclass(eq=False)
class Worker:
    """The core's view of one worker connection (a restarted worker is a new one)."""

    worker_id: str
    models: tuple[ModelInfo, ...]
    refs: frozenset[ModelRef]
    # Batches given to it, oldest (computing) first.
    queue: deque[InFlight] = field(default_factory=deque)
    running: Running | None = None  # the batch it computes now (staggered job starts)
    alive: bool = True
    # Its cost curves are its class's (heterogeneous pools: a CPU and a GPU worker of one
    # model run at different speeds); the batcher sizes and times its batches by them.
    worker_class: str = DEFAULT_CLASS
    used_at: dict[ModelRef, float] = field(default_factory=dict)  # last batch started, per model

    def serves(self, ref: ModelRef) -> bool:
        return ref in self.refs

    def full_of_jobs(self, slots: int) -> bool:
        """All ``slots`` taken, by batches of job items only (decision 76)."""
        return len(self.queue) == slots and all(e.background for e in self.queue)


@dataclass(frozen=True, slots=True)
class Write:
    """Rows to store in one transaction; then the items' offsets are done."""

    priority: int  # persist order: the most urgent item's rank (sync before jobs)
    status: RequestStatus
    items: list[Pending]
    error: str | None = None
    batch: Batch | None = None  # the batch the items ran in
    outputs: Sequence[Any] | np.ndarray | None = None  # succeeded: one per item, in order
    compute: tuple[float, float] | None = None  # the worker's compute start, end (epoch s)
    # When the worker read the batch and began launching it (epoch s; None: not told).
    worker_times: tuple[float | None, float | None] = (None, None)
    worker_id: str | None = None
    batch_row: bool = False  # the batch's own row goes in this transaction
    dead_letter: bool = False  # copy each message to the dead-letter topic first
    then: Write | None = None  # written once this one is committed (decision 0013)


@dataclass(frozen=True, slots=True)
class Reject:
    """A message that cannot be queued (not JSON, missing or mistyped fields): copied to
    the dead-letter topic, recorded as a failed row when it names its request and
    tenant, and skipped."""

    tp: TopicPartition
    offset: int
    value: bytes
    reason: str
    row: RequestRow | None = None
    priority: int = BACKGROUND_RANK  # its topic's class: it holds that partition's commits


@dataclass(frozen=True, slots=True)
class Step:
    """A free worker's next step: start ``start``, or wait until ``wait_until`` (or until
    something changes, ``inf``), or ``stop``; ``writes`` are to be stored meanwhile."""

    start: InFlight | None = None
    wait_until: float = math.inf
    stop: bool = False
    writes: list[Write] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Lost:
    """What a lost worker held (oldest first) and the rows its failure writes."""

    held: list[Batch]
    writes: list[Write]


def result_writes(batch: Batch, result: WorkResult, worker_id: str) -> list[Write]:
    """A computed batch's rows. A batch of sync requests topped up with job items writes
    its sync rows (with the batch row and the announcement) in a short transaction of
    their own, then its job rows at background priority; each offset is done only once
    its own row is committed (decision 0013)."""
    assert result.outputs is not None
    items, outputs = batch.items, result.outputs
    compute = (result.compute_start, result.compute_end)

    def write(part: list[int] | None, priority: int, batch_row: bool, then: Write | None) -> Write:
        return Write(
            priority,
            RequestStatus.SUCCEEDED,
            items if part is None else [items[i] for i in part],
            batch=batch,
            outputs=outputs if part is None else [outputs[i] for i in part],
            compute=compute,
            worker_times=(result.received_at, result.launched_at),
            worker_id=worker_id,
            batch_row=batch_row,
            then=then,
        )

    sync = [i for i, p in enumerate(items) if p.msg.job_id is None]
    if not sync or len(sync) == len(items):
        return [write(None, min(p.rank for p in items), True, None)]
    jobs = [i for i, p in enumerate(items) if p.msg.job_id is not None]
    then = write(jobs, BACKGROUND_RANK, False, None)
    return [write(sync, min(items[i].rank for i in sync), True, then)]


def record(items: list[Pending], status: RequestStatus, error: str) -> Write:
    """Requests finished without running (sync results first: a backlog of job batches
    must not delay a waiting caller's answer)."""
    return Write(priority=min(p.rank for p in items), status=status, items=items, error=error)
