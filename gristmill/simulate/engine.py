"""A discrete-event simulation of the whole request path, on a virtual clock.

It runs the project's own pure policy code, unchanged, where the real processes run it:
per-tenant rate limits (ingest/admission/ratelimit.py) and admission
(ingest/admission/capacity.py) in each API instance; in each scheduler the dispatch core
(scheduler/core/dispatch.py, or another ``Dispatch``: gristmill/simulate/dispatch.py) with
its batcher, flush rule, fairness, stagger, retries, offsets, cost model, capacity and
load reports, and the partition backpressure. What it replaces by numbers is I/O:
Kafka's transit, PostgreSQL's commit, the answer's way back (``Overheads``), and the
model, whose batches take what its cost curve says. Reports reach the API instances as
in the real system: written every ``report_s``, read every ``refresh_s``.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

from core.load_report import LoadReport
from core.messages import RequestMessage
from core.protocol import ModelInfo, WorkResult
from core.shed import shed_retry_after_s
from core.vocab import PRIORITY_CLASSES, ModelRef, RequestStatus
from gristmill.simulate.dispatch import FACTORIES, Dispatch
from gristmill.simulate.report import ORDER_WINDOW_S, Result
from gristmill.simulate.scenario import Scenario
from ingest.admission.capacity import Admission
from ingest.admission.ratelimit import TenantLimiter
from ingest.admission.view import LoadView
from scheduler.core.batcher import BatchKey, Pending
from scheduler.core.offsets import TopicPartition
from scheduler.core.plans import InFlight, Worker, Write

MODEL = "model"
VERSION = "1"
REF = ModelRef(MODEL, VERSION)
REF_LABEL = REF.label()
KEY = BatchKey(MODEL, VERSION)
N_RANKS = len(PRIORITY_CLASSES)
DELIVERY_QUANTUM_S = 0.002  # a consumer reads what arrived in the last 2 ms at once (one fetch)
VIEW_QUANTUM_S = 0.01  # API instances refreshing this close together see the same view

# Event kinds, in the order simultaneous events run.
_WORKER, _DONE, _DELIVER, _REPORT, _REFRESH, _WAKE = range(6)


class _Api:
    def __init__(self, sc: Scenario, index: int):
        self.index = index
        self.limiter = TenantLimiter()
        self.limiter.instances = sc.api_instances
        self.admission = Admission(margin_s=sc.margin_ms / 1000, max_buffered=sc.max_buffered)
        self.view: LoadView | None = None
        self.refused_at = [-math.inf] * N_RANKS  # for the order check, independent of policy


@dataclass(eq=False)
class _Worker:
    """One model worker: its compute queue (in order) and the core's view of it."""

    index: int
    sched: _Scheduler
    core: Worker
    alive: bool = True
    token: int = 0  # bumped when it dies: its pending events are stale
    busy_until: float = 0.0  # when the last batch given to it finishes computing
    computing: deque[InFlight] = field(default_factory=deque)
    wake_at: float = math.inf  # its pending wake-up (one at a time)


class _Scheduler:
    def __init__(self, sc: Scenario, index: int):
        self.index = index
        self.sc = sc
        self.core: Dispatch = FACTORIES[sc.dispatch](sc)
        self.workers: list[_Worker] = []
        self.kafka: list[deque[tuple[float, Pending]]] = [deque() for _ in range(N_RANKS)]
        self.paused: frozenset[int] = frozenset()
        self.deliver_at = math.inf  # the pending delivery event's time
        self.owned: set[TopicPartition] = set()
        self.offsets: dict[TopicPartition, int] = {}

    def model_info(self) -> list[ModelInfo]:
        return [ModelInfo(MODEL, VERSION, self.sc.cost.cap, self.sc.cost.warmup_profile())]

    def report(self) -> LoadReport:
        lag = {str(PRIORITY_CLASSES[r]): len(self.kafka[r]) for r in self.paused if self.kafka[r]}
        return self.core.load(lag)


