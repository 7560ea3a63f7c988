"""When a job will finish: its completion-time quote (decision 69). Pure; the clock
is passed in.

1. The rate jobs of a model get: what the live workers serve (the schedulers' load
   reports, ``ModelLoad.items_s``) less what the sync classes above take (they are
   served first, decision 11), that take forecast over the job's remaining time by
   its mean over as long a past (``completion_at``).
2. The job's place in the queue. Job items of one model are shared among tenants by
   weighted deficit round robin (scheduler/core/fairness.py, decision 9), which over a
   job's length is generalized processor sharing: every tenant with items read gets
   ``rate * w / sum(w)``; a tenant's own jobs run in the order they were submitted.
   But the round robin shares only what the schedulers have read, and every job's
   items are in the jobs topic's partitions in publish order: a job published behind
   another tenant's large one is read once what is ahead of it, beyond the schedulers'
   buffers, has been served (``finishes``: the backlog as one stream in submission
   order, its first ``window`` items read and shared, decision 9's limit).
3. What jobs of the model were seen to get: the items the backlog lost over as long a
   past as the quote looks ahead (ingest/admission/served.py), in place of the
   predicted rate for as much of the horizon as it covers. Not the job's own rate over
   its life: that mixes times of other sharing (a second tenant's job halves it, and
   the scheduler reads a job queued behind another's only once what is ahead of it in
   Kafka is read), and at 50% it made the quote a third early (docs/bench/quotes.md).

No workers serving the model (a rate of zero) gives no quote rather than a wrong one.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

# As the scheduler's fairness (scheduler/core/fairness.py MIN_WEIGHT): a tenant whose
# weight rounds to nothing still moves.
MIN_WEIGHT = 1e-3
# Items: below this a job counts as done (the simulation's float steps).
EPS = 1e-6


@dataclass(frozen=True)
class Pending:
    """An unfinished job of the model (results/job_backlog.py): whose, when submitted,
    how many items it has left, its tenant's weight."""

    job_id: str
    tenant_id: str
    created_at: datetime
    remaining: float
    weight: float


def in_submission_order(pending: Sequence[Pending]) -> list[Pending]:
    """The backlog as its items stand in Kafka: each job published at its submission."""
    return sorted(pending, key=lambda p: (p.created_at, p.job_id))


def in_place(pending: Sequence[Pending], own: Sequence[Pending]) -> list[Pending]:
    """The backlog in submission order with ``own`` jobs as their own rows say (read a
    moment after the backlog), in place of the backlog's rows of them."""
    mine = {p.job_id for p in own}
    return in_submission_order([p for p in pending if p.job_id not in mine] + list(own))


def queued_now(
    tenant_id: str, items: float, weight: float, now: datetime, pending: Sequence[Pending]
) -> tuple[list[Pending], int]:
    """(the backlog, the index in it) of ``items`` job-class items the tenant queues
    ``now``: a new job, or a flex request (decision 66: queued with job items, so quoted
    as a job of its inputs) - published behind every unfinished job of the model."""
    new = Pending("", tenant_id, now, items, weight)
    stream = in_place(pending, [new])
    return stream, stream.index(new)


def read_window(stream: Sequence[Pending], held: float, held_by: Mapping[str, float]) -> float:
    """How much of ``stream`` (in submission order) the schedulers have read, from what
    their load reports hold queued: ``held`` job items in all, ``held_by`` tenant (the
    largest ones). A tenant with items held has its first job read: every job before it
    is read whole, so the window is at least those plus what the tenant holds; the held
    total alone, read between two reports at the low point of a buffer's refill, said
    less than that. Nothing held (nothing read yet, or no report): all of it."""
    if held <= 0:
        return math.inf
    before, first = 0.0, dict[str, float]()
    for p in stream:
        if p.remaining > EPS:
            first.setdefault(p.tenant_id, before)
            before += p.remaining
    seen = (first[t] + n for t, n in held_by.items() if t in first and n > 0)
    return max([held, *seen])


def job_rate(capacity_items_s: float, sync_items_s: float) -> float:
    """Items/s the jobs class gets: the workers' capacity less the sync classes' take."""
    return max(0.0, capacity_items_s - max(0.0, sync_items_s))


