"""The scheduler's gauges, read when Prometheus scrapes (so they cost the hot path
nothing), and its metrics window published for the dashboard.

What they show comes from the dispatch core's stats snapshot (scheduler/core/stats.py,
taken through its host), the lanes' lag and pauses, and the worker pool: never from the
core's fields. ``gauge_families`` is pure, unit-tested on hand-made states.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from core.metrics import snapshot
from core.metrics_window import SCHEDULER_SERIES, MetricsWindow, merged
from core.vocab import PRIORITY_CLASSES, ModelRef
from scheduler.core.shares import FairnessStats, TenantShare
from scheduler.core.stats import CoreStats
from scheduler.runtime.metrics.families import (
    BATCHES,
    FINISHED,
    REGISTRY,
    STAGE_SECONDS,
    WORKER_BUSY,
)
from scheduler.runtime.metrics.hooks import _devices, _devices_lock

if TYPE_CHECKING:
    from core.config import Settings
    from scheduler.runtime.lane import ConsumerLane

log = logging.getLogger(__name__)

# A GPU reading older than this is not shown: the worker got no batch since, so it is
# not a reading of what this scheduler's work does to the GPU now (the usual scrape
# interval, so an idle worker's series ends within one scrape).
DEVICE_FRESH_S = 15.0


# ---- read at scrape time -------------------------------------------------------------
@dataclass
class SchedulerState:
    """What the gauges show at one scrape."""

    now: float  # epoch s
    served: set[ModelRef]  # models of the live workers
    queued: dict[tuple[ModelRef, int], int]  # (model, rank) -> requests in the batcher
    oldest: dict[tuple[ModelRef, int], float]  # (model, rank) -> received_at (epoch s)
    lag: dict[str, int]  # class -> messages in Kafka not yet read
    paused: set[str]  # classes whose partitions are paused (buffer full)
    in_flight: dict[str, int]  # worker id -> batches sent, result not back
    workers: dict[str, set[ModelRef]]  # live worker id -> models
    warming: int  # spawned workers still loading and warming up
    classes: tuple[str, ...] = field(default=tuple(PRIORITY_CLASSES))
    fairness: FairnessStats = field(default_factory=FairnessStats)  # decision 65


def state_of(stats: CoreStats, lanes: Sequence[ConsumerLane], warming: int) -> SchedulerState:
    """What the gauges show: the core's snapshot, the lanes' lag and pauses, and the
    spawned workers still warming up."""
    lag: dict[str, int] = {}
    paused: set[str] = set()
    for lane in lanes:
        for cls_, n in lane.lag.items():
            lag[cls_] = lag.get(cls_, 0) + n
        paused |= {PRIORITY_CLASSES[r] for r in lane.paused}
        for r in lane.spec.ranks:  # a class read and not lagging shows 0, not nothing
            lag.setdefault(PRIORITY_CLASSES[r], 0)
    return SchedulerState(
        now=time.time(),
        served=set(stats.sized),
        queued=dict(stats.queued),
        oldest=dict(stats.oldest),
        lag=lag,
        paused=paused,
        in_flight={w.worker_id: w.in_flight for w in stats.workers},
        workers={w.worker_id: set(w.serving) for w in stats.workers},
        warming=warming,
        fairness=stats.fairness,
    )


def _gauge(
    name: str, doc: str, labels: list[str], samples: Iterable[tuple[list[str], float]]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


def gauge_families(st: SchedulerState) -> Iterator[Metric]:
    """The gauges of one state (pure: unit-tested on hand-made states)."""
    refs = sorted(st.served | {ref for ref, _ in st.queued} | {ref for ref, _ in st.oldest})
    cells = [(ref, rank, cls_) for ref in refs for rank, cls_ in enumerate(st.classes)]

    def age(ref: ModelRef, rank: int) -> float:
        t = st.oldest.get((ref, rank))
        return 0.0 if t is None else max(0.0, st.now - t)

    yield _gauge(
        "gristmill_requests_queued",
        "Requests read from Kafka and waiting in the batcher",
        ["model", "version", "class"],
        (([r.model, r.version, c], st.queued.get((r, k), 0)) for r, k, c in cells),
    )
    yield _gauge(
        "gristmill_oldest_message_age_seconds",
        "Age (since the API received it) of the oldest request read and not yet "
        "persisted: queued, on a worker or waiting for a retry; 0 when none",
        ["class", "model", "version"],
        (([c, r.model, r.version], age(r, k)) for r, k, c in cells),
    )
    classes = sorted(st.lag)
    yield _gauge(
        "gristmill_consumer_lag_messages",
        "Messages in Kafka this scheduler's partitions hold beyond what it has read",
        ["class"],
        (([c], st.lag[c]) for c in classes),
    )
    yield _gauge(
        "gristmill_consumer_paused",
        "1 while the class's partitions are paused because its buffer is full",
        ["class"],
        (([c], 1.0 if c in st.paused else 0.0) for c in classes),
    )
    yield _gauge(
        "gristmill_worker_batches_in_flight",
        "Batches sent to a worker whose result is not back (computing or queued on it)",
        ["worker"],
        (([w], st.in_flight[w]) for w in sorted(st.in_flight)),
    )
    yield _gauge(
        "gristmill_workers",
        "Workers of this scheduler: ready (serving) or warming (loading, warming up)",
        ["state"],
        [(["ready"], len(st.workers)), (["warming"], st.warming)],
    )
    yield _gauge(
        "gristmill_model_workers",
        "Ready workers serving each model",
        ["model", "version"],
        (
            ([r.model, r.version], sum(1 for served in st.workers.values() if r in served))
            for r in refs
        ),
    )


# Tenants with series of their own per class; the rest are summed as tenant "other".
# Labels stay bounded (a tenant is not a label elsewhere, docs/observability.md): the
# tenants taking or owed the most device time are the ones an operator looks at, and
# every tenant is in the analysts' device_time_by_minute (docs/analysts.md).
TENANT_SERIES = 10
OTHER = "other"


def _named(f: FairnessStats, limit: int) -> list[TenantShare]:
    """Per tier, the ``limit`` tenants of the largest recent shares, then one row
    "other" summing the rest."""
    out: list[TenantShare] = []
    tiers: dict[str, list[TenantShare]] = {}
    for row in f.tenants:
        tiers.setdefault(row.tier, []).append(row)
    for tier, rows in tiers.items():
        rows.sort(key=lambda r: (-max(r.received_share, r.entitled_share), r.tenant))
        out += rows[:limit]
        rest = rows[limit:]
        if rest:
            out.append(
                TenantShare(
                    tier,
                    OTHER,
                    sum(r.received_s for r in rest),
                    sum(r.entitled_s for r in rest),
                    sum(r.received_share for r in rest),
                    sum(r.entitled_share for r in rest),
                )
            )
    return out


def fairness_families(f: FairnessStats, limit: int = TENANT_SERIES) -> Iterator[Metric]:
    """Per tier and tenant (the ``limit`` largest, then "other"), device seconds
    received and owed since this scheduler started, the recent shares of both, and
    each tier's fairness index (decision 65). Gauges: a tenant's series may move into
    "other", which a counter could not do."""
    rows = _named(f, limit)
    for name, doc, attr in (
        (
            "gristmill_tenant_device_seconds",
            "Device (GPU) seconds the tenant's requests received since this scheduler "
            "started: each batch's measured compute split over its items by estimated cost",
            "received_s",
        ),
        (
            "gristmill_tenant_entitled_device_seconds",
            "Device seconds the tenant was owed since this scheduler started: each "
            "batch's time split over the tenants backlogged in its class by weight",
            "entitled_s",
        ),
    ):
        yield _gauge(
            name, doc, ["class", "tenant"], (([r.tier, r.tenant], getattr(r, attr)) for r in rows)
        )
    yield _gauge(
        "gristmill_tenant_device_share",
        "The tenant's share of its class's recent device time (one-minute half-life): "
        "received, or entitled (its weight over the backlogged tenants' weights)",
        ["class", "tenant", "kind"],
        (
            ([r.tier, r.tenant, kind], value)
            for r in rows
            for kind, value in (("received", r.received_share), ("entitled", r.entitled_share))
        ),
    )
    yield _gauge(
        "gristmill_fairness_index",
        "Jain's index over the class's tenants' recent received / entitled device time "
        "(1: each got what it was owed; 1/n: one of n got it all)",
        ["class"],
        (([tier], value) for tier, value in sorted(f.index.items())),
    )


def device_families(
    samples: dict[str, tuple[dict[str, float | str], float]], now: float
) -> Iterator[Metric]:
    fresh = [
        ([worker, str(s.get("gpu", ""))], s)
        for worker, (s, at) in sorted(samples.items())
        if now - at <= DEVICE_FRESH_S
    ]
    for name, doc, key in (
        (
            "gristmill_gpu_utilization_ratio",
            "Share of the last sample period the worker's GPU was running kernels (NVML)",
            "utilization",
        ),
        ("gristmill_gpu_memory_used_bytes", "GPU memory in use (NVML)", "memory_used_bytes"),
        ("gristmill_gpu_memory_total_bytes", "GPU memory in all (NVML)", "memory_total_bytes"),
    ):
        yield _gauge(name, doc, ["worker", "gpu"], ((lb, float(s[key])) for lb, s in fresh))


_collector: Collector | None = None


class _StateCollector(Collector):
    def __init__(self, read: Callable[[], SchedulerState]):
        self.read = read

    def collect(self) -> Iterator[Metric]:
        st = self.read()
        yield from gauge_families(st)
        yield from fairness_families(st.fairness)
        with _devices_lock:
            samples = dict(_devices)
        yield from device_families(samples, time.monotonic())


def serve(read: Callable[[], SchedulerState], settings: Settings) -> None:
    """Register the gauges ``read`` gives and listen for scrapes (``metrics_port``; 0:
    none). A port already taken is logged, not fatal: the scheduler's work matters more."""
    global _collector
    if _collector is not None:  # a second service in this process (tests) replaces the first
        REGISTRY.unregister(_collector)
    _collector = _StateCollector(read)
    REGISTRY.register(_collector)
    if not settings.metrics_port:
        return
    try:
        start_http_server(settings.metrics_port, settings.metrics_host, registry=REGISTRY)
    except OSError as exc:
        log.warning(
            "no metrics endpoint: cannot listen on %s:%d (%s); set GRISTMILL_METRICS_PORT",
            settings.metrics_host,
            settings.metrics_port,
            exc,
        )
        return
    log.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)


# ---- published for the dashboard -------------------------------------------------------
_window = MetricsWindow(SCHEDULER_SERIES)


def window(now: float) -> dict[str, Any]:
    """This scheduler's metrics window (core/metrics_window.py), published once a second
    with its load report: the families it names, collected as a scrape collects them
    (the gauges take the core's lock briefly, for its snapshot)."""
    sources: list[Collector] = [STAGE_SECONDS, FINISHED, BATCHES, WORKER_BUSY]
    if _collector is not None:
        sources.append(_collector)
    return _window.publish(now, merged(snapshot(c) for c in sources))
