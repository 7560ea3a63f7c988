"""The scheduler process: wires Kafka, the batcher, the workers and PostgreSQL.

Threads, each with one job:
  * two consumer lanes (scheduler/lane.py), one for sync classes and one for job
    items, each read Kafka with its own consumer, queue requests, commit offsets
    and handle rebalances;
  * one dispatcher per worker takes the batch the flush rule allows and sends it
    to its worker; a receiver per worker takes the results back in order and hands
    them on. A worker computes one batch at a time; while it runs one, a second may
    wait queued on it when batches are short (decision 0012), so sending, batch
    forming and result handling overlap the computation;
  * a small persister pool builds each batch's result rows, writes them in one
    transaction and only then marks its offsets done, so a commit never passes
    unsaved work.
Shared state (batcher, offset tracker) is guarded by one condition variable.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Message, Producer
from tenacity import Retrying, retry_if_exception_type, stop_never, wait_exponential_jitter

from core.config import Settings
from core.kafka import producer_config
from core.load_report import LoadReport
from core.messages import RequestMessage
from core.models.catalog import build_specs
from core.models.token_ids import is_tokenized
from core.protocol import WorkBatch, WorkResult
from core.topics import dead_letter_topic, ensure_topics
from core.vocab import PRIORITY_CLASSES, ModelRef, PriorityClass, RequestStatus
from results import modelregistry
from results.db import make_engine
from results.jobs import cancelled_unfinished_stmt
from results.load import forget_scheduler, process_id, report_scheduler
from results.schema import RequestRow
from results.store import persist
from scheduler.backpressure import BufferBudget, paused_classes
from scheduler.batcher import Batch, Batcher, BatchKey, FlushPolicy, Pending
from scheduler.capacity import capacity_by_model
from scheduler.costmodel import CostModel, best_batch_size
from scheduler.lane import ConsumerLane, held_lag, lane_specs
from scheduler.load_report import tenant_backlog
from scheduler.offsets import OffsetTracker
from scheduler.priority_pool import PriorityPool
from scheduler.retry import RetryPolicy, plan_failure
from scheduler.rows import batch_row, request_row, succeeded_rows
from scheduler.stagger import Running, background_hold_until
from scheduler.workerpool import WorkerHandle, WorkerLost, WorkerPool

log = logging.getLogger("gristmill.scheduler")

# On SIGTERM, queued requests get this long to run before the rest is handed back.
SHUTDOWN_DRAIN_S = 10.0
LOAD_REPORT_S = 0.25
# Job items: background work, started staggered across workers (scheduler/stagger.py).
BACKGROUND_RANK = PriorityClass.JOBS.rank
# A second batch is queued on a busy worker only when every model it serves computes a
# full batch within this (predicted): a sync request that arrives meanwhile waits for
# the queued batch too, so this bounds what pipelining can add to its latency
# (decision 0012).
PIPELINE_MAX_MS = 25.0
# Batches on one worker at most: the one computing and the one queued behind it.
MAX_IN_FLIGHT = 2
# How long a thread may hold the GIL while another waits for it (Python's default is
# 5 ms). Receivers and dispatchers wait on sockets and locks, then need the GIL at once
# while the consumer and persist threads run Python in bursts: at 5 ms a handoff can
# leave a worker idle longer than its batch takes (docs/bench/gpu.md).
GIL_SWITCH_S = 0.0005


@dataclass
class _Retry:
    not_before: float
    batch: Batch


@dataclass(eq=False)
class _InFlight:
    batch: Batch
    predicted_s: float
    sent: bool = False  # the bytes went out: the receiver may wait for its result


def _short(exc: BaseException | None) -> str:
    """The first line of an error: SQLAlchemy's full text repeats the whole statement."""
    return str(exc).splitlines()[0][:300] if exc else ""


