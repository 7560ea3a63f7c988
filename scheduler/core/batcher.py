"""Per-key request queues and the flush rule. Pure: no Kafka, no sockets, no clock.

Requests are queued under their batch key (model, version and every parameter
that changes the computation), so a batch never mixes incompatible requests.
Inside a key, requests wait in one FIFO per priority rank; a batch takes the
most urgent ranks first, so sync traffic fills a batch before job items do.

A batch holds up to the model's batch target: the most items/s within the batch
budget on the measured cost curve (scheduler/core/costmodel.py), at most what the worker
takes (``max_batch``). A key is ready to flush when
  * it holds a full batch, or
  * its oldest request has lingered ``max_linger_s``, or
  * waiting longer would make its earliest deadline unreachable:
    earliest deadline - predicted compute - margin.
A free worker that would otherwise start a lower-ranked batch flushes a more
urgent queue early instead (job items never hold a worker while sync waits).
Requests that can no longer finish before their deadline are dropped before
they reach a worker (the caller gets a 504 at once instead of a late answer), and a
sync request the queue says will start too late is shed as soon as that shows
(scheduler/core/shedding.py: its caller gets a 503 with Retry-After).
"""

from __future__ import annotations

import heapq
import itertools
import math
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from core.messages import KEEP_UNTIL, RequestMessage, keep_until
from core.models.token_ids import input_tokens
from core.vocab import ModelRef
from scheduler.core.costmodel import CostModel
from scheduler.core.itemcost import ItemCosts, bucket
from scheduler.core.keyqueue import KeyQueue
from scheduler.core.offsets import TopicPartition
from scheduler.core.shedding import Arrivals, left_rate, retry_after_s, start_in_s


@dataclass(frozen=True, slots=True)
class BatchKey:
    model: str
    version: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def ref(self) -> ModelRef:
        return ModelRef(self.model, self.version)

    def label(self) -> str:
        ps = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.model}@{self.version}" + (f"[{ps}]" if ps else "")


@dataclass(slots=True, eq=False)
class Pending:
    msg: RequestMessage
    key: BatchKey
    rank: int  # 0 is the most urgent priority class
    tp: TopicPartition
    offset: int
    consumed_at: float
    seq: int = 0
    gone: bool = False  # dropped (expired or revoked) while still in a deque
    trace: Any = None  # the API's trace context from the message headers (core/tracing.py)
    # Past its deadline, the later one it waits on: its caller took a partial answer and
    # fetches the rest (the message's keep_until, decision 63). 0: none yet.
    kept: float = 0.0
    padded: int = 0  # the padded length it computes (scheduler/core/itemcost.py)
    device_ms: float = 0.0  # its share of its batch's measured compute, once charged

    @property
    def deadline(self) -> float:
        return self.kept or self.msg.deadline

    @property
    def tenant(self) -> str:
        return self.msg.tenant_id

    @property
    def weight(self) -> float:
        return self.msg.weight

    @property
    def flow(self) -> str | None:
        return self.msg.fairness_id


class FlushReason(StrEnum):
    """Why a batch was formed (``batches.reason``, and a metrics label)."""

    FULL = "full"  # it holds a full batch
    LINGER = "linger"  # its oldest request waited ``max_linger_s``
    DEADLINE = "deadline"  # waiting longer would miss its earliest deadline
    PRIORITY = "priority"  # flushed early rather than start lower-ranked work
    RETRY = "retry"  # a failed batch's part, run again


