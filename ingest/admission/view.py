"""What the schedulers' load reports say, combined: each model's capacity, what waits
in each class and for its largest tenants, what Kafka holds back (``LoadView``), and
how many requests a new one would find ahead of it. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.load_report import REST, KVState, LoadReport, TenantBacklog
from core.vocab import PRIORITY_CLASSES, PriorityClass


@dataclass
class ModelLoad:
    """What the live workers of one model can do (scheduler/core/capacity.py's record)."""

    items_s: float = 0.0
    batch: int = 1
    batch_ms: float = 0.0
    single_ms: float = 0.0
    workers: int = 0

    @classmethod
    def of(cls, raw: Any) -> ModelLoad:
        if isinstance(raw, Mapping):
            return cls(
                float(raw.get("items_s", 0.0)),
                max(1, int(raw.get("batch", 1))),
                float(raw.get("batch_ms", 0.0)),
                float(raw.get("single_ms", 0.0)),
                int(raw.get("workers", 0)),
            )
        return cls(items_s=float(raw), workers=1)  # a report from before the record


@dataclass(frozen=True)
class ClassSums:
    higher: float  # queued in the classes above
    held: float  # held in Kafka by paused classes at or above (partitions are FIFO)
    queued: float  # queued in the class itself
    by_tenant: Mapping[str, list[float]]  # its largest tenants: [queued, weight]
    weights: float  # their weights summed (REST: its tenant count)


@dataclass
class LoadView:
    capacity: dict[str, ModelLoad]
    backlog: dict[str, dict[str, int]]
    lag: dict[str, int]
    tenants: TenantBacklog = field(default_factory=dict)
    as_of: float = 0.0  # monotonic time of the oldest report in it
    schedulers: int = 1  # reports combined (each scheduler buffers its own share)
    # generation model ref -> each scheduler's KV cache (ingest/admission/kv.py)
    kv: dict[str, list[KVState]] = field(default_factory=dict)
    _sums: dict[tuple[str, str], ClassSums] = field(default_factory=dict, repr=False)

    def sums(self, ref: str, priority: str) -> ClassSums:
        """What one class of one model sees queued (computed once per view)."""
        got = self._sums.get((ref, priority))
        if got is None:
            rank = PriorityClass(priority).rank
            by_class = self.backlog.get(ref, {})
            by_tenant = self.tenants.get(ref, {}).get(priority) or {}
            got = self._sums[(ref, priority)] = ClassSums(
                higher=sum(by_class.get(c, 0) for c in PRIORITY_CLASSES[:rank]),
                held=sum(self.lag.get(c, 0) for c in PRIORITY_CLASSES[: rank + 1]),
                queued=by_class.get(priority, 0),
                by_tenant=by_tenant,
                weights=sum(w for _, w in by_tenant.values()),
            )
        return got

    @classmethod
    def combine(cls, reports: Iterable[LoadReport]) -> LoadView:
        cap: dict[str, ModelLoad] = {}
        back: dict[str, dict[str, int]] = {}
        lag: dict[str, int] = {}
        tenants: TenantBacklog = {}
        kv: dict[str, list[KVState]] = {}
        n = 0
        for r in reports:
            n += 1
            for ref, state in r.kv.items():
                kv.setdefault(ref, []).append(state)
            for ref, raw in r.capacity.items():
                c = ModelLoad.of(raw)
                have = cap.get(ref)
                if have is None:
                    cap[ref] = c
                else:  # several schedulers: capacity adds up, batch times are the longest
                    have.items_s += c.items_s
                    have.workers += c.workers
                    have.batch = max(have.batch, c.batch)
                    have.batch_ms = max(have.batch_ms, c.batch_ms)
                    have.single_ms = max(have.single_ms, c.single_ms)
            for ref, by_class in r.backlog.items():
                dst = back.setdefault(ref, {})
                for cls_, k in by_class.items():
                    dst[cls_] = dst.get(cls_, 0) + k
            for cls_, k in r.lag.items():
                lag[cls_] = lag.get(cls_, 0) + k
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
        return cls(cap, back, lag, tenants, schedulers=max(1, n), kv=kv)


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
    reported: float, class_reported: float, admitted: float, age_s: float, drain_s: float
) -> float:
    """A tenant's queue now, from a report ``age_s`` old: plus what was admitted since,
    less what its share of the workers served meanwhile (its share of the class's queue
    then; all of the capacity when it was the only one queued)."""
    share = reported / class_reported if class_reported > 0 else 0.0
    return max(0.0, reported + admitted - age_s * drain_s * share)


def queued_ahead(
    view: LoadView,
    ref: str,
    priority: str,
    tenant: str | None = None,
    weight: float = 1.0,
    admitted: float = 0.0,
    age_s: float = 0.0,
    drain_s: float = 0.0,
) -> tuple[float, float]:
    """(requests served before a new one of this class and tenant, requests queued at
    this class and above). ``admitted``: this tenant's requests of this class admitted
    since the reports, which are ``age_s`` old; ``drain_s``: items/s left to the class."""
    c = view.sums(ref, priority)
    if tenant is not None and c.by_tenant:
        reported = c.by_tenant.get(tenant, [0.0, weight])[0]
        own = own_queue_now(reported, c.queued, admitted, age_s, drain_s)
        mine = share_ahead(c.by_tenant, tenant, weight, own)
    else:  # no breakdown reported: the whole class counts
        mine = c.queued + admitted
    # Messages held in Kafka by a paused class are neither split by model nor by tenant,
    # and partitions are FIFO: a new request lands behind all of them (conservative).
    return c.higher + c.held + mine, c.higher + c.held + c.queued + admitted
