"""Admission: which sync requests the workers can serve in time. Pure; the clock is passed in.

Every scheduler reports, four times a second, what its live workers can do per model
(items/s at the batch size batches get, that batch's compute time, a batch of one's,
the worker count: scheduler/core/capacity.py) and what waits (queued requests per model,
class and largest tenants; what Kafka holds back in paused classes). Each API instance
combines the reports into a ``LoadView`` and decides every request with ``Admission``
(decision 24). All thresholds derive from the request's own deadline, the model's
measured cost curve and the live worker count; the few constants left are below.

1. **Deadline.** A request whose deadline is shorter than the least any request of
   this model takes (a batch of one plus the scheduler's margin) is refused at once,
   saying so: the scheduler would expire it unrun anyway. So is one that, while the
   workers are saturated, could not wait out a running batch and run its own in time.
2. **Strict order.** While a higher class of the same model is being refused for
   capacity (within ``ORDER_WINDOW_S``), every lower class is refused too.
3. **Below capacity nothing is refused.** The capacity test applies only while the
   model is overloaded for this class: the classes at or above it arrive faster than
   the workers serve (beyond the noise of a rate measured over ``RATE_WINDOW_S``), or
   a burst: ``BACKLOG_ROUNDS`` full batches per worker wait and the last second brought
   more than the workers serve in one, or a backlog that takes longer than the rate
   window to drain.
4. **Capacity.** Then a request is admitted when the work queued ahead of it drains in
   time: the whole batches ahead, at the capacity that higher classes' arrivals (and the
   other tenants of its class, by round robin) leave, taken at the high end of their
   noise (``P95_Z``), must fit its deadline less its own batch, the wait for a worker to
   come free (one batch time over the worker count) and the margin.
   Inside its class a request waits only for its tenant's round-robin share of other
   tenants' queues (decision 9), so the tenant that owns a backlog is the one refused.
5. **Buffer.** A class whose queue would outgrow the schedulers' buffers is refused,
   so no sync burst is ever held in Kafka behind other tenants (decision 24).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

from core.bucket_counts import BucketCounts
from core.vocab import PRIORITY_CLASSES, PriorityClass
from ingest.admission.view import LoadView, ModelLoad, queued_ahead

# A lower class is refused for this long after a higher one was refused for capacity
# (the promise is "over any 1 s window": long enough to span a report interval and a
# burst's first batches, short enough that capacity freed by a lull is used at once).
ORDER_WINDOW_S = 1.0
# Arrival rates are counted over this window: two report periods of every scheduler and
# several batch times of any model up to 2 s per batch smooth Poisson noise while a
# burst still shows within the window.
RATE_WINDOW_S = 5.0
# What higher classes take is also counted over this longer window, and the larger of
# the two rates is what a lower class must expect: after a lull of a few seconds the
# short rate says capacity is free, the traffic comes back at its long-run rate, and
# whatever was admitted on the lull's strength expires (simulated: 18% of free's
# admitted requests at 3x capacity on 20 ms batches of 2, 5% with the long window).
LONG_RATE_WINDOW_S = 30.0
# Quotes forecast what the sync classes take over a job's remaining time by their mean
# rate over as long a past (decision 69): an hour of admissions is kept, in 10 s buckets.
QUOTE_HISTORY_S = 3600.0
QUOTE_BUCKET_S = 10.0
# One-sided 95% point of a normal: admission promises each tier its SLO at p95, so a
# rate that decides admission is taken this many standard deviations on the safe side:
# arrivals count as overload only when this far above capacity, and the capacity left
# to a lower class is what higher classes' arrivals leave even when they run this high.
P95_Z = 1.645
# A burst counts as overload before the 5 s rate shows it: a backlog of this many full
# batches for every worker (below capacity the queue holds the batch being formed and
# rarely a second) while the last BURST_WINDOW_S brought more than the workers serve in
# that time. One second: a burst shows within it, and so does the queue it builds.
BACKLOG_ROUNDS = 2
BURST_WINDOW_S = 1.0
# Retry-After when no capacity is left to this class at all (higher classes take it).
NO_CAPACITY_RETRY_S = 5.0


@dataclass(frozen=True)
class Decision:
    admit: bool
    predicted_delay_s: float = 0.0  # queue wait predicted for this request
    retry_after_s: float = 0.0
    reason: str = ""  # "" | deadline | capacity | order | buffer
    message: str = ""


ADMIT = Decision(True)


class RecentAdmissions(BucketCounts):
    """Requests admitted or offered lately, counted per key (core/bucket_counts.py).

    The schedulers' reports are up to half a second old when a request is decided;
    what was admitted since is not in them yet. Without counting it, a burst is
    admitted at full speed until the view catches up and overshoots many times over."""

    def __init__(self, horizon_s: float = 5.0, bucket_s: float = 0.1):
        super().__init__(horizon_s, bucket_s)
        self.started = math.inf  # the first event counted (any key)

    def add(self, key: Hashable, now: float) -> None:
        if now < self.started:
            self.started = now
        start = self._start(now)
        q = self._buckets.get(key)
        if q is None:
            q = self._buckets[key] = deque()
            self._total[key] = 0.0
        self._total[key] += 1
        if q and q[-1][0] == start:
            q[-1][1] += 1
            return
        q.append([start, 1])
        self._evict(key, q, now)

    def since(self, key: Hashable, t: float) -> int:
        """Counted at or after ``t`` (to a bucket's precision: rounds up, conservative)."""
        q = self._buckets.get(key)
        if not q:
            return 0
        return int(_counted_from(q, self._start(t)))

    def span(self, now: float) -> float:
        """The time a rate is measured over: from the oldest bucket still kept (or the
        first event, when counting began later: a rate is not diluted at start)."""
        kept_from = math.ceil((now - self.horizon_s) / self.bucket_s) * self.bucket_s
        return max(self.bucket_s, now - max(kept_from, self.started))

    def rate_over(self, key: Hashable, now: float, window_s: float) -> float:
        """Events/s over the last ``window_s`` (at most the horizon; since counting
        began, if later), from the bucket that holds its start."""
        q = self._buckets.get(key)
        if not q:
            return 0.0
        self._evict(key, q, now)
        from_t = self._start(now - min(window_s, self.horizon_s))
        return _counted_from(q, from_t) / max(self.bucket_s, now - max(from_t, self.started))


def _counted_from(q: deque[list[float]], from_t: float) -> float:
    """The counts of the buckets that start at ``from_t`` or later (newest last in ``q``)."""
    n = 0.0
    for start, k in reversed(q):
        if start < from_t:
            break
        n += k
    return n


def wait_s(ahead: float, load: ModelLoad, drain_s: float, higher_s: float) -> float:
    """Seconds until a request with ``ahead`` requests before it starts, beyond the wait
    for the next free worker. It rides in the batch being formed when what is ahead,
    plus what higher classes add (``higher_s``/s) until a worker comes free, leaves it
    room; otherwise the queue ahead drains at ``drain_s``, what higher classes leave."""
    until_free_s = load.batch_ms / 1000 / max(1, load.workers)
    if ahead + higher_s * until_free_s + 1 <= load.batch:
        return 0.0
    return ahead / drain_s if drain_s > 0 else math.inf


def wait_budget_s(deadline_s: float, load: ModelLoad, margin_s: float) -> float:
    """How long a request may wait for the work ahead: its deadline less its own batch,
    the wait for a worker to come free (one batch time over the workers, as the flush
    rule and the stagger spread their starts) and the scheduler's margin."""
    batch_s = load.batch_ms / 1000
    return deadline_s - batch_s - batch_s / max(1, load.workers) - margin_s


def least_latency_s(load: ModelLoad, margin_s: float) -> float:
    """The least any request of this model takes: a batch of one and the margin."""
    return load.single_ms / 1000 + margin_s


def timeout_floor_ms(load: ModelLoad | None, margin_s: float) -> int:
    """The shortest ``timeout_ms`` a request of this model can ever meet, whatever the
    load: its cost curve's batch of one (measured, or the worker's warm-up profile
    until batches are measured) and the scheduler's margin to store and send the
    answer, whole ms rounded up. With no worker reporting yet, the margin alone: a
    deadline inside it is missed by every model (decision 62)."""
    single_ms = load.single_ms if load is not None else 0.0
    return math.ceil(single_ms + margin_s * 1000)


# What ``decide`` was asked: (model ref, class, tenant, its weight, seconds to its
# deadline, now, API instances).
_Ask = tuple[str, str, str, float, float, float, int]


@dataclass
class _Rates:
    """One class's rates as this instance measured them (per second, its own count),
    recomputed once per counting bucket: they cannot change faster than that."""

    bucket: float
    higher: float  # admitted, of the classes above it
    higher_span: float
    own: float  # admitted, of the class itself
    offered: float  # offered, of the class and those above it
    offered_span: float


class Admission:
    """One API instance's admission state: what it offered and admitted lately, and
    when each class was last refused for capacity. ``decide`` is the whole policy."""

    def __init__(self, *, margin_s: float, max_buffered: int):
        self.margin_s = margin_s
        self.max_buffered = max_buffered
        self.admitted = RecentAdmissions(RATE_WINDOW_S)  # by (ref, class[, tenant])
        self.offered = RecentAdmissions(RATE_WINDOW_S)  # by (ref, class): all decided
        self.admitted_long = RecentAdmissions(LONG_RATE_WINDOW_S, bucket_s=1.0)  # (ref, class)
        # (ref, class), for quotes only: an hour, read over a job's remaining time
        self.admitted_history = RecentAdmissions(QUOTE_HISTORY_S, bucket_s=QUOTE_BUCKET_S)
        self.refused_at: dict[tuple[str, str], float] = {}  # (ref, class) -> last capacity refusal
        self._rates: dict[tuple[str, str], _Rates] = {}

    def decide(
        self,
        view: LoadView | None,
        ref: str,
        priority: str,
        *,
        tenant: str,
        weight: float,
        deadline_s: float,
        now: float,
        instances: int = 1,
    ) -> Decision:
        """Admit or refuse one request with ``deadline_s`` seconds to go, now. Spread
        evenly by a load balancer, each of ``instances`` API instances sees 1/N."""
        load = view.capacity.get(ref) if view is not None else None
        if view is None or load is None:
            self.offered.add((ref, priority), now)
            d = ADMIT  # no reports yet: admit (the catalog already 503s dead models)
        else:
            d = self._decide(
                view, load, (ref, priority, tenant, weight, deadline_s, now, instances)
            )
        if d.admit:
            self.admitted.add((ref, priority, tenant), now)
            self.admitted.add((ref, priority), now)
            self.admitted_long.add((ref, priority), now)
            self.admitted_history.add((ref, priority), now)
        elif d.reason in ("capacity", "buffer"):
            self.refused_at[(ref, priority)] = now
        return d

    def rates(self, ref: str, priority: str, now: float) -> _Rates:
        # Once per counting bucket; while counting is younger than the window the span
        # still grows (from one bucket up), so then once per tenth of one.
        young = now - min(self.admitted.started, self.offered.started) < RATE_WINDOW_S
        bucket = math.floor(now / (self.admitted.bucket_s / (10 if young else 1)))
        got = self._rates.get((ref, priority))
        if got is None or got.bucket != bucket:
            rank = PriorityClass(priority).rank
            got = self._rates[(ref, priority)] = _Rates(
                bucket,
                max(
                    sum(self.admitted.rate((ref, c), now) for c in PRIORITY_CLASSES[:rank]),
                    sum(self.admitted_long.rate((ref, c), now) for c in PRIORITY_CLASSES[:rank]),
                ),
                self.admitted.span(now),
                self.admitted.rate((ref, priority), now),
                sum(self.offered.rate((ref, c), now) for c in PRIORITY_CLASSES[: rank + 1]),
                self.offered.span(now),
            )
        return got

    def _decide(self, view: LoadView, load: ModelLoad, ask: _Ask) -> Decision:
        ref, priority, tenant, weight, deadline_s, now, n = ask
        least = least_latency_s(load, self.margin_s)
        if deadline_s < least:
            return Decision(
                False,
                reason="deadline",
                message=(
                    f"cannot finish within its deadline of {deadline_s * 1000:.0f} ms: this "
                    f"model needs at least {least * 1000:.0f} ms (a batch of one takes "
                    f"{load.single_ms:.0f} ms); send a longer timeout_ms"
                ),
            )
        # Counted from here on: a request no load could serve in time takes no capacity.
        self.offered.add((ref, priority), now)
        rank = PriorityClass(priority).rank
        above = PRIORITY_CLASSES[:rank]
        for c in above:
            at = self.refused_at.get((ref, c))
            if at is not None and now - at < ORDER_WINDOW_S:
                return Decision(
                    False,
                    retry_after_s=ORDER_WINDOW_S,
                    reason="order",
                    message=(
                        f"overloaded: {c} requests for this model are being refused, so "
                        f"{priority} requests are too"
                    ),
                )
        budget = wait_budget_s(deadline_s, load, self.margin_s)
        rates = self.rates(ref, priority, now)
        # What overtakes a request of this tenant while it waits: higher classes'
        # arrivals, and under round robin the other tenants' of its class, up to their
        # weights' share (admitted, by every instance). Taken at the high end of their
        # Poisson noise (the measured rate's and the arrivals' over the wait to come).
        higher = rates.higher * n
        class_drain = max(0.0, load.items_s - higher)
        others = max(0.0, rates.own - self.admitted.rate((ref, priority, tenant), now)) * n
        if others > 0:
            sums = view.sums(ref, priority)
            mine_w = sums.by_tenant[tenant][1] if tenant in sums.by_tenant else 0.0
            w_others = (sums.weights - mine_w) or 1.0
            others = min(others, class_drain * w_others / (w_others + weight))
        ahead_rate = higher + others
        horizon = max(budget, load.batch_ms / 1000, RATE_WINDOW_S / 4)
        noise = math.sqrt(ahead_rate * n / rates.higher_span + ahead_rate / horizon)
        overtaking = ahead_rate + P95_Z * noise
        drain = max(0.0, load.items_s - overtaking)
        age = max(0.0, now - view.as_of)
        mine = self.admitted.since((ref, priority, tenant), view.as_of) * n
        ahead, class_total = queued_ahead(
            view, ref, priority, tenant, weight, mine, age, class_drain
        )
        # The higher classes' requests admitted since the reports are queued ahead of
        # this one too (strict order), less what the workers served of them meanwhile.
        above_since = n * sum(self.admitted.since((ref, c), view.as_of) for c in above)
        ahead += max(0.0, above_since - age * load.items_s)
        # Each class has its own buffer in every scheduler (scheduler/core/backpressure.py).
        own_class = view.sums(ref, priority).queued + view.lag.get(priority, 0) + mine
        if own_class >= self.max_buffered * view.schedulers:
            return Decision(
                False,
                retry_after_s=max(1.0, own_class / max(load.items_s, 1e-9)),
                reason="buffer",
                message=f"overloaded: the schedulers' buffers for {priority} requests are full",
            )
        offered = rates.offered * n
        sigma = math.sqrt(offered * n / rates.offered_span)  # Poisson noise of that, /s
        # A backlog longer to drain than the rate window: whatever built it (arrivals
        # through other instances, or before this one started) is beyond what the rates
        # can show, and no stream below capacity builds that much.
        overloaded = (
            offered - P95_Z * sigma > load.items_s or class_total > load.items_s * RATE_WINDOW_S
        )
        if not overloaded and class_total >= BACKLOG_ROUNDS * load.batch * max(1, load.workers):
            # A burst: a backlog of whole rounds of batches, and arrivals over the last
            # second beyond what the workers serve in one (by more than its noise),
            # counted up to this request: a burst must show within its first batch.
            burst_n = n * sum(
                self.offered.since((ref, c), now - BURST_WINDOW_S)
                for c in PRIORITY_CLASSES[: rank + 1]
            )
            overloaded = burst_n - P95_Z * math.sqrt(burst_n * n) > load.items_s * BURST_WINDOW_S
        wait = wait_s(ahead, load, drain, overtaking)
        if not overloaded:
            return Decision(True, wait)
        if wait <= budget:
            return Decision(True, wait)
        if budget < 0:
            # Even with nothing queued ahead, a running batch and its own outlast the
            # deadline while the workers are saturated. Not a refusal for capacity that
            # lower classes would take: their longer deadlines can wait, and refusing
            # them too would only leave the workers idle.
            busy_s = load.batch_ms / 1000 * (1 + 1 / max(1, load.workers)) + self.margin_s
            return Decision(
                False,
                wait,
                retry_after_s=1.0,
                reason="deadline",
                message=(
                    f"cannot finish within its deadline of {deadline_s * 1000:.0f} ms while "
                    f"this model's workers are saturated: a batch takes {load.batch_ms:.0f} "
                    f"ms, so waiting for one and running its own takes {busy_s * 1000:.0f} "
                    "ms; send a longer timeout_ms, or retry when the load drops"
                ),
            )
        retry = wait - max(0.0, budget) if math.isfinite(wait) else NO_CAPACITY_RETRY_S
        return Decision(
            False,
            wait,
            retry_after_s=max(1.0, retry),
            reason="capacity",
            message=(
                f"overloaded: about {wait:.1f}s of work is queued ahead of this request "
                f"({priority}), more than its deadline leaves"
                if math.isfinite(wait)
                else f"overloaded: higher tiers take all of this model's capacity ({priority})"
            ),
        )