@dataclass
class Batch:
    key: BatchKey
    items: list[Pending]
    formed_at: float
    reason: FlushReason
    batch_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    trace: Any = None  # its spans while it runs (scheduler/runtime/tracing.py)
    # rank -> tenant -> weight: who was backlogged in the batch's queue when it was
    # formed (its own items' tenants included): whom its device time was owed to.
    backlog: dict[int, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Sizing:
    """How the worker that will run a batch sizes and times it: its class's cost curves
    and the largest batch it takes of each model (heterogeneous pools: a CPU and a GPU
    worker of one model differ in both). The dispatch core passes the asking worker's."""

    cost: CostModel
    max_batch: Callable[[ModelRef], int]

    def limit(self, ref: ModelRef) -> int:
        """Items a full batch of this model holds now (its measured batch target)."""
        return self.cost.batch_target(ref, self.max_batch(ref))

    def predicted_s(self, ref: ModelRef, count: int) -> float:
        """Compute time of a batch of ``count`` (at most a full one)."""
        n = max(1, min(count, self.limit(ref)))
        return self.cost.predict_ms(ref, n) / 1000.0


@dataclass(frozen=True)
class FlushPolicy:
    max_linger_s: float = 0.050
    margin_s: float = 0.020


def flush_time(
    *,
    oldest_at: float,
    earliest_deadline: float,
    count: int,
    max_batch: int,
    predicted_s: float,
    policy: FlushPolicy,
) -> float:
    """When a queue should be flushed at the latest (``-inf`` means now)."""
    if count >= max_batch:
        return -math.inf
    return min(oldest_at + policy.max_linger_s, earliest_deadline - predicted_s - policy.margin_s)


class Batcher:
    def __init__(
        self,
        *,
        policy: FlushPolicy,
        cost: CostModel,
        max_batch: Callable[[ModelRef], int],
        n_ranks: int = 4,
        prices: ItemCosts | None = None,
    ):
        """``prices``: items are charged their relative device time by length (None:
        one each, the fair queue counts requests)."""
        self.policy = policy
        self.prices = prices
        # Read when the fair queue serves an item, not fixed when it is queued: an item
        # that waited is priced by what the batches measured since.
        self._price = None if prices is None else self._relative
        # Used where a call names no sizing (a pool of one worker class).
        self.sizing = Sizing(cost, max_batch)
        self.n_ranks = n_ranks
        self._queues: dict[BatchKey, KeyQueue] = {}
        self._seq = itertools.count()
        self._count = 0
        self._by_rank = [0] * n_ranks
        self._by_ref_rank: Counter[tuple[ModelRef, int]] = Counter()
        self.arrivals = Arrivals()  # queued per (model, rank), for shedding

    def __len__(self) -> int:
        return self._count

    def add(self, p: Pending) -> None:
        p.seq = next(self._seq)
        p.padded = bucket(input_tokens(p.msg.input))
        q = self._queues.get(p.key)
        if q is None:
            q = self._queues[p.key] = KeyQueue(self.n_ranks, self._price)
        q.push(p)
        self._count += 1
        self._by_rank[p.rank] += 1
        self._by_ref_rank[(p.key.ref, p.rank)] += 1
        self.arrivals.add((p.key.ref, p.rank), p.consumed_at)

    def _relative(self, p: Pending) -> float:
        assert self.prices is not None
        return self.prices.relative(p.key.ref, p.padded)

    def limit(self, ref: ModelRef, sizing: Sizing | None = None) -> int:
        """Items a full batch of this model holds now (its measured batch target)."""
        return (sizing or self.sizing).limit(ref)

    def _flush_time(self, key: BatchKey, q: KeyQueue, s: Sizing) -> float:
        return flush_time(
            oldest_at=q.oldest_at(),
            earliest_deadline=q.earliest_deadline(),
            count=q.count,
            max_batch=s.limit(key.ref),
            predicted_s=s.predicted_s(key.ref, q.count),
            policy=self.policy,
        )

    def drop_expired(self, now: float, sizing: Sizing | None = None) -> list[Pending]:
        """Remove requests that cannot finish before their deadline, even if sent now.
        One whose caller keeps it past the deadline (``keep_until``) stays, queued from
        then on under that later deadline: no longer urgent, still in its turn."""
        cost = (sizing or self.sizing).cost
        dropped: list[Pending] = []
        for key, q in self._queues.items():
            single = cost.predict_ms(key.ref, 1) / 1000.0
            while q.count and q.earliest_deadline() < now + single:
                p = heapq.heappop(q.deadlines)[2]
                later = None if p.kept else keep_until(p.msg.extra)
                if later is not None and later >= now + single:
                    p.kept = later
                    heapq.heappush(q.deadlines, (later, p.seq, p))
                    continue
                q.discard(p)
                dropped.append(p)
        self._forget(dropped)
        return dropped

    def drop_hopeless(
        self, now: float, items_s: dict[ModelRef, float], batch_s: dict[ModelRef, float]
    ) -> list[tuple[Pending, float]]:
        """Remove the sync requests that, by the queue ahead of them, the workers'
        ``items_s`` and the arrivals above them, start too late to run a batch
        (``batch_s``) before their deadline (scheduler/core/shedding.py); each with the
        Retry-After its caller gets. Ahead of a request inside its class only its own
        tenant's earlier requests are counted (round robin may put others first too:
        counting fewer sheds later, never wrongly)."""
        out: list[tuple[Pending, float]] = []
        span = self.arrivals.span(now)
        for key, q in self._queues.items():
            ref = key.ref
            rate = items_s.get(ref, 0.0)
            if rate <= 0:
                continue
            own_s = batch_s.get(ref, 0.0) + self.policy.margin_s
            above_n = 0
            above_s = 0.0
            for rank in range(self.n_ranks - 1):  # the last rank (jobs) waits, never shed
                fq = q.by_rank[rank]
                if fq:
                    left = left_rate(rate, above_s, span)
                    mine: dict[str, list[Pending]] = {}
                    for p in fq:
                        # One kept for a partial answer's caller is not shed: it runs
                        # on to its keep_until (decision 63), then expires.
                        if not p.gone and KEEP_UNTIL not in p.msg.extra:
                            mine.setdefault(p.tenant, []).append(p)
                    for items in mine.values():
                        items.sort(key=lambda p: p.seq)
                        for j, p in enumerate(items):
                            wait = start_in_s(above_n, j, rate, left)
                            budget = p.deadline - now - own_s
                            if wait > budget:
                                out.append((p, retry_after_s(wait, budget)))
                above_n += self._by_ref_rank[(ref, rank)]
                above_s += self.arrivals.rate((ref, rank), now)
        for p, _ in out:
            self._queues[p.key].discard(p)
        self._forget([p for p, _ in out])
        return out

    def take(
        self,
        now: float,
        serves: Callable[[ModelRef], bool],
        sizing: Sizing | None = None,
        max_rank: int | None = None,
    ) -> Batch | None:
        """The batch a free worker should run now, or None if no queue is ready.

        Ready queues go most urgent rank first. A worker never starts lower-ranked
        work while a more urgent queue it serves is still lingering: it flushes that
        queue early instead (reason ``priority``), since the lower-ranked batch would
        hold the worker for a whole batch time while the urgent one waits.
        ``max_rank``: only queues holding a request of that rank or a more urgent one.
        """
        s = sizing or self.sizing
        ready: tuple[int, float, BatchKey] | None = None
        urgent: tuple[int, float, BatchKey] | None = None  # lingering, best rank
        for key, q in self._queues.items():
            if q.count == 0 or not serves(key.ref):
                continue
            if max_rank is not None and q.best_rank() > max_rank:
                continue
            at = self._flush_time(key, q, s)
            cand = (q.best_rank(), at, key)
            if at <= now:
                if ready is None or cand[:2] < ready[:2]:
                    ready = cand
            elif urgent is None or cand[:2] < urgent[:2]:
                urgent = cand
        if ready is None:
            return None
        pick, reason = ready, None
        if urgent is not None and urgent[0] < ready[0]:
            pick, reason = urgent, FlushReason.PRIORITY
        key = pick[2]
        q = self._queues[key]
        if reason is None:
            if q.count >= s.limit(key.ref):
                reason = FlushReason.FULL
            elif q.oldest_at() + self.policy.max_linger_s <= now:
                reason = FlushReason.LINGER
            else:
                reason = FlushReason.DEADLINE
        # The target, or a larger size the cost model wants measured while a backlog
        # can fill it (a slow reading must not pin the batch size for good).
        items = q.pop(s.cost.batch_size(key.ref, s.max_batch(key.ref), q.count))
        self._forget_taken(key.ref, items)
        left = sum(self._by_ref_rank[(key.ref, r)] for r in range(self.n_ranks))
        s.cost.took(key.ref, len(items), now, left)
        return Batch(key=key, items=items, formed_at=now, reason=reason, backlog=q.backlog(items))

    def wake_at(
        self,
        serves: Callable[[ModelRef], bool],
        sizing: Sizing | None = None,
        max_rank: int | None = None,
    ) -> float:
        """The earliest time some queue this worker serves becomes ready (inf if none);
        ``max_rank`` as ``take``'s."""
        s = sizing or self.sizing
        return min(
            (
                self._flush_time(k, q, s)
                for k, q in self._queues.items()
                if q.count and serves(k.ref) and (max_rank is None or q.best_rank() <= max_rank)
            ),
            default=math.inf,
        )

    def drop_partitions(self, tps: Iterable[TopicPartition]) -> list[Pending]:
        """Forget queued requests from revoked partitions (their new owner re-reads them)."""
        lost = set(tps)
        dropped: list[Pending] = []
        for q in self._queues.values():
            for fq in q.by_rank:
                for p in list(fq):
                    if p.tp in lost:
                        q.discard(p)
                        dropped.append(p)
        self._forget(dropped)
        return dropped

    def urgent_may_wait(
        self,
        rank: int,
        serves: Callable[[ModelRef], bool],
        until: float,
        sizing: Sizing | None = None,
    ) -> bool:
        """Whether the requests ranked above ``rank`` that this worker could take may
        wait until ``until`` for a staggered start (see scheduler/core/stagger.py).

        They may, when their deadlines allow the wait, if
          * a batch started now would be filled up with lower-ranked work anyway (their
            queue holds some and they alone do not fill a batch): every such request
            arrived after the last start on another worker (that start took whatever
            urgent work was queued), so holding to the stagger point never makes one
            wait longer than that point; starting early would leave the next arrivals a
            longer gap to the following start; or
          * they fill a batch by themselves: the workers are saturated, and workers
            that start together stay together (a burst started them at once); held
            once to the stagger point, their starts are spread for good, and a request
            arriving later waits for a worker at most a batch time over the worker
            count, which admission counts on (ingest/admission/capacity.py).
        A urgent queue smaller than a batch with nothing to fill it goes at once.
        """
        s = sizing or self.sizing
        refs = {ref for (ref, r), n in self._by_ref_rank.items() if n and r < rank and serves(ref)}
        for ref in refs:
            counts = [self._by_ref_rank[(ref, r)] for r in range(self.n_ranks)]
            urgent = sum(counts[:rank])
            if urgent == sum(counts) and urgent < s.limit(ref):
                return False
        for key, q in self._queues.items():
            if q.count and key.ref in refs:
                latest = q.earliest_deadline() - s.predicted_s(key.ref, q.count)
                if latest - self.policy.margin_s < until:
                    return False
        return True

    def depth_by_rank(self) -> list[int]:
        """Queued requests per priority rank (kept current, O(1))."""
        return list(self._by_rank)

    def depth_by_model(self) -> dict[ModelRef, list[int]]:
        """Queued requests per model and priority rank."""
        out: dict[ModelRef, list[int]] = {}
        for (ref, rank), n in self._by_ref_rank.items():
            if n:
                out.setdefault(ref, [0] * self.n_ranks)[rank] = n
        return out

    def depth_by_tenant(self) -> dict[ModelRef, list[dict[str, tuple[int, float]]]]:
        """Queued requests and weight per model, rank and tenant (for load reports)."""
        out: dict[ModelRef, list[dict[str, tuple[int, float]]]] = {}
        for key, q in self._queues.items():
            ranks = out.setdefault(key.ref, [{} for _ in range(self.n_ranks)])
            for rank, fq in enumerate(q.by_rank):
                for tenant, (n, w) in fq.depth_by_tenant().items():
                    have = ranks[rank].get(tenant, (0, w))
                    ranks[rank][tenant] = (have[0] + n, w)
        return out

    def oldest_received(self) -> dict[tuple[ModelRef, int], float]:
        """When the API received the oldest queued request of each model and rank (epoch
        s). A tenant's requests queue in arrival order: only the tenants' heads are read."""
        out: dict[tuple[ModelRef, int], float] = {}
        for key, q in self._queues.items():
            for rank, fq in enumerate(q.by_rank):
                for head in fq.heads():
                    t = head.msg.received_at
                    if t < out.get((key.ref, rank), math.inf):
                        out[(key.ref, rank)] = t
        return out

    def _forget(self, items: list[Pending]) -> None:
        self._count -= len(items)
        for p in items:
            self._by_rank[p.rank] -= 1
            self._by_ref_rank[(p.key.ref, p.rank)] -= 1
        self._gc()

    def _forget_taken(self, ref: ModelRef, items: list[Pending]) -> None:
        """``_forget`` for one batch's items (one model): counted per rank in one pass."""
        self._count -= len(items)
        for rank, n in Counter([p.rank for p in items]).items():
            self._by_rank[rank] -= n
            self._by_ref_rank[(ref, rank)] -= n
        self._gc()

    def _gc(self) -> None:
        for key in [k for k, q in self._queues.items() if q.count == 0]:
            del self._queues[key]
