"""The dispatch core: what each worker runs next, and what every outcome changes. Pure.

One object owns the scheduler's decisions between Kafka and PostgreSQL: the queues
(``Batcher``), the offsets (``OffsetTracker``), the retries, and what each worker holds.
The service asks it for a worker's next step (``schedule``: start a batch, wait until a
time, stop) and reports what happened (a fetch, a result, a failure, a lost worker, a
write, a revocation); each answer is plain data for the service to carry out, above all
``Write``s: rows to store in one transaction, after which their offsets are done.

No threads, locks, sockets, Kafka or SQL here, and the clock is an argument (``now``,
epoch seconds), so every rule is tested by feeding it hand-built events
(tests/unit/scheduler/test_dispatch_core.py). The calls it answers are
``SchedulerInterface`` (scheduler/core/interface.py); observers read ``make_stats``.
Not thread-safe: the runtime makes every call under one lock (scheduler/runtime/host.py;
docs/decisions/0018-a-pure-dispatch-core.md, 0047).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from core.config import Settings
from core.load_report import LoadReport, ModelCapacity
from core.protocol import ModelInfo, WorkResult
from core.shed import shed_error
from core.vocab import PRIORITY_CLASSES, ModelRef, RequestStatus
from scheduler.core.backpressure import BufferBudget, paused_classes
from scheduler.core.batcher import Batch, Batcher, FlushPolicy, FlushReason, Pending, Sizing
from scheduler.core.capacity import capacity_by_model, merge_capacity
from scheduler.core.charging import charge
from scheduler.core.costmodel import CostModel
from scheduler.core.curves import ClassCurves
from scheduler.core.itemcost import ItemCosts
from scheduler.core.load_report import tenant_backlog
from scheduler.core.offsets import OffsetTracker, TopicPartition
from scheduler.core.plans import (
    BACKGROUND_RANK,
    CANCELLED_ERROR,
    DEFAULT_CLASS,
    EXPIRED_ERROR,
    MAX_IN_FLIGHT,
    PIPELINE_MAX_MS,
    InFlight,
    Lost,
    Reject,
    Step,
    Worker,
    Write,
    record,
    result_writes,
)
from scheduler.core.retry import RetryPolicy, plan_failure
from scheduler.core.shares import Shares
from scheduler.core.shedding import (
    SHED_PERIOD_S,
    SHED_SCAN_ITEMS_S,
    by_retry_after,
    live_rates,
)
from scheduler.core.stagger import Running, background_hold_until
from scheduler.core.stats import CoreStats, WorkerStats, snapshot, worker_stats


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
        fair_by_device_time: bool = True,
    ):
        self.max_in_flight = max_in_flight
        self.budget = budget
        self.retry = retry or RetryPolicy()
        self.rng = rng
        # Cost curves and batch limits per worker class (scheduler/core/curves.py); the
        # dicts are the same objects, named here as readers of the core know them.
        self.classes = ClassCurves(batch_budget_ms)
        self.cost = self.classes.cost
        self.curves = self.classes.curves
        self.max_batch = self.classes.max_batch
        self.class_max_batch = self.classes.class_max_batch
        default = self.sizing(DEFAULT_CLASS)
        # An item's device time by length, and each tenant's received and entitled
        # device seconds per tier (decision 65).
        self.item_costs = ItemCosts()
        self.shares = Shares()
        self.batcher = Batcher(
            policy=flush,
            cost=default.cost,
            max_batch=default.max_batch,
            n_ranks=len(PRIORITY_CLASSES),
            prices=self.item_costs if fair_by_device_time else None,
        )
        self.tracker = OffsetTracker()
        self.retries: deque[_Retry] = deque()
        self.workers: list[Worker] = []
        self.cancelled_jobs: frozenset[tuple[str, int]] = frozenset()  # (job id, attempt)
        self.dispatching = True
        self._shed_at = 0.0  # when the queues were last checked for requests to shed
        self.stats = dict.fromkeys(
            (
                "consumed",
                "rejected",
                "batches",
                "expired",
                "shed",
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
            fair_by_device_time=settings.fair_share_by == "device_time",
            **kw,
        )

    # ---- workers ---------------------------------------------------------------------
    def curve(self, worker_class: str) -> CostModel:
        return self.classes.curve(worker_class)

    def sizing(self, worker_class: str) -> Sizing:
        return self.classes.sizing(worker_class)

    def add_worker(
        self, worker_id: str, models: Sequence[ModelInfo], worker_class: str = DEFAULT_CLASS
    ) -> Worker:
        self.classes.learn(models, worker_class)
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
        self.classes.learn(new, w.worker_class)
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
                limit = self.classes.cap(w.worker_class, ref)
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
        s = self.sizing(w.worker_class)
        return all(s.cost.predict_ms(ref, s.limit(ref)) <= PIPELINE_MAX_MS for ref in w.refs)

    # ---- what a free worker does next ----------------------------------------------------
    def schedule(self, w: Worker, now: float) -> Step:
        # The batcher sizes and times batches with the curves of the worker that will
        # run them (heterogeneous pools).
        sizing = self.sizing(w.worker_class)
        writes: list[Write] = []
        while True:
            if not self.dispatching or not w.alive:
                return Step(stop=True, writes=writes)
            full = bool(w.queue) and (len(w.queue) >= self.max_in_flight or not self.may_queue(w))
            # Slots full of job batches only: one more, of sync requests, may go (a worker
            # shared by several schedulers launches it before their job batches, decision 76).
            extra = full and w.full_of_jobs(self.max_in_flight) and self.may_queue(w)
            if full and not extra:
                return Step(writes=writes)  # busy: its next result changes that
            expired = self.batcher.drop_expired(now, sizing)
            if expired:
                self.stats["expired"] += len(expired)
                writes.append(record(expired, RequestStatus.EXPIRED, EXPIRED_ERROR))
            writes.extend(self._shed(now))
            if extra:
                rank = BACKGROUND_RANK - 1
                batch = self.batcher.take(now, w.serves, sizing, max_rank=rank)
                if batch is None:
                    wake = self.batcher.wake_at(w.serves, sizing, max_rank=rank)
                    return Step(wait_until=wake, writes=writes)
            else:
                for r in self.retries:
                    if r.not_before <= now and w.serves(r.batch.key.ref):
                        self.retries.remove(r)
                        return Step(start=self._start(w, r.batch, now), writes=writes)
                hold = self._background_hold(w, now)
                if hold > now and self.batcher.urgent_may_wait(
                    BACKGROUND_RANK, w.serves, hold, sizing
                ):
                    # Job items would fill the batch, or the workers are saturated: its
                    # start is spread from the others' (stagger.py), so a sync arrival
                    # waits at most a batch time over the worker count.
                    return Step(wait_until=hold, writes=writes)
                batch = self.batcher.take(now, w.serves, sizing)
                if batch is None:
                    retries = [r.not_before for r in self.retries if w.serves(r.batch.key.ref)]
                    wake = min([self.batcher.wake_at(w.serves, sizing), *retries])
                    return Step(wait_until=wake, writes=writes)
            if self.cancelled_jobs:
                gone = [p for p in batch.items if self._cancelled(p)]
                if gone:
                    self.stats["cancelled"] += len(gone)
                    writes.append(record(gone, RequestStatus.CANCELLED, CANCELLED_ERROR))
                    batch.items = [p for p in batch.items if not self._cancelled(p)]
                    if not batch.items:
                        continue
            return Step(start=self._start(w, batch, now), writes=writes)

    def _shed(self, now: float) -> list[Write]:
        """Sync requests the queue says will start too late, dropped now rather than at
        their deadline (scheduler/core/shedding.py); at most every ``SHED_PERIOD_S``,
        and less often while the queues are long (the check reads every sync item)."""
        queued = len(self.batcher)
        if now - self._shed_at < max(SHED_PERIOD_S, queued / SHED_SCAN_ITEMS_S):
            return []
        self._shed_at = now
        shed = self.batcher.drop_hopeless(now, *live_rates(self.workers, self.sizing))
        self.stats["shed"] += len(shed)
        return [
            record(items, RequestStatus.EXPIRED, shed_error(retry))
            for retry, items in by_retry_after(shed)
        ]

    def _cancelled(self, p: Pending) -> bool:
        return (p.msg.job_id, p.msg.job_attempt) in self.cancelled_jobs

    def _start(self, w: Worker, batch: Batch, now: float) -> InFlight:
        """``batch`` goes to ``w``; it computes from now if nothing is ahead of it."""
        predicted = self.curve(w.worker_class).predict_ms(batch.key.ref, len(batch.items)) / 1000
        w.used_at[batch.key.ref] = now
        if not w.queue:
            w.running = Running(now, predicted)
        background = all(p.rank >= BACKGROUND_RANK for p in batch.items)
        entry = InFlight(batch, predicted, background=background)
        w.queue.append(entry)
        self.stats["batches"] += 1
        return entry

    def _background_hold(self, w: Worker, now: float) -> float:
        """Until when this worker should hold back a job batch."""
        peers = [o for o in self.workers if o.alive and o.refs & w.refs]
        others = [o.running for o in peers if o is not w and o.running is not None]
        return background_hold_until(now, others, len(peers))

    # ---- what comes back -------------------------------------------------------------
    def sent(self, w: Worker, entry: InFlight) -> None:
        """The batch's bytes went out: its result may be awaited."""
        entry.sent = True

    def awaiting(self, w: Worker) -> InFlight | None:
        """The oldest batch on ``w`` once it was sent (its result comes next), else None."""
        head = w.queue[0] if w.queue else None
        return head if head is not None and head.sent else None

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
        charge(self.item_costs, self.shares, batch, ms, now)
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
                    Batch(key=batch.key, items=group, formed_at=now, reason=FlushReason.RETRY),
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
                limits = {ref: self.classes.cap(cls, ref) for ref in set().union(*refs)}
                by_class.append(capacity_by_model(curve, refs, limits))
        return merge_capacity(by_class)

    def make_stats(self, now: float) -> CoreStats:
        """A snapshot for metrics and logs (walks what is in flight and retrying: for a
        scrape or a report, not the hot path)."""
        held = [r.batch for r in self.retries]
        shares = self.shares.snapshot()
        return snapshot(now, self.stats, self.batcher, self.workers, held, self.max_batch, shares)

    def worker_stats(self, w: Worker) -> WorkerStats:
        return worker_stats(w)

    def demanded(self) -> frozenset[ModelRef]:
        """The versions with requests queued or waiting for a retry."""
        queued = {ref for ref, depths in self.batcher.depth_by_model().items() if sum(depths)}
        return frozenset(queued | {r.batch.key.ref for r in self.retries})

    def batch_limits(self) -> Mapping[ModelRef, int]:
        """The largest batch each model's workers take: a live, read-only view (read
        without the lock by the receivers' metrics: one dict lookup)."""
        return MappingProxyType(self.max_batch)

    def idle(self) -> bool:
        """Nothing queued and nothing waiting to be retried."""
        return not len(self.batcher) and not self.retries

    def any_alive(self) -> bool:
        return any(w.alive for w in self.workers)

    def stop_dispatching(self) -> None:
        """Workers take nothing new; what they hold finishes."""
        self.dispatching = False
