"""When a job will finish: its completion-time quote (decision 69). Pure; the clock
is passed in.

1. The rate jobs of a model get: what the live workers serve (the schedulers' load
   reports, ``ModelLoad.items_s``) less what the sync classes above take (they are
   served first, decision 11), that take forecast over the job's remaining time by
   its mean over as long a past (``completion_at``).
2. The job's place in the fair queue: job items of one model are shared among
   tenants by weighted deficit round robin (scheduler/core/fairness.py, decision 9),
   which over a job's length is generalized processor sharing. Every backlogged tenant
   gets ``rate * w / sum(w)`` until the smallest backlog empties, then the rest share
   its part, and so on (water-filling). A tenant's own jobs run in the order they were
   submitted, so its items ahead of the job count wholly before it.
3. What jobs of the model were seen to get: the items the backlog lost over as long a
   past as the quote looks ahead (ingest/admission/served.py), in place of the
   predicted rate for as much of the horizon as it covers. Not the job's own rate over
   its life: that mixes times of other sharing (a second tenant's job halves it, and
   the scheduler reads a job queued behind another's only once what is ahead of it in
   Kafka is read), and at 50% it made the quote a third early (docs/bench/quotes.md).

No workers serving the model (a rate of zero) gives no quote rather than a wrong one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

# As the scheduler's fairness (scheduler/core/fairness.py MIN_WEIGHT): a tenant whose
# weight rounds to nothing still moves.
MIN_WEIGHT = 1e-3


@dataclass(frozen=True)
class Flow:
    """One tenant's job items of a model still to compute, and its weight."""

    remaining: float
    weight: float


@dataclass(frozen=True)
class JobPlace:
    """Where one job stands: its tenant's items ahead of it (earlier jobs) and its own
    items left."""

    ahead: float
    remaining: float
    weight: float


@dataclass(frozen=True)
class Pending:
    """An unfinished job of the model (results/job_backlog.py): whose, when submitted,
    how many items it has left, its tenant's weight."""

    job_id: str
    tenant_id: str
    created_at: datetime
    remaining: float
    weight: float


def place_in_queue(
    tenant_id: str, job_id: str | None, created_at: datetime | None, pending: Iterable[Pending]
) -> tuple[float, list[Flow]]:
    """(the tenant's items ahead of the job: its jobs submitted earlier, the other
    tenants' flows). ``job_id`` None: a job not yet submitted, behind all of them."""
    ahead = 0.0
    by_tenant: dict[str, list[float]] = {}
    for p in pending:
        if p.tenant_id == tenant_id:
            if p.job_id != job_id and (created_at is None or p.created_at < created_at):
                ahead += p.remaining
        else:
            f = by_tenant.setdefault(p.tenant_id, [0.0, p.weight])
            f[0] += p.remaining
    return ahead, [Flow(r, w) for r, w in by_tenant.values()]


def queued_now(
    tenant_id: str, items: float, weight: float, pending: Iterable[Pending]
) -> tuple[JobPlace, list[Flow]]:
    """The place of ``items`` job-class items the tenant queues now: a new job, or a flex
    request (decision 66: queued with job items, so quoted as a job of its inputs) -
    behind all of the tenant's unfinished jobs, sharing the rate with other tenants'."""
    ahead, others = place_in_queue(tenant_id, None, None, pending)
    return JobPlace(ahead, items, weight), others


def job_rate(capacity_items_s: float, sync_items_s: float) -> float:
    """Items/s the jobs class gets: the workers' capacity less the sync classes' take."""
    return max(0.0, capacity_items_s - max(0.0, sync_items_s))


def shared_drain_s(rate: float, amount: float, weight: float, others: Iterable[Flow]) -> float:
    """Seconds until ``amount`` items of a flow of ``weight`` are served while the
    ``others`` share ``rate`` with it in proportion to their weights, each keeping its
    share until its backlog is empty (generalized processor sharing).

    Under GPS every backlogged flow advances in "virtual time" at the same pace,
    ``rate / W`` per second (W: the active flows' weights summed), and a flow of
    ``r`` items and weight ``w`` finishes when virtual time reaches ``r / w``."""
    assert rate > 0
    w_own = max(weight, MIN_WEIGHT)
    tag = amount / w_own
    if tag <= 0:
        return 0.0
    active = [(f.remaining / max(f.weight, MIN_WEIGHT), max(f.weight, MIN_WEIGHT)) for f in others]
    active = [(t, w) for t, w in active if t > 0]
    total_w = w_own + sum(w for _, w in active)
    t_s = v = 0.0
    for finish, w in sorted(active):
        if finish >= tag:
            break
        t_s += (finish - v) * total_w / rate  # every active flow moves to this tag
        v = finish
        total_w -= w
    return t_s + (tag - v) * total_w / rate


def remaining_s(rate: float, place: JobPlace, others: Iterable[Flow]) -> float | None:
    """Seconds until the job finishes, or None without a rate to predict from."""
    if rate <= 0:
        return None
    if place.remaining <= 0:
        return 0.0
    return shared_drain_s(rate, place.ahead + place.remaining, place.weight, others)


def completion_at(
    now: float, rate_over: Callable[[float], float], place: JobPlace, others: Iterable[Flow]
) -> float | None:
    """The expected completion time (unix seconds), or None without a quote.

    ``rate_over(h)``: the rate jobs get over the next ``h`` seconds (0: now; the
    caller blends in what jobs were seen to get over the last ``h``, rule 3). The sync
    classes' take is forecast by its mean over the quote's own horizon: first the
    time left at the rate jobs get now, then at the rate the mean of as long a past
    leaves them. Short of knowing the sync traffic's pattern, its mean over the next H
    seconds is best guessed by its mean over the last H; the rate of the moment, read
    in a burst or a lull, was off by half under a load that changes every 20 s."""
    others = list(others)
    first = remaining_s(rate_over(0.0), place, others)
    if first is None:
        return None
    left = remaining_s(rate_over(first), place, others)
    return None if left is None else now + left