class Simulation:
    def __init__(self, sc: Scenario):
        self.sc = sc
        self.rng = random.Random(sc.seed)
        self.now = 0.0
        self._events: list[tuple[float, int, int, int, object]] = []
        self._seq = itertools.count()
        self.apis = [_Api(sc, i) for i in range(sc.api_instances)]
        self.scheds = [_Scheduler(sc, i) for i in range(sc.schedulers)]
        self.workers: list[_Worker] = []
        for i in range(sc.workers):
            s = self.scheds[i % sc.schedulers]
            w = _Worker(i, s, s.core.add_worker(f"w{i}", s.model_info()))
            s.workers.append(w)
            self.workers.append(w)
        self.reports: dict[int, tuple[float, LoadReport]] = {}
        self.result = Result(sc)
        self._rr = 0
        self._n_apis = len(self.apis)
        self._kafka_s = sc.overheads.kafka_ms / 1000
        self._answer_s = (sc.overheads.persist_ms + sc.overheads.answer_ms) / 1000
        self._gap_s = sc.overheads.dispatch_gap_ms / 1000
        self._stream_rank = [PRIORITY_CLASSES.index(st.tier) for st in sc.streams]
        self._stream_timeout = [(st.timeout_ms or sc.slo_ms[st.tier]) / 1000 for st in sc.streams]
        self._view: LoadView | None = None
        self._view_at = -math.inf

    # ---- the event queue -------------------------------------------------------------
    def _at(self, t: float, kind: int, a: int = 0, payload: object = None) -> None:
        heapq.heappush(self._events, (t, kind, next(self._seq), a, payload))

    def run(self) -> Result:
        sc = self.sc
        # As in a deployment, the schedulers have reported and the API instances have
        # read the reports before traffic starts.
        for s in self.scheds:
            self.reports[s.index] = (0.0, s.report())
            self._at(sc.overheads.report_s * (s.index + 1) / len(self.scheds), _REPORT, s.index)
        for api in self.apis:
            self._refresh(api)
            self._at(sc.overheads.refresh_s * (api.index + 1) / len(self.apis), _REFRESH, api.index)
        for ev in sc.worker_events:
            self._at(ev.at_s, _WORKER, ev.worker, ev.kind)
        end = sc.seconds + max(sc.slo_ms.values()) / 1000 + 1  # let admitted work finish
        events = self._events
        # Arrivals come from their own time-ordered stream (a second at a time) rather
        # than the heap: they are most of the events, and none depends on another.
        arrivals = self._arrivals()
        nxt = next(arrivals, None)
        while events or nxt is not None:
            if nxt is not None and (not events or nxt[0] < events[0][0]):
                self.now = nxt[0]
                self._arrive(nxt[1])
                nxt = next(arrivals, None)
                continue
            t, kind, _, a, payload = heapq.heappop(events)
            if t > end:
                break
            self.now = t
            if kind == _DONE:
                self._done(a, payload)
            elif kind == _WAKE:
                w = self.workers[a]
                if payload == w.token and w.alive and t == w.wake_at:
                    w.wake_at = math.inf
                    self._kick(w)
            elif kind == _DELIVER:
                self._deliver(self.scheds[a])
            elif kind == _REPORT:
                s = self.scheds[a]
                self.reports[a] = (t, s.report())
                s.core.mark_committed(s.core.committable(s.owned))  # keeps its books small
                if t < sc.seconds + 1:
                    self._at(t + sc.overheads.report_s, _REPORT, a)
            elif kind == _REFRESH:
                self._refresh(self.apis[a])
                if t < sc.seconds + 1:
                    self._at(t + sc.overheads.refresh_s, _REFRESH, a)
            elif kind == _WORKER:
                self._worker_event(a, str(payload))
        self.result.finish(self.now)
        return self.result

    # ---- traffic -----------------------------------------------------------------------
    def _arrivals(self) -> Iterator[tuple[float, int]]:
        """(time, stream) of every request, in time order, generated a second at a time:
        Poisson per stream, or a burst's ``count`` evenly spaced at its rate."""
        sc = self.sc
        rng = self.rng
        nxt: list[float] = []  # each stream's next arrival
        sent = [0] * len(sc.streams)
        for s in sc.streams:
            if s.count is not None:
                nxt.append(s.start_s if s.count > 0 else math.inf)
            elif s.rate > 0:
                nxt.append(s.start_s + rng.expovariate(s.rate / s.clump))
            else:
                nxt.append(math.inf)
        second = 0.0
        while second < sc.seconds:
            upto = min(second + 1.0, sc.seconds)
            chunk: list[tuple[float, int]] = []
            for i, s in enumerate(sc.streams):
                t = nxt[i]
                stop = min(upto, s.end_s)
                while t < stop:
                    chunk.append((t, i))
                    sent[i] += 1
                    if s.count is not None:
                        t = s.start_s + sent[i] / s.rate if sent[i] < s.count else math.inf
                    elif sent[i] % s.clump:
                        t += 1e-6  # the rest of its clump, at once
                    else:
                        t += rng.expovariate(s.rate / s.clump)
                nxt[i] = t if t < s.end_s else math.inf
            chunk.sort()
            yield from chunk
            second = upto

    def _arrive(self, i: int) -> None:
        s = self.sc.streams[i]
        now = self.now
        api = self.apis[self._rr]
        self._rr = (self._rr + 1) % self._n_apis
        res = self.result
        res.offered(s, now)
        if s.rate_limit is not None:
            v = api.limiter.check(
                s.tenant, "requests", rate=s.rate_limit[0], burst=s.rate_limit[1], n=1, now=now
            )
            if not v.allowed:
                res.refused(s, now, "rate_limit", v.retry_after_s)
                return
        rank, timeout_s = self._stream_rank[i], self._stream_timeout[i]
        d = api.admission.decide(
            api.view,
            REF_LABEL,
            s.tier,
            tenant=s.tenant,
            weight=s.weight,
            deadline_s=timeout_s,
            now=now,
            instances=self._n_apis,
        )
        if not d.admit:
            res.refused(s, now, d.reason, d.retry_after_s)
            if d.reason in ("capacity", "buffer"):
                api.refused_at[rank] = now
            return
        # Strict order, checked here independently of the policy's own bookkeeping.
        if rank and now - max(api.refused_at[:rank]) < ORDER_WINDOW_S:
            res.order_violations += 1
        res.admitted(s, now)
        msg = RequestMessage(
            request_id="",
            tenant_id=s.tenant,
            priority=s.tier,
            model=MODEL,
            version=VERSION,
            input=None,
            params={},
            deadline=now + timeout_s,
            received_at=now,
            weight=s.weight,
        )
        if self.sc.key_by_tenant:
            part = zlib.crc32(s.tenant.encode()) % self.sc.partitions
        else:
            part = int(self.rng.random() * self.sc.partitions)
        sched = self.scheds[part % len(self.scheds)]
        tp = (s.tier, part)
        offset = sched.offsets.get(tp, 0)
        sched.offsets[tp] = offset + 1
        sched.owned.add(tp)
        arrive = now + self._kafka_s
        p = Pending(msg=msg, key=KEY, rank=rank, tp=tp, offset=offset, consumed_at=arrive)
        sched.kafka[rank].append((arrive, p))
        if rank not in sched.paused:
            self._schedule_delivery(sched, arrive)

    def _schedule_delivery(self, sched: _Scheduler, t: float) -> None:
        t = math.ceil(t / DELIVERY_QUANTUM_S) * DELIVERY_QUANTUM_S
        if t < sched.deliver_at:
            sched.deliver_at = t
            self._at(t, _DELIVER, sched.index)

    def _deliver(self, sched: _Scheduler) -> None:
        now = self.now
        if sched.deliver_at > now + 1e-12:
            return  # a stale event: a later one is queued
        sched.deliver_at = math.inf
        nxt = math.inf
        items: list[Pending] = []
        for rank, q in enumerate(sched.kafka):
            if rank in sched.paused:
                continue
            while q and q[0][0] <= now + 1e-9:
                _, p = q.popleft()
                p.consumed_at = now
                items.append(p)
            if q:
                nxt = min(nxt, q[0][0])
        sched.core.accept(items, [], sched.owned)
        self._backpressure(sched)
        if nxt < math.inf:
            self._schedule_delivery(sched, nxt)
        # Idle workers ask for work, one after another, until one finds none ready (the
        # others would find none either; their own wake-ups stand).
        for w in sched.workers:
            if w.alive and not w.computing:
                self._kick(w)
                if not w.computing:
                    break

    def _backpressure(self, sched: _Scheduler) -> None:
        was = sched.paused
        sched.paused = sched.core.paused(was)
        for rank in was - sched.paused:  # resumed: what Kafka held is read now
            if sched.kafka[rank]:
                self._schedule_delivery(sched, max(self.now, sched.kafka[rank][0][0]))

    # ---- workers -----------------------------------------------------------------------
    def _kick(self, w: _Worker) -> None:
        """Ask the core for this worker's next batches until it has no more to give."""
        sched = w.sched
        now = self.now
        while True:
            step = sched.core.schedule(w.core, now)
            self._written(step.writes, now)
            if step.start is None:
                if step.wait_until < math.inf and not w.computing:
                    self._wake(w, max(step.wait_until, now))
                break
            entry = step.start
            n = len(entry.batch.items)
            ms = self.sc.cost.ms(n)
            if self.sc.cost.jitter:
                ms *= self.rng.lognormvariate(0.0, self.sc.cost.jitter)
            start = max(now, w.busy_until)
            w.busy_until = start + ms / 1000
            w.computing.append(entry)
            self._at(w.busy_until, _DONE, w.index, (w.token, entry, start, w.busy_until))
        self._backpressure(sched)

    def _done(self, index: int, payload: object) -> None:
        token, entry, start, end = cast(tuple[int, InFlight, float, float], payload)
        w = self.workers[index]
        if token != w.token or not w.alive:
            return  # the worker died meanwhile; what it held was handed back
        now = self.now
        w.computing.popleft()
        n = len(entry.batch.items)
        self.result.computed(n, end - start, end, index)
        result = WorkResult(entry.batch.batch_id, [None] * n, None, start, end)
        self._written(w.sched.core.on_result(w.core, entry, result, now), now)
        if w.computing:
            # Its next batch was queued on it already (decision 12): it computes on with
            # no gap, and the core may queue one more behind it now.
            self._kick(w)
            return
        self._wake(w, now + self._gap_s)

    def _wake(self, w: _Worker, t: float) -> None:
        """Wake ``w`` at ``t`` unless it is already to wake up earlier."""
        if t < w.wake_at:
            w.wake_at = t
            self._at(t, _WAKE, w.index, w.token)

    def _written(self, writes: list[Write], now: float) -> None:
        """What the persister would store: results answered, expirations recorded; then
        the offsets are done."""
        for wr in writes:
            while wr is not None:
                if wr.status == RequestStatus.SUCCEEDED:
                    answered = now + self._answer_s
                    for p in wr.items:
                        self.result.completed(p, answered)
                else:
                    shed = shed_retry_after_s(wr.error) is not None
                    for p in wr.items:
                        self.result.expired(p, now, shed=shed)
                core = self._core_of(wr)
                if core is not None:
                    core.done([(p.tp, p.offset) for p in wr.items], len(wr.items))
                wr = wr.then  # type: ignore[assignment]

    def _core_of(self, wr: Write) -> Dispatch | None:
        if not wr.items:
            return None
        part = wr.items[0].tp[1]
        return self.scheds[part % len(self.scheds)].core

    def _worker_event(self, index: int, kind: str) -> None:
        w = self.workers[index]
        sched = w.sched
        now = self.now
        if kind == "loss" and w.alive:
            w.alive = False
            w.token += 1
            w.wake_at = math.inf
            self.result.worker_lost(now, index)
            # As the service: whatever it held goes back (the computing one counts as an
            # attempt), and the core's retries run on the next free worker.
            lost = sched.core.on_lost(w.core, "worker lost", ran=bool(w.computing), now=now)
            self._written(lost.writes, now)
            w.computing.clear()
            w.busy_until = now
            for other in sched.workers:
                if other.alive and not other.computing:
                    self._kick(other)
        elif kind == "join" and not w.alive:
            w.alive = True
            w.token += 1
            w.wake_at = math.inf
            w.busy_until = now
            w.core = sched.core.add_worker(f"w{index}-{w.token}", sched.model_info())
            self.result.worker_joined(now, index)
            self._kick(w)

    # ---- the API's view ------------------------------------------------------------------
    def _refresh(self, api: _Api) -> None:
        """The instance reads the live reports. Instances refreshing within the same
        ``VIEW_QUANTUM_S`` share one combined view (the same rows, read a few ms apart:
        with a hundred instances and schedulers, combining is most of the work)."""
        if self.now - self._view_at < VIEW_QUANTUM_S and self._view is not None:
            api.view = self._view
            return
        stale = 5.0
        live = [(t, r) for t, r in self.reports.values() if self.now - t < stale]
        if not live:
            return
        view = LoadView.combine(r for _, r in live)
        view.as_of = min(t for t, _ in live)
        self._view, self._view_at = view, self.now
        api.view = view


def simulate(sc: Scenario) -> Result:
    return Simulation(sc).run()