def finishes(stream: Sequence[Pending], window: float) -> list[float]:
    """When each job of ``stream`` is served to its last item, in items served in all
    (seconds at one item a second: every time scales as one over the rate).

    ``stream``: the unfinished jobs in the order their items stand in Kafka. The
    schedulers hold its first ``window`` items read (their buffers; ``inf``: all of
    it); each tenant with items read takes ``rate * w / sum(w)`` of what is read
    (weighted sharing), its own jobs in order; every item served is replaced by the
    next one in the stream. A fluid model, exact between events: a job ends, or the
    read edge passes the end of a job and the next one's tenant joins.

    In virtual time, as water-filling is computed: every tenant with items read moves
    at the same pace, ``rate / W`` items per unit of weight a second (W: their weights
    summed), so a tenant's current job ends at a fixed virtual tag. O(n log n)."""
    done = [0.0] * len(stream)
    weight = {p.tenant_id: max(p.weight, MIN_WEIGHT) for p in stream}
    waiting: dict[str, deque[int]] = {}  # per tenant: its jobs read, behind its current
    tags: list[tuple[float, int]] = []  # (virtual tag, job) of each tenant's current job
    t = v = total_w = 0.0

    def read(k: int) -> None:
        """Job ``k``'s items begin to be read: it joins its tenant's turn."""
        nonlocal total_w
        tenant = stream[k].tenant_id
        if tenant in waiting:
            waiting[tenant].append(k)
            return
        waiting[tenant] = deque()
        heapq.heappush(tags, (v + stream[k].remaining / weight[tenant], k))
        total_w += weight[tenant]

    # The read part now: every job up to the first one not wholly read (the edge).
    edge, room, n = None, window, len(stream)
    for k in range(n):
        if stream[k].remaining <= EPS:
            continue
        read(k)
        if stream[k].remaining > room + EPS:
            edge = k
            break
        room -= stream[k].remaining
    # When the edge job is wholly read: its unread part shrinks at the whole rate (each
    # item served anywhere is replaced by one of it).
    edge_at = t + stream[edge].remaining - room if edge is not None else math.inf
    while tags or edge is not None:
        tag, k = tags[0] if tags else (math.inf, -1)
        ends_at = t + (tag - v) * total_w if tags else math.inf
        # The next job begins to be read (at once when nothing read is left: float
        # rounding may end the edge job a hair before its read edge passes).
        if edge is not None and (not tags or edge_at <= ends_at + EPS):
            edge_at = max(t, min(edge_at, ends_at)) if tags else t
            v += (edge_at - t) / total_w if total_w > 0 else 0.0
            t = edge_at
            nxt = next((j for j in range(edge + 1, n) if stream[j].remaining > EPS), None)
            edge_at = math.inf if nxt is None else t + stream[nxt].remaining
            edge = nxt
            if nxt is not None:
                read(nxt)
            continue
        heapq.heappop(tags)
        t, v = ends_at, tag
        done[k] = t
        tenant = stream[k].tenant_id
        total_w -= weight[tenant]
        if waiting[tenant]:
            j = waiting[tenant].popleft()
            heapq.heappush(tags, (v + stream[j].remaining / weight[tenant], j))
            total_w += weight[tenant]
        else:
            del waiting[tenant]
    return done


def completion_at(now: float, rate_over: Callable[[float], float], work: float) -> float | None:
    """The expected completion time (unix seconds) of a job that ends once ``work``
    items are served in all (``finishes``), or None without a quote (no rate: no
    worker serves the model, or sync takes all of it).

    ``rate_over(h)``: the rate jobs get over the next ``h`` seconds (0: now; the
    caller blends in what jobs were seen to get over the last ``h``, rule 3). The sync
    classes' take is forecast by its mean over the quote's own horizon: first the
    time left at the rate jobs get now, then at the rate the mean of as long a past
    leaves them. Short of knowing the sync traffic's pattern, its mean over the next H
    seconds is best guessed by its mean over the last H; the rate of the moment, read
    in a burst or a lull, was off by half under a load that changes every 20 s."""
    now_rate = rate_over(0.0)
    if now_rate <= 0:
        return None
    rate = rate_over(work / now_rate)
    return None if rate <= 0 else now + work / rate
