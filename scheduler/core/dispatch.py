"""The dispatch core: what each worker runs next, and what every outcome changes. Pure.

One object owns the scheduler's decisions between Kafka and PostgreSQL: the queues
(``Batcher``), the offsets (``OffsetTracker``), the retries, and what each worker holds.
The service asks it for a worker's next step (``schedule``: start a batch, wait until a
time, stop) and reports what happened (a fetch, a result, a failure, a lost worker, a
write, a revocation); each answer is plain data for the service to carry out, above all
``Write``s: rows to store in one transaction, after which their offsets are done.

No threads, locks, sockets, Kafka or SQL here, and the clock is an argument (``now``,
epoch seconds), so every rule is tested by feeding it hand-built events
(tests/unit/scheduler/test_dispatch_core.py). Not thread-safe: the service holds one
lock around every call (docs/decisions/0018-a-pure-dispatch-core.md).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.config import Settings
from core.load_report import LoadReport, ModelCapacity
from core.protocol import ModelInfo, WorkResult
from core.request_row import RequestRow
from core.vocab import PRIORITY_CLASSES, ModelRef, PriorityClass, RequestStatus
from scheduler.core.backpressure import BufferBudget, paused_classes
from scheduler.core.batcher import Batch, Batcher, FlushPolicy, Pending
from scheduler.core.capacity import capacity_by_model
from scheduler.core.costmodel import CostModel
from scheduler.core.load_report import tenant_backlog
from scheduler.core.offsets import OffsetTracker, TopicPartition
from scheduler.core.retry import RetryPolicy, plan_failure
from scheduler.core.stagger import Running, background_hold_until

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


@dataclass(slots=True)
class _Retry:
    not_before: float
    batch: Batch


class DispatchCore:
    def __init__(
        self,
        *,
        flush: FlushPolicy,
        batch_budget_ms: float | Sequence[float],
        budget: BufferBudget,
        retry: RetryPolicy | None = None,
        rng: random.Random | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
    ):
        self.max_in_flight = max_in_flight
        self.budget = budget
        self.retry = retry or RetryPolicy()
        self.rng = rng
        # One cost curve per worker class (heterogeneous pools), keyed by model inside,
        # each learned from every batch its class runs; it picks the batch size within
        # the batch budget of each tier's SLO (scheduler/core/costmodel.py). ``cost`` is the
        # default class's.
        self._budget_ms = batch_budget_ms
        self.cost = self._new_curve()
        self.curves: dict[str, CostModel] = {DEFAULT_CLASS: self.cost}
        # The largest batch each model's workers take (the smallest worker's own limit),
        # overall and per worker class.
        self.max_batch: dict[ModelRef, int] = {}
        self.class_max_batch: dict[tuple[ModelRef, str], int] = {}
        self._asking = DEFAULT_CLASS  # the class of the worker being scheduled
        self.batcher = Batcher(
            policy=flush,
            cost=self.cost,
            max_batch=self._limit,
            n_ranks=len(PRIORITY_CLASSES),
        )
        self.tracker = OffsetTracker()
        self.retries: deque[_Retry] = deque()
        self.workers: list[Worker] = []
        self.cancelled_jobs: frozenset[tuple[str, int]] = frozenset()  # (job id, attempt)
        self.dispatching = True
        self.stats = dict.fromkeys(
            (
                "consumed",
                "rejected",
                "batches",
                "expired",
                "cancelled",
                "failed",
                "persisted",
                "handed_back",
            ),
            0,
        )

    @classmethod
    def from_settings(cls, settings: Settings, **kw: Any) -> DispatchCore:
        return cls(
            flush=FlushPolicy(settings.max_linger_ms / 1000, settings.deadline_margin_ms / 1000),
            batch_budget_ms=settings.batch_budgets(),
            budget=BufferBudget.default(settings.max_buffered, len(PRIORITY_CLASSES)),
            **kw,
        )

    # ---- workers ---------------------------------------------------------------------
    def _new_curve(self) -> CostModel:
        return CostModel(budget_ms=self._budget_ms)

    def curve(self, worker_class: str) -> CostModel:
        """The cost curves of one worker class."""
        c = self.curves.get(worker_class)
        if c is None:
            c = self.curves[worker_class] = self._new_curve()
        return c

    def _limit(self, ref: ModelRef) -> int:
        """The largest batch of ``ref`` the class of worker being scheduled takes."""
        return self.class_max_batch.get((ref, self._asking), self.max_batch.get(ref, 1))

    def _class_limit(self, curve: CostModel, ref: ModelRef, worker_class: str) -> int:
        """Items a full batch of ``ref`` holds now on a worker of ``worker_class`` (its
        measured batch target within that class's own limit)."""
        cap = self.class_max_batch.get((ref, worker_class), self.max_batch.get(ref, 1))
        return curve.batch_target(ref, cap)

    def _learn(self, models: Sequence[ModelInfo], worker_class: str) -> None:
        curve = self.curve(worker_class)
        for m in models:
            ref = ModelRef(m.name, m.version)
            profile = {int(k): v for k, v in m.profile_ms.items()}
            # The worker's own limit (memory bounded it at warm-up); the batch size
            # within it follows the measured curve, which the warm-up only seeds.
            cap = m.max_batch_size
            self.max_batch[ref] = min(self.max_batch.get(ref, cap), cap)
            key = (ref, worker_class)
            self.class_max_batch[key] = min(self.class_max_batch.get(key, cap), cap)
            curve.seed(ref, profile)

    def add_worker(
        self, worker_id: str, models: Sequence[ModelInfo], worker_class: str = DEFAULT_CLASS
    ) -> Worker:
        self._learn(models, worker_class)
        w = Worker(
            worker_id,
            tuple(models),
            frozenset(ModelRef(m.name, m.version) for m in models),
            worker_class=worker_class,
        )
        self.workers.append(w)
        return w

    def set_served(self, w: Worker, models: Sequence[ModelInfo]) -> None:
        """The versions ``w`` takes batches of from now on (loaded, ready and wanted: the
        model control's decision, scheduler/core/model_control.py). A version left out gets no
        new batch; what ``w`` holds of it finishes."""
        new = [m for m in models if ModelRef(m.name, m.version) not in w.refs]
        self._learn(new, w.worker_class)
        w.models = tuple(models)
        w.refs = frozenset(ModelRef(m.name, m.version) for m in models)

    def class_curves(self) -> dict[tuple[ModelRef, str], tuple[int, dict[int, float], int]]:
        """Per (model, worker class) with live workers: (batch limit, cost curve as
        measured now, workers), for the registry and the planner."""
        out: dict[tuple[ModelRef, str], tuple[int, dict[int, float], int]] = {}
        for w in self.workers:
            if not w.alive:
                continue
            for ref in w.refs:
                key = (ref, w.worker_class)
                limit = self.class_max_batch.get(key, self.max_batch.get(ref, 1))
                n = out[key][2] + 1 if key in out else 1
                out[key] = (limit, self.curve(w.worker_class).known(ref), n)
        return out

    def live_models(self) -> dict[ModelRef, tuple[int, dict[int, float]]]:
        """Each model live workers serve: (the largest batch they take, the cost curve as
        measured now, else the warm-up's), for the registry and the planner."""
        out: dict[ModelRef, tuple[int, dict[int, float]]] = {}
        for w in self.workers:
            if w.alive:
                for m in w.models:
                    ref = ModelRef(m.name, m.version)
                    known = self.curve(w.worker_class).known(ref)
                    out[ref] = (self.max_batch[ref], known or m.profile_ms)
        return out

    def may_queue(self, w: Worker) -> bool:
        """Whether a second batch may wait on this busy worker: a full batch of every
        model it serves is predicted short (decision 0012)."""
        curve = self.curve(w.worker_class)
        return all(
            curve.predict_ms(ref, self._class_limit(curve, ref, w.worker_class)) <= PIPELINE_MAX_MS
            for ref in w.refs
        )

    # ---- what a free worker does next ----------------------------------------------------
    def schedule(self, w: Worker, now: float) -> Step:
        # The batcher sizes and times batches with the curve of the worker that will run
        # them (heterogeneous pools).
        self._asking = w.worker_class
        self.batcher.cost = self.curve(w.worker_class)
        writes: list[Write] = []
        while True:
            if not self.dispatching or not w.alive:
                return Step(stop=True, writes=writes)
            if w.queue and (len(w.queue) >= self.max_in_flight or not self.may_queue(w)):
                return Step(writes=writes)  # busy: its next result changes that
            expired = self.batcher.drop_expired(now)
            if expired:
                self.stats["expired"] += len(expired)
                writes.append(_record(expired, RequestStatus.EXPIRED, EXPIRED_ERROR))
            for r in self.retries:
                if r.not_before <= now and w.serves(r.batch.key.ref):
                    self.retries.remove(r)
                    return Step(start=self._start(w, r.batch, now), writes=writes)
            hold = self._background_hold(w, now)
            if hold > now and self.batcher.urgent_may_wait(BACKGROUND_RANK, w.serves, hold):
                # The batch would be filled with job items, or the workers are saturated:
                # spread this worker's start from the others', so a sync arrival never
                # waits more than a batch time over the worker count (one that cannot
                # wait ends the hold: urgent_may_wait says no).
                return Step(wait_until=hold, writes=writes)
            batch = self.batcher.take(now, w.serves)
            if batch is None:
                wake = min(
                    [
                        self.batcher.wake_at(w.serves),
                        *[r.not_before for r in self.retries if w.serves(r.batch.key.ref)],
                    ]
                )
                return Step(wait_until=wake, writes=writes)
            if self.cancelled_jobs:
                gone = [p for p in batch.items if self._cancelled(p)]
                if gone:
                    self.stats["cancelled"] += len(gone)
                    writes.append(_record(gone, RequestStatus.CANCELLED, CANCELLED_ERROR))
                    batch.items = [p for p in batch.items if not self._cancelled(p)]
                    if not batch.items:
                        continue
            return Step(start=self._start(w, batch, now), writes=writes)

    def _cancelled(self, p: Pending) -> bool:
        return (p.msg.job_id, p.msg.job_attempt) in self.cancelled_jobs

    def _start(self, w: Worker, batch: Batch, now: float) -> InFlight:
        """``batch`` goes to ``w``; it computes from now if nothing is ahead of it."""
        predicted = self.curve(w.worker_class).predict_ms(batch.key.ref, len(batch.items)) / 1000
        w.used_at[batch.key.ref] = now
        if not w.queue:
            w.running = Running(now, predicted)
        entry = InFlight(batch, predicted)
        w.queue.append(entry)
        self.stats["batches"] += 1
        return entry

    def _background_hold(self, w: Worker, now: float) -> float:
        """Until when this worker should hold back a job batch."""
        peers = [o for o in self.workers if o.alive and o.refs & w.refs]
        others = [o.running for o in peers if o is not w and o.running is not None]
        return background_hold_until(now, others, len(peers))

    # ---- what comes back -------------------------------------------------------------
    def send_failed(self, w: Worker, entry: InFlight, now: float) -> None:
        """The batch never reached the worker (it was gone): back unchanged, unless the
        worker's loss already handed it back."""
        w.alive = False
        if entry in w.queue:
            w.queue.remove(entry)
            self.retries.append(_Retry(now, entry.batch))

    def retire(self, w: Worker) -> None:
        """The worker's threads are done with it."""
        w.alive = False
        w.running = None
        if w in self.workers:
            self.workers.remove(w)

    def on_result(self, w: Worker, entry: InFlight, result: WorkResult, now: float) -> list[Write]:
        """The oldest batch on ``w`` came back: its rows to write, or its failure plan."""
        if w.queue and w.queue[0] is entry:
            w.queue.popleft()
        # The queued batch computes from now on.
        w.running = Running(now, w.queue[0].predicted_s) if w.queue else None
        batch = entry.batch
        if result.unavailable:
            self.hand_back(w, batch)
            return []
        if result.error is not None:
            return self.on_failure(batch, result.error, now)
        assert result.outputs is not None
        ms = (result.compute_end - result.compute_start) * 1000
        self.curve(w.worker_class).observe(batch.key.ref, len(batch.items), ms)
        return result_writes(batch, result, w.worker_id)

    def hand_back(self, w: Worker, batch: Batch) -> None:
        """The worker could not run the batch through no fault of its inputs (its model
        is not loaded there, or the service it calls is down): the items queue again
        unchanged, no attempt counted (deadlines still apply: a sync request may expire
        while it waits, a job item waits), and ``w`` gets no more of that model until the
        model control says it is ready again."""
        ref = batch.key.ref
        if ref in w.refs:
            w.refs = w.refs - {ref}
            w.models = tuple(m for m in w.models if ModelRef(m.name, m.version) != ref)
        for p in batch.items:
            p.gone = False  # taken once; queued again
            self.batcher.add(p)
        self.stats["handed_back"] += len(batch.items)

    def on_failure(self, batch: Batch, error: str, now: float) -> list[Write]:
        """Split the batch until the bad input is alone; a lone input is retried with
        backoff, then recorded as failed and copied to the dead-letter topic."""
        plan = plan_failure(batch.items, self.retry, self.rng)
        for group in plan.retry_groups:
            self.retries.append(
                _Retry(
                    now + plan.retry_delay_s,
                    Batch(key=batch.key, items=group, formed_at=now, reason="retry"),
                )
            )
        self.stats["failed"] += len(plan.failed)
        return [
            Write(
                priority=p.rank,
                status=RequestStatus.FAILED,
                items=[p],
                error=f"{error} (gave up after {p.msg.attempt} attempts)",
                batch=batch,
                dead_letter=True,
            )
            for p in plan.failed
        ]

    def on_lost(self, w: Worker, error: str, *, ran: bool, now: float) -> Lost:
        """Drop the worker and hand back every batch it held: the oldest was computing
        (``ran``: it counts as an attempt), those queued behind it never started and go
        back unchanged."""
        held = [f.batch for f in w.queue]
        w.queue.clear()
        self.retire(w)
        blamed = held[0] if held and ran else None
        for b in held:
            if b is not blamed:
                self.retries.append(_Retry(now, b))
        writes = self.on_failure(blamed, error, now) if blamed is not None else []
        return Lost(held, writes)

    def done(self, offsets: Iterable[tuple[TopicPartition, int]], rows: int = 0) -> None:
        """Rows (or dead-letter copies) are durable: these offsets may be committed."""
        self.stats["persisted"] += rows
        for tp, offset in offsets:
            self.tracker.done(tp, offset)

    # ---- what the consumer lanes report --------------------------------------------------
    def accept(
        self, items: list[Pending], rejects: list[Reject], owned: set[TopicPartition]
    ) -> list[Reject]:
        """Queue fetched requests of partitions still owned (a revocation may have come
        between the fetch and now); returns the rejects to record."""
        for p in items:
            if p.tp in owned:
                self.tracker.track(p.tp, p.offset)
                self.batcher.add(p)
                self.stats["consumed"] += 1
        kept = [r for r in rejects if r.tp in owned]
        for r in kept:
            self.tracker.track(r.tp, r.offset)  # done once its copy is confirmed
        self.stats["rejected"] += len(kept)
        return kept

    def hold(self, items: list[Pending], owned: set[TopicPartition]) -> list[Pending]:
        """Track the offsets of requests run outside the batcher (generation, decision
        32) that are of partitions still owned; ``done`` releases them."""
        kept = [p for p in items if p.tp in owned]
        for p in kept:
            self.tracker.track(p.tp, p.offset)
        self.stats["consumed"] += len(kept)
        return kept

    def revoke(self, tps: list[TopicPartition]) -> None:
        """Another member owns these partitions now: drop their queued and retrying
        requests (it re-reads them from the committed offset). Batches already on a
        worker finish; their rows are harmless thanks to the upsert."""
        gone = set(tps)
        self.batcher.drop_partitions(tps)
        self.tracker.forget(tps)
        kept: deque[_Retry] = deque()
        for r in self.retries:
            r.batch.items = [p for p in r.batch.items if p.tp not in gone]
            if r.batch.items:
                kept.append(r)
        self.retries = kept

    def committable(self, only: set[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: o for tp, o in self.tracker.committable().items() if tp in only}

    def mark_committed(self, positions: dict[TopicPartition, int]) -> None:
        self.tracker.mark_committed(positions)

    def paused(self, current: frozenset[int]) -> frozenset[int]:
        """Classes whose buffer is full (hysteresis from the current pauses)."""
        return paused_classes(self.batcher.depth_by_rank(), current, self.budget)

    def set_cancelled(self, ids: frozenset[tuple[str, int]]) -> None:
        """Jobs cancelled by a client: their queued items are recorded, not run."""
        self.cancelled_jobs = ids

    # ---- views ---------------------------------------------------------------------------
    def load(self, lag: dict[str, int]) -> LoadReport:
        """Capacity and backlog for the API's admission control; ``lag``: what the lanes
        hold back in Kafka, per class."""
        capacity = self.capacity()
        backlog: dict[str, dict[str, int]] = {
            ref.label(): dict(zip(PRIORITY_CLASSES, depths, strict=True))
            for ref, depths in self.batcher.depth_by_model().items()
        }
        tenants = tenant_backlog(self.batcher.depth_by_tenant())
        return LoadReport(capacity, backlog, lag, tenants)

    def capacity(self) -> dict[str, ModelCapacity]:
        """Per model, each worker counted at its own class's curve (heterogeneous pools)."""
        by_class: list[dict[str, ModelCapacity]] = []
        for cls, curve in self.curves.items():
            refs = [set(w.refs) for w in self.workers if w.alive and w.worker_class == cls]
            if refs:
                limits = {
                    ref: self.class_max_batch.get((ref, cls), self.max_batch.get(ref, 1))
                    for ref in set().union(*refs)
                }
                by_class.append(capacity_by_model(curve, refs, limits))
        return merge_capacity(by_class)

    def idle(self) -> bool:
        """Nothing queued and nothing waiting to be retried."""
        return not len(self.batcher) and not self.retries

    def any_alive(self) -> bool:
        return any(w.alive for w in self.workers)

    def stop_dispatching(self) -> None:
        """Workers take nothing new; what they hold finishes."""
        self.dispatching = False


def merge_capacity(by_class: Sequence[dict[str, ModelCapacity]]) -> dict[str, ModelCapacity]:
    """One record per model from its records per worker class: the rates and workers add
    up; the batch shape is the class that delivers most's, and a batch of one is the
    fastest class's (what admission may promise the tightest deadline)."""
    out: dict[str, ModelCapacity] = {}
    for records in by_class:
        for key, rec in records.items():
            have = out.get(key)
            if have is None:
                out[key] = ModelCapacity(**rec)
                continue
            lead = rec if rec["items_s"] > have["items_s"] else have
            out[key] = ModelCapacity(
                items_s=have["items_s"] + rec["items_s"],
                batch=lead["batch"],
                batch_ms=lead["batch_ms"],
                single_ms=min(have["single_ms"], rec["single_ms"]),
                workers=have["workers"] + rec["workers"],
            )
    return out


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


def _record(items: list[Pending], status: RequestStatus, error: str) -> Write:
    """Requests finished without running (sync results first: a backlog of job batches
    must not delay a waiting caller's answer)."""
    return Write(priority=min(p.rank for p in items), status=status, items=items, error=error)