class SchedulerService:
    def __init__(
        self,
        settings: Settings,
        *,
        socket_dir: Path,
        n_workers: int | None = None,
        models: list[str] | None = None,
    ):
        self._init_dispatch(settings)
        self.scheduler_id = process_id(
            settings.topic_prefix, f"{socket.gethostname()}-{os.getpid()}"
        )
        self.budget = BufferBudget.default(settings.max_buffered, len(PRIORITY_CLASSES))
        self.engine = make_engine(settings.database_url, pool_size=5)
        self.pool = WorkerPool(
            socket_path=socket_dir / "workers.sock",
            n_local=settings.workers if n_workers is None else n_workers,
            models=models or [m for m in settings.worker_models.split(",") if m],
            on_ready=self._on_worker_ready,
        )
        self.producer = Producer(producer_config(settings))
        # Sync traffic and job items are read by separate consumers (decision 0011).
        self.lanes = [ConsumerLane(settings, spec, self) for spec in lane_specs(settings)]

    def _init_dispatch(self, settings: Settings) -> None:
        """The state batching, dispatch and persistence share (no Kafka, no database:
        bench/gpu/worker_path.py runs the dispatch path on this alone)."""
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        self.settings = settings
        self.specs = build_specs(settings)
        self.cond = threading.Condition()
        self.cost = CostModel()
        self.max_batch: dict[ModelRef, int] = {}
        self.batcher = Batcher(
            policy=FlushPolicy(settings.max_linger_ms / 1000, settings.deadline_margin_ms / 1000),
            cost=self.cost,
            max_batch=lambda ref: self.max_batch.get(ref, 1),
            n_ranks=len(PRIORITY_CLASSES),
        )
        self.tracker = OffsetTracker()
        self.retries: deque[_Retry] = deque()
        self.retry_policy = RetryPolicy()
        self.handles: list[WorkerHandle] = []
        self.running: dict[str, Running] = {}  # worker id -> the batch it runs now
        # worker -> its batches sent and not yet answered, oldest (computing) first. By
        # handle: a restarted worker comes back under the same id.
        self.inflight: dict[WorkerHandle, deque[_InFlight]] = {}
        self.dispatchers: list[threading.Thread] = []
        self._senders_done: set[WorkerHandle] = set()  # workers whose dispatcher returned
        self.cancelled_jobs: frozenset[tuple[str, int]] = frozenset()  # (job id, attempt)
        self.stopping = threading.Event()  # stop consuming
        self.drained = threading.Event()  # stop dispatching (set after the drain on stop)
        # Two threads write any results; one more only sync results, so a sync row
        # never waits for a job batch's write to finish.
        self.persist_pool = PriorityPool(
            3, name="persist", reserved=1, background_from=BACKGROUND_RANK
        )
        self.stats = {"consumed": 0, "batches": 0, "expired": 0, "failed": 0, "persisted": 0}

    # ---- workers -------------------------------------------------------------------
    def _on_worker_ready(self, h: WorkerHandle) -> None:
        with self.cond:
            for m in h.hello.models:
                ref = ModelRef(m.name, m.version)
                profile = {int(k): v for k, v in m.profile_ms.items()}
                # The worker's warmup curve picks the batch size (most items/s within
                # the compute budget the SLOs leave); memory already bounded its max.
                size = best_batch_size(profile, m.max_batch_size, self.settings.batch_budget())
                self.max_batch[ref] = min(self.max_batch.get(ref, size), size)
                self.cost.seed(ref, profile)
            self.handles.append(h)
            self.inflight[h] = deque()
            self.cond.notify_all()
        self._announce()
        t = threading.Thread(
            target=self._dispatch_loop, args=(h,), daemon=True, name=f"dispatch-{h.worker_id}"
        )
        self.dispatchers.append(t)
        t.start()

    def _announce(self) -> None:
        with self.cond:
            infos = {
                (m.name, m.version): m for h in self.handles if h.alive for m in h.hello.models
            }
        try:
            with self.engine.begin() as conn:
                for (name, version), m in infos.items():
                    modelregistry.announce(
                        conn, name, version, self.max_batch[ModelRef(name, version)], m.profile_ms
                    )
        except Exception as exc:  # PostgreSQL down: the next heartbeat retries
            log.warning("model announce failed: %s", exc)

    def _heartbeat_loop(self) -> None:
        # Load reports four times a second: admission decides on them, and a stale view
        # lets a burst through for its whole age (docs/decisions/0008).
        ticks = 0
        while not self.stopping.wait(LOAD_REPORT_S):
            ticks += 1
            self._report_load()
            if ticks % round(1 / LOAD_REPORT_S) == 0:
                self._refresh_cancelled()
            if ticks % round(5 / LOAD_REPORT_S) == 0:
                self._announce()

    def _report_load(self) -> None:
        """Capacity and backlog for the API's admission control."""
        with self.cond:
            capacity = capacity_by_model(
                self.cost, [h.refs for h in self.handles if h.alive], self.max_batch
            )
            backlog: dict[str, dict[str, int]] = {
                ref.label(): dict(zip(PRIORITY_CLASSES, depths, strict=True))
                for ref, depths in self.batcher.depth_by_model().items()
            }
            lag = held_lag(self.lanes)
            tenants = tenant_backlog(self.batcher.depth_by_tenant())
        try:
            with self.engine.begin() as conn:
                report = LoadReport(capacity, backlog, lag, tenants)
                report_scheduler(conn, self.scheduler_id, report)
        except Exception as exc:
            log.warning("load report failed: %s", _short(exc))

    def _refresh_cancelled(self) -> None:
        """Jobs cancelled by a client: their queued items are recorded, not run."""
        try:
            with self.engine.connect() as conn:
                ids = frozenset(
                    (str(r[0]), int(r[1])) for r in conn.execute(cancelled_unfinished_stmt())
                )
        except Exception as exc:
            log.warning("cancelled-jobs refresh failed: %s", exc)
            return
        with self.cond:
            self.cancelled_jobs = ids

    # ---- dispatch ------------------------------------------------------------------
    def _next_batch(self, h: WorkerHandle) -> _InFlight | None:
        """Block until this worker has room and a batch to run (None when stopping)."""
        with self.cond:
            inflight = self.inflight[h]
            while not self.drained.is_set() and h.alive:
                if inflight and (len(inflight) >= MAX_IN_FLIGHT or not self._may_queue(h)):
                    self.cond.wait(0.25)  # the receiver wakes us when a result is back
                    continue
                now = time.time()
                expired = self.batcher.drop_expired(now)
                if expired:
                    self.stats["expired"] += len(expired)
                    rows = [
                        request_row(
                            p,
                            status=RequestStatus.EXPIRED,
                            error="deadline passed before a worker could run it",
                        )
                        for p in expired
                    ]
                    self._persist_async(rows, None, expired)
                for r in list(self.retries):
                    if r.not_before <= now and h.serves(r.batch.key.ref):
                        self.retries.remove(r)
                        return self._start(h, r.batch, now)
                hold = self._background_hold(h, now)
                if hold > now and self.batcher.urgent_may_wait(BACKGROUND_RANK, h.serves, hold):
                    # The batch would be filled with job items: spread this worker's start
                    # from the others', so a sync arrival never waits more than a batch
                    # time over the worker count (a sync arrival that cannot wait, or that
                    # fills a batch, wakes us and goes at once).
                    self.cond.wait(timeout=min(hold - now, 0.25))
                    continue
                batch = self.batcher.take(now, h.serves)
                if batch is not None:
                    self.cond.notify_all()  # the consumer may resume paused partitions
                    if self.cancelled_jobs:
                        batch = self._drop_cancelled(batch)
                    if batch is not None:
                        return self._start(h, batch, now)
                    continue
                wake = min(
                    [
                        self.batcher.wake_at(h.serves),
                        *[r.not_before for r in self.retries if h.serves(r.batch.key.ref)],
                    ]
                )
                self.cond.wait(
                    timeout=min(max(wake - now, 0.001), 0.25) if wake < math.inf else 0.25
                )
        return None

    def _may_queue(self, h: WorkerHandle) -> bool:
        """Whether a second batch may wait on this busy worker: a full batch of every
        model it serves is predicted short (caller holds the lock)."""
        return all(
            self.cost.predict_ms(ref, self.max_batch.get(ref, 1)) <= PIPELINE_MAX_MS
            for ref in h.refs
        )

    def _start(self, h: WorkerHandle, batch: Batch, now: float) -> _InFlight:
        """Record ``batch`` as going to ``h`` (caller holds the lock). ``running`` holds
        the batch a worker computes: this one if nothing is ahead of it."""
        predicted = self.cost.predict_ms(batch.key.ref, len(batch.items)) / 1000
        inflight = self.inflight[h]
        if not inflight:
            self.running[h.worker_id] = Running(now, predicted)
        entry = _InFlight(batch, predicted)
        inflight.append(entry)
        return entry

    def _background_hold(self, h: WorkerHandle, now: float) -> float:
        """Until when this worker should hold back a job batch (caller holds the lock)."""
        peers = [o for o in self.handles if o.alive and o.refs & h.refs]
        others = [
            self.running[o.worker_id] for o in peers if o is not h and o.worker_id in self.running
        ]
        return background_hold_until(now, others, len(peers))

    def _drop_cancelled(self, batch: Batch) -> Batch | None:
        """Record items of cancelled jobs as cancelled; the rest of the batch runs."""

        def cancelled(p: Pending) -> bool:
            return (p.msg.job_id, p.msg.job_attempt) in self.cancelled_jobs

        gone = [p for p in batch.items if cancelled(p)]
        if not gone:
            return batch
        rows = [
            request_row(p, status=RequestStatus.CANCELLED, error="the job was cancelled")
            for p in gone
        ]
        self._persist_async(rows, None, gone)
        batch.items = [p for p in batch.items if not cancelled(p)]
        return batch if batch.items else None

    @staticmethod
    def _work(batch: Batch) -> WorkBatch:
        """What the worker gets: token ids alone when the API tier tokenized every input
        (the text stays here, for the rows)."""
        first = batch.items[0].msg
        inputs = [p.msg.input for p in batch.items]
        if all(is_tokenized(x) for x in inputs):
            ids = [x["ids"] for x in inputs]
            return WorkBatch(
                batch.batch_id, batch.key.model, batch.key.version, first.params, ids, True
            )
        return WorkBatch(batch.batch_id, batch.key.model, batch.key.version, first.params, inputs)

    def _dispatch_loop(self, h: WorkerHandle) -> None:
        """Send this worker the batches the flush rule releases; its receiver thread
        takes the results. Returns once both are done with the worker."""
        receiver = threading.Thread(
            target=self._receive_loop, args=(h,), daemon=True, name=f"results-{h.worker_id}"
        )
        receiver.start()
        try:
            while True:
                entry = self._next_batch(h)
                if entry is None:
                    return
                batch = entry.batch
                self.stats["batches"] += 1
                try:
                    h.send(self._work(batch))
                except WorkerLost as exc:
                    # This batch never reached the worker: back unchanged (unless the
                    # receiver, finding the worker lost, already gave it back).
                    log.warning(
                        "%s; handing back batch %s (%d items)",
                        exc,
                        batch.batch_id,
                        len(batch.items),
                    )
                    with self.cond:
                        queue = self.inflight[h]
                        if entry in queue:
                            queue.remove(entry)
                            self.retries.append(_Retry(time.time(), batch))
                        self.cond.notify_all()
                    return
                with self.cond:
                    entry.sent = True
                    self.cond.notify_all()
        finally:
            with self.cond:
                self._senders_done.add(h)
                self.cond.notify_all()
            receiver.join()
            with self.cond:
                self._senders_done.discard(h)
                if not h.alive and h in self.handles:
                    self.handles.remove(h)

    def _receive_loop(self, h: WorkerHandle) -> None:
        """Results in the order the batches were sent; a lost worker hands back all it held."""
        queue = self.inflight[h]
        while True:
            with self.cond:
                while not (queue and queue[0].sent) and h not in self._senders_done:
                    self.cond.wait(0.25)
                if not (queue and queue[0].sent):
                    return  # the dispatcher is done and nothing was sent
                head = queue[0]
            try:
                result = h.receive(self.settings.batch_timeout_s)
            except WorkerLost as exc:
                self._worker_lost(h, exc)
                return
            batch = head.batch
            with self.cond:
                if queue and queue[0] is head:
                    queue.popleft()
                if queue:  # the queued batch computes from now on
                    self.running[h.worker_id] = Running(time.time(), queue[0].predicted_s)
                else:
                    self.running.pop(h.worker_id, None)
                if result.error is None:
                    ms = (result.compute_end - result.compute_start) * 1000
                    self.cost.observe(batch.key.ref, len(batch.items), ms)
                self.cond.notify_all()
            if result.error is not None:
                self._on_failure(batch, result.error)
                continue
            self._persist_result(h, batch, result)

    def _worker_lost(self, h: WorkerHandle, exc: WorkerLost) -> None:
        """Drop the worker and hand back every batch it held: the oldest was computing
        (``exc.ran``: it counts as an attempt), those queued behind it never started
        and go back unchanged."""
        with self.cond:
            queue = self.inflight[h]
            held = [f.batch for f in queue]
            queue.clear()
            if h in self.handles:
                self.handles.remove(h)
            if all(o.worker_id != h.worker_id for o in self.handles):  # not its successor's
                self.running.pop(h.worker_id, None)
            now = time.time()
            blamed = held[0] if held and exc.ran else None
            for b in held:
                if b is not blamed:
                    self.retries.append(_Retry(now, b))
            self.cond.notify_all()
        for i, b in enumerate(held):
            log.warning(
                "%s; handing back batch %s (%d items%s)",
                exc,
                b.batch_id,
                len(b.items),
                "" if i == 0 else ", queued behind it, never started",
            )
        if blamed is not None:
            self._on_failure(blamed, str(exc))

    def _persist_result(self, h: WorkerHandle, batch: Batch, result: WorkResult) -> None:
        """Rows are built in the persist thread: the receiver is free for the next."""
        self.persist_pool.submit(
            min(p.rank for p in batch.items), self._persist_batch, h.worker_id, batch, result
        )

    def _persist_batch(self, worker_id: str, batch: Batch, result: WorkResult) -> None:
        assert result.outputs is not None
        rows = succeeded_rows(batch, result.outputs, result.compute_start, result.compute_end)
        brow = batch_row(
            batch,
            worker_id=worker_id,
            status="succeeded",
            error=None,
            compute_start=result.compute_start,
            compute_end=result.compute_end,
        )
        sync = [(r, p) for r, p in zip(rows, batch.items, strict=True) if p.msg.job_id is None]
        if not sync or len(sync) == len(rows):
            self._persist(rows, brow, batch.items)
            return
        # A batch of sync requests topped up with job items: the sync rows go in a short
        # transaction of their own (and are announced at once), the job rows follow at
        # background priority. Each request still gets exactly one row, and each
        # offset is marked done only once its row is written (decision 0013).
        jobs = [(r, p) for r, p in zip(rows, batch.items, strict=True) if p.msg.job_id]
        self._persist([r for r, _ in sync], brow, [p for _, p in sync])
        self.persist_pool.submit(
            BACKGROUND_RANK, self._persist, [r for r, _ in jobs], None, [p for _, p in jobs]
        )

    def _on_failure(self, batch: Batch, error: str) -> None:
        plan = plan_failure(batch.items, self.retry_policy)
        now = time.time()
        with self.cond:
            for group in plan.retry_groups:
                self.retries.append(
                    _Retry(
                        now + plan.retry_delay_s,
                        Batch(key=batch.key, items=group, formed_at=now, reason="retry"),
                    )
                )
            self.cond.notify_all()
        if plan.failed:
            self.stats["failed"] += len(plan.failed)
            rows = [
                request_row(
                    p,
                    status=RequestStatus.FAILED,
                    error=f"{error} (gave up after {p.msg.attempt} attempts)",
                    batch=batch,
                )
                for p in plan.failed
            ]
            for p in plan.failed:
                self.producer.produce(
                    dead_letter_topic(self.settings),
                    key=p.msg.request_id,
                    value=p.msg.encode(),
                    headers={"error": error[:1000]},
                )
            # The dead-letter copy must be in Kafka before the offset can move past it.
            if self.producer.flush(30):
                log.error("dead-letter copies of %d requests not confirmed", len(plan.failed))
            self._persist_async(rows, None, plan.failed)

    # ---- persistence ---------------------------------------------------------------
    def _persist_async(
        self, rows: list[RequestRow], brow: dict[str, Any] | None, items: list[Pending]
    ) -> None:
        # Sync results first: a backlog of job batches must not delay a waiting caller.
        self.persist_pool.submit(min(p.rank for p in items), self._persist, rows, brow, items)

    def _persist(
        self, rows: list[RequestRow], brow: dict[str, Any] | None, items: list[Pending]
    ) -> None:
        try:
            for attempt in Retrying(
                stop=stop_never,
                wait=wait_exponential_jitter(initial=0.05, max=1.0),  # resume soon after
                retry=retry_if_exception_type(Exception),
                reraise=True,
                before_sleep=lambda rs: log.warning(
                    "persist failed (attempt %d): %s",
                    rs.attempt_number,
                    _short(rs.outcome.exception() if rs.outcome else None),
                ),
            ):
                with attempt:
                    if self.stopping.is_set() and attempt.retry_state.attempt_number > 3:
                        return  # offsets stay uncommitted: Kafka redelivers this work
                    persist(self.engine, rows, brow)
        except Exception:
            log.exception("giving up on persisting %d results", len(rows))
            return
        with self.cond:
            self.stats["persisted"] += len(rows)
            for p in items:
                self.tracker.done(p.tp, p.offset)

    # ---- what the consumer lanes call (each from its own thread) --------------------
    def accept(self, msgs: list[Message], owned: set[tuple[str, int]], now: float) -> None:
        """Queue fetched requests (skipping those fetched just before a revocation)."""
        pending: list[Pending] = []
        for msg in msgs:
            try:
                pending.append(self._pending(msg, now))
            except Exception as exc:  # a malformed message must not stall a partition
                log.error(
                    "undecodable message at %s[%d]@%d: %s",
                    msg.topic(),
                    msg.partition(),
                    msg.offset(),
                    exc,
                )
        with self.cond:
            for p in pending:
                if p.tp not in owned:
                    continue
                self.tracker.track(p.tp, p.offset)
                self.batcher.add(p)
                self.stats["consumed"] += 1
            self.cond.notify_all()

    def give_up_partitions(self, tps: list[tuple[str, int]]) -> None:
        """Stop working on partitions another member now owns: drop their queued and
        retrying requests (the new owner re-reads them from the committed offset).
        Batches already on a worker finish; their rows are harmless thanks to the upsert."""
        gone = set(tps)
        with self.cond:
            self.batcher.drop_partitions(tps)
            self.tracker.forget(tps)
            kept: deque[_Retry] = deque()
            for r in self.retries:
                r.batch.items = [p for p in r.batch.items if p.tp not in gone]
                if r.batch.items:
                    kept.append(r)
            self.retries = kept

    def committable(self, only: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        with self.cond:
            return {tp: o for tp, o in self.tracker.committable().items() if tp in only}

    def mark_committed(self, positions: dict[tuple[str, int], int]) -> None:
        with self.cond:
            self.tracker.mark_committed(positions)

    def wanted_paused(self, paused: frozenset[int]) -> frozenset[int]:
        """Classes whose buffer is full (hysteresis from the lane's current pauses)."""
        with self.cond:
            depths = self.batcher.depth_by_rank()
        return paused_classes(depths, paused, self.budget)

    def _pending(self, msg: Message, now: float) -> Pending:
        value, topic, partition, offset = msg.value(), msg.topic(), msg.partition(), msg.offset()
        assert value is not None and topic is not None and partition is not None
        assert offset is not None
        req = RequestMessage.decode(value)
        _, ts_ms = msg.timestamp()
        req.extra["produced_at"] = ts_ms / 1000.0 if ts_ms > 0 else None
        spec = self.specs.get(req.model, {}).get(req.version)
        params = spec.batch_params(req.params) if spec else tuple(sorted(req.params.items()))
        rank = PRIORITY_CLASSES.index(req.priority) if req.priority in PRIORITY_CLASSES else 2
        return Pending(
            msg=req,
            key=BatchKey(req.model, req.version, params),
            rank=rank,
            tp=(topic, partition),
            offset=offset,
            consumed_at=now,
        )

    def run(self) -> None:
        ensure_topics(self.settings)
        self.pool.start()
        threading.Thread(target=self._heartbeat_loop, daemon=True, name="heartbeat").start()
        for lane in self.lanes:
            lane.start(self.stopping)
        log.info("scheduler running")
        while not self.stopping.wait(0.1):
            self.producer.poll(0)
        self._shutdown()

    def stop(self, *_: object) -> None:
        self.stopping.set()
        self.pool.stop_restarts()
        with self.cond:
            self.cond.notify_all()

    def _shutdown(self) -> None:
        """Finish in-flight batches, persist, commit, leave the group."""
        log.info("scheduler stopping")
        # Run what is already queued (briefly), so the next owner of our partitions
        # need not compute again what we persisted past an unstarted request. Then the
        # dispatchers return after the batch they are running; requests that never
        # started are not committed, so the partitions' next owner re-reads them.
        drain_until = time.time() + SHUTDOWN_DRAIN_S
        with self.cond:
            while (
                (len(self.batcher) or self.retries)
                and time.time() < drain_until
                and any(h.alive for h in self.handles)
            ):
                self.cond.wait(0.05)
            self.drained.set()
            self.cond.notify_all()
        deadline = time.time() + self.settings.batch_timeout_s
        for t in self.dispatchers:
            t.join(timeout=max(0.1, deadline - time.time()))
        for h in list(self.handles):
            h.stop()
        self.persist_pool.shutdown(wait=True)
        for lane in self.lanes:  # final commit, then leave both groups
            lane.finish()
        self.producer.flush(5)
        self.pool.stop()
        try:  # stop counting toward capacity at once rather than after the staleness window
            with self.engine.begin() as conn:
                forget_scheduler(conn, self.scheduler_id)
        except Exception as exc:
            log.warning("could not withdraw load report: %s", _short(exc))
        log.info("scheduler stopped: %s", self.stats)

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
