"""Capacity-driven admission: shed load by predicted queue delay, lowest tier first.

Every scheduler reports, each second, what its live workers can do (items/s per
model at the best measured batch size) and what is waiting (queued requests per
model and class, and what Kafka holds back in paused classes). The predicted
delay for a new request of class c is the work queued at c or above, divided by
the capacity that the
target utilization leaves usable. A request is shed (503 + Retry-After) when its
predicted delay exceeds its class's threshold; thresholds rise with the tier, so
free traffic is shed first, then paid, enterprise last. When workers join or die
the capacity, and so the shedding point, follows within a report interval.

Inside its own class a request does not wait behind the whole class: the
scheduler serves the class's tenants by weighted deficit round robin, so a new
request of tenant t waits for at most as much of another tenant u's queue as t
itself gets served meanwhile: min(q_u, (q_t + 1) * w_u / w_t). Schedulers report
the largest tenants' queues per class, so the tenant that owns a backlog is the
one whose predicted delay crosses the threshold and is shed, while a quiet
tenant of the same tier is still admitted. Pure.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from core.load_report import REST, LoadReport, TenantBacklog
from core.vocab import PRIORITY_CLASSES


@dataclass
class LoadView:
    capacity: dict[str, float]
    backlog: dict[str, dict[str, int]]
    lag: dict[str, int]
    tenants: TenantBacklog = field(default_factory=dict)
    as_of: float = 0.0  # monotonic time of the oldest report in it

    @classmethod
    def combine(cls, reports: Iterable[LoadReport]) -> LoadView:
        cap: dict[str, float] = {}
        back: dict[str, dict[str, int]] = {}
        lag: dict[str, int] = {}
        tenants: TenantBacklog = {}
        for r in reports:
            for ref, c in r.capacity.items():
                cap[ref] = cap.get(ref, 0.0) + c
            for ref, by_class in r.backlog.items():
                dst = back.setdefault(ref, {})
                for cls_, n in by_class.items():
                    dst[cls_] = dst.get(cls_, 0) + n
            for cls_, n in r.lag.items():
                lag[cls_] = lag.get(cls_, 0) + n
            for ref, tenants_by_class in r.tenants.items():
                for cls_, by_tenant in tenants_by_class.items():
                    dst_t = tenants.setdefault(ref, {}).setdefault(cls_, {})
                    for t, (q, w) in by_tenant.items():
                        old = dst_t.get(t)
                        if old is None:
                            dst_t[t] = [q, w]
                        elif t == REST:  # the rest: queued adds up, and so do tenants (at most)
                            dst_t[t] = [old[0] + q, old[1] + w]
                        else:  # one tenant's requests spread over several schedulers
                            dst_t[t] = [old[0] + q, w]
        return cls(cap, back, lag, tenants)


@dataclass(frozen=True)
class Decision:
    admit: bool
    predicted_delay_s: float
    retry_after_s: float = 0.0
    reason: str = ""


class RecentAdmissions:
    """Requests this API instance admitted lately, counted in time buckets per key.

    The schedulers' reports are up to a couple of seconds old when a request is
    decided; what was admitted since is not in them yet. Without counting it, a
    burst is admitted for those seconds at full speed and overshoots the threshold
    many times over (measured: a 500/s burst got hundreds of requests past their
    deadline before the view caught up)."""

    def __init__(self, horizon_s: float = 5.0, bucket_s: float = 0.1):
        self.horizon_s = horizon_s
        self.bucket_s = bucket_s
        self._buckets: dict[Hashable, deque[list[float]]] = {}

    def add(self, key: Hashable, now: float) -> None:
        start = math.floor(now / self.bucket_s) * self.bucket_s
        q = self._buckets.setdefault(key, deque())
        if q and q[-1][0] == start:
            q[-1][1] += 1
        else:
            q.append([start, 1])
        while q and q[0][0] < now - self.horizon_s:
            q.popleft()

    def since(self, key: Hashable, t: float) -> int:
        """Admitted at or after ``t`` (to a bucket's precision: rounds up, conservative)."""
        q = self._buckets.get(key)
        if not q:
            return 0
        floor_t = math.floor(t / self.bucket_s) * self.bucket_s
        return int(sum(n for start, n in q if start >= floor_t))


def share_ahead(
    by_tenant: Mapping[str, list[float]], tenant: str, weight: float, own: float
) -> float:
    """Requests of one class served before a new request of ``tenant`` under weighted
    round robin: all of its own queue (``own``, estimated now), and of every other
    tenant u at most (own + 1) * w_u / w_own (u is served that much while ours drains)."""
    turns = (own + 1) / max(weight, 1e-9)
    ahead = own
    for t, (n, w) in by_tenant.items():
        # for REST, w counts its tenants (each taken at the default weight 1)
        if t != tenant:
            ahead += min(n, w * turns)
    return ahead


def own_queue_now(
    reported: float, class_reported: float, admitted: float, age_s: float, usable_cap: float
) -> float:
    """A tenant's queue now, from a report ``age_s`` old: plus what was admitted since,
    less what its share of the workers served meanwhile (its share of the class's queue
    then; all of the capacity when it was the only one queued)."""
    share = reported / class_reported if class_reported > 0 else 0.0
    return max(0.0, reported + admitted - age_s * usable_cap * share)


def predicted_delay_s(
    view: LoadView,
    ref: str,
    priority: str,
    utilization: float,
    tenant: str | None = None,
    weight: float = 1.0,
    admitted: float = 0.0,
    age_s: float = 0.0,
    higher_rate: float = 0.0,
) -> float:
    """Seconds of work queued ahead of a new request of this class for this model
    (and of this tenant, when the schedulers reported who owns the class's queue).
    ``admitted``: requests of this tenant and class admitted since the reports, which
    are ``age_s`` old. ``higher_rate``: requests/s of higher classes arriving now; they
    will overtake this one, so only the capacity they leave drains its queue."""
    cap = view.capacity.get(ref, 0.0) * utilization - higher_rate
    rank = PRIORITY_CLASSES.index(priority)
    by_class = view.backlog.get(ref, {})
    queued: float = sum(by_class.get(c, 0) for c in PRIORITY_CLASSES[:rank])
    by_tenant = view.tenants.get(ref, {}).get(priority) or {}
    class_q = by_class.get(priority, 0)
    if tenant is not None:
        reported = by_tenant.get(tenant, [0.0, weight])[0]
        own = own_queue_now(reported, class_q, admitted, age_s, cap)
        queued += share_ahead(by_tenant, tenant, weight, own)
        if not by_tenant:  # no breakdown reported: the rest of the class counts in full
            queued += class_q
    else:
        queued += class_q + admitted
    # Messages held in Kafka by a paused class are neither split by model nor by tenant,
    # and partitions are FIFO: a new request lands behind all of them. Count them
    # against every model (conservative).
    queued += sum(view.lag.get(c, 0) for c in PRIORITY_CLASSES[: rank + 1])
    if cap <= 0:  # higher classes take all of it: this request would wait indefinitely
        return math.inf
    return queued / cap


def decide(
    view: LoadView | None,
    ref: str,
    priority: str,
    *,
    utilization: float,
    thresholds_ms: Mapping[str, float],
    tenant: str | None = None,
    weight: float = 1.0,
    admitted: float = 0.0,
    age_s: float = 0.0,
    higher_rate: float = 0.0,
) -> Decision:
    if view is None or ref not in view.capacity:
        return Decision(True, 0.0)  # no reports yet: admit (the catalog already 503s dead models)
    delay = predicted_delay_s(
        view, ref, priority, utilization, tenant, weight, admitted, age_s, higher_rate
    )
    limit = thresholds_ms.get(priority, math.inf) / 1000
    if delay <= limit:
        return Decision(True, delay)
    drain = delay if math.isfinite(delay) else 5.0
    return Decision(
        False,
        delay,
        retry_after_s=max(1.0, drain),
        reason=(
            f"overloaded: about {delay:.1f}s of work queued ahead of this request "
            f"(class {priority})"
        ),
    )
