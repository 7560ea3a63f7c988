"""The scheduler's Prometheus metrics, its workers' included, on its own HTTP port.

Counters and histograms are written where things happen (a batch back from its
worker, rows committed, an offset commit); gauges (queues, lag, the oldest waiting
request, batches on each worker, workers warming up, GPU use) are read from the
service's state when Prometheus scrapes, so they cost the hot path nothing.

Workers export nothing themselves: the scheduler sees every batch it sends, so it
counts each worker's busy seconds (compute start to end as the worker reports it),
its batches in flight and whether it is still warming up; a worker's GPU reading
(NVML) rides on each result (workers/metrics.py). One endpoint per scheduler
process, no port per worker to allocate or discover; a worker serving several
schedulers (decision 14) is seen by each for the batches it sent, and its busy
seconds add up across them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from core.metrics import (
    BATCH_SIZE_BUCKETS,
    LATENCY_BUCKETS,
    RATIO_BUCKETS,
    STAGES,
    observe_many,
    snapshot,
    stage_histogram,
)
from core.metrics_window import SCHEDULER_SERIES, MetricsWindow, merged
from core.protocol import WorkResult
from core.request_row import RequestRow
from core.vocab import PRIORITY_CLASSES, ModelRef
from scheduler.runtime import tracing

if TYPE_CHECKING:
    from core.config import Settings
    from scheduler.core.batcher import Batch, Pending
    from scheduler.runtime.service import SchedulerService

log = logging.getLogger("gristmill.scheduler.runtime.metrics")
T = TypeVar("T")

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)  # CPU seconds, memory, open files of this process

STAGE_SECONDS = stage_histogram(REGISTRY)
SCHEDULER_STAGES = STAGES[:4]  # queue, batch_wait, compute, persist
FINISHED = Counter(
    "gristmill_requests_finished_total",
    "Requests recorded in the request log, by outcome: succeeded, failed (after retries; "
    "dead-lettered), expired (deadline passed before compute), cancelled (job cancelled)",
    ["model", "version", "class", "status"],
    registry=REGISTRY,
)
BATCHES = Counter(
    "gristmill_batches_total",
    "Batches computed, by why they were flushed: full, linger, deadline, priority, retry",
    ["model", "version", "reason"],
    registry=REGISTRY,
)
BATCH_SIZE = Histogram(
    "gristmill_batch_size",
    "Requests per computed batch",
    ["model", "version"],
    buckets=BATCH_SIZE_BUCKETS,
    registry=REGISTRY,
)
BATCH_FILL = Histogram(
    "gristmill_batch_fill_ratio",
    "Requests per computed batch over the largest batch the model's workers take",
    ["model", "version"],
    buckets=RATIO_BUCKETS,
    registry=REGISTRY,
)
BATCH_FAILURES = Counter(
    "gristmill_batch_failures_total",
    "Batches that failed (model error, worker crashed or hung): split and retried",
    ["model", "version"],
    registry=REGISTRY,
)
DEAD_LETTERS = Counter(
    "gristmill_dead_letters_total",
    "Requests copied to the dead-letter topic after their last attempt failed",
    ["model", "version"],
    registry=REGISTRY,
)
WORKER_BUSY = Counter(
    "gristmill_worker_busy_seconds_total",
    "Seconds a worker computed this scheduler's batches; its rate is the busy fraction",
    ["worker"],
    registry=REGISTRY,
)
PERSIST_SECONDS = Histogram(
    "gristmill_persist_duration_seconds",
    "One result-store transaction (rows, batch row, NOTIFY, commit)",
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
PERSIST_RETRIES = Counter(
    "gristmill_persist_retries_total",
    "Result-store writes that failed and were retried (PostgreSQL away or refusing)",
    registry=REGISTRY,
)
PERSIST_MERGED = Counter(
    "gristmill_persist_merged_writes_total",
    "Batches' results written in another batch's transaction (group commit under a backlog)",
    registry=REGISTRY,
)
COMMIT_SECONDS = Histogram(
    "gristmill_kafka_commit_duration_seconds",
    "One synchronous Kafka offset commit, by consumer lane (sync, jobs)",
    ["lane"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
COMMIT_ERRORS = Counter(
    "gristmill_kafka_commit_errors_total",
    "Offset commits that failed (retried at the next interval)",
    ["lane"],
    registry=REGISTRY,
)
PRODUCE_ERRORS = Counter(
    "gristmill_kafka_produce_errors_total",
    "Messages Kafka did not confirm, by client and error",
    ["client", "reason"],
    registry=REGISTRY,
)

# Generation (decision 32): what continuous batching does, per model.
GEN_TTFT = Histogram(
    "gristmill_generation_time_to_first_token_seconds",
    "From the API's acceptance to the first output token, per finished completion",
    ["model"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
GEN_STEP = Histogram(
    "gristmill_generation_step_seconds",
    "One continuous-batching step (plan, compute on the worker, apply): the time between "
    "two tokens of every decoding sequence, i.e. the inter-token latency",
    ["model"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
GEN_TOKENS = Counter(
    "gristmill_generation_tokens_total",
    "Tokens computed by generation steps: output tokens sampled, and prompt or recomputed "
    "tokens prefilled; the rate of 'output' is tokens/s",
    ["model", "kind"],
    registry=REGISTRY,
)
GEN_KV_USED = Gauge(
    "gristmill_generation_kv_blocks_used",
    "KV-cache blocks held by running sequences after the last step",
    ["model"],
    registry=REGISTRY,
)
GEN_KV_TOTAL = Gauge(
    "gristmill_generation_kv_blocks",
    "KV-cache blocks in the worker's pool",
    ["model"],
    registry=REGISTRY,
)
GEN_PREEMPTIONS = Counter(
    "gristmill_generation_preemptions_total",
    "Running sequences whose KV blocks were dropped to make room (recomputed later)",
    ["model"],
    registry=REGISTRY,
)


def generation_step(
    model: str, step_s: float, sampled: int, computed: int, kv_used: int, preempted: int
) -> None:
    _child(GEN_STEP, model).observe(step_s)
    _child(GEN_TOKENS, model, "output").inc(sampled)
    _child(GEN_TOKENS, model, "prefill").inc(max(0, computed - sampled))
    _child(GEN_KV_USED, model).set(kv_used)
    if preempted:
        _child(GEN_PREEMPTIONS, model).inc(preempted)


def generation_ttft(model: str, seconds: float) -> None:
    _child(GEN_TTFT, model).observe(seconds)


# A GPU reading older than this is not shown: the worker got no batch since, so it is
# not a reading of what this scheduler's work does to the GPU now (the usual scrape
# interval, so an idle worker's series ends within one scrape).
DEVICE_FRESH_S = 15.0

_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, cached: the hot path pays one dict lookup."""
    key = (id(metric), *labels)
    c = _children.get(key)
    if c is None:
        c = _children[key] = metric.labels(*labels)
    return c


# ---- written where things happen -----------------------------------------------------
_devices: dict[str, tuple[dict[str, float | str], float]] = {}  # worker -> (sample, at)
_devices_lock = threading.Lock()


def batch_done(
    worker_id: str, batch: Batch, result: WorkResult, max_batch: Mapping[ModelRef, int]
) -> None:
    """A batch came back from its worker (computed or failed); ``max_batch``: the
    largest batch each model's workers take (the core's, read without its lock: one
    dict lookup)."""
    m, v = batch.key.model, batch.key.version
    size = len(batch.items)
    _child(BATCHES, m, v, batch.reason).inc()
    _child(BATCH_SIZE, m, v).observe(size)
    _child(BATCH_FILL, m, v).observe(min(1.0, size / max(1, max_batch.get(batch.key.ref, 1))))
    _child(WORKER_BUSY, worker_id).inc(max(0.0, result.compute_end - result.compute_start))
    if result.error is not None:
        _child(BATCH_FAILURES, m, v).inc()
    device = getattr(result, "device", None)
    if device:
        with _devices_lock:
            _devices[worker_id] = (device, time.monotonic())


def worker_lost(held: Sequence[Batch], *, ran: bool, error: str) -> None:
    """A worker crashed or hung: the batch it computed (``ran``) failed; the spans of every
    batch it held end (those queued behind go back and are sent again)."""
    if held and ran:
        _child(BATCH_FAILURES, held[0].key.model, held[0].key.version).inc()
    for b in held:
        tracing.finished(b, error=error)


def dead_lettered(items: Iterable[Pending]) -> None:
    for p in items:
        _child(DEAD_LETTERS, p.msg.model, p.msg.version).inc()


def produce_failed(reason: str, n: int = 1) -> None:
    _child(PRODUCE_ERRORS, "scheduler", reason).inc(n)


def persist_retried() -> None:
    PERSIST_RETRIES.inc()


def merged_writes(n: int) -> None:
    """``n`` writes went in one transaction: ``n - 1`` of them rode on another's."""
    PERSIST_MERGED.inc(n - 1)


def timed_store(
    store: Callable[[list[RequestRow], Any], T],
) -> Callable[[list[RequestRow], Any], T]:
    """The result store's write, its transactions timed (failed ones too: their time is
    the database's answer)."""

    def timed(rows: list[RequestRow], brow: Any) -> T:
        started = time.monotonic()
        try:
            return store(rows, brow)
        finally:
            PERSIST_SECONDS.observe(time.monotonic() - started)

    return timed


def committed(lane: str, seconds: float, ok: bool) -> None:
    _child(COMMIT_SECONDS, lane).observe(seconds)
    if not ok:
        _child(COMMIT_ERRORS, lane).inc()


def persisted(rows: list[RequestRow], now: float | None = None) -> None:
    """Rows are committed: every stage each request went through, and its outcome.

    A scheduler feeding a GPU persists tens of thousands of rows a second, so this is
    one pass of dictionary lookups per row: rows of one batch share their datetimes
    (consumed in one fetch, batched, computed together), so the stages after ``queue``
    are worked out once per group of equal times and observed in one step
    (``observe_many``) rather than four ``observe`` calls a row."""
    now = time.time() if now is None else now
    finished: dict[tuple[str, str, str, str], int] = {}
    queued: dict[tuple[str, str, str], list[float]] = {}
    # (labels, consumed, batched, compute start, compute end) -> rows with those times
    shared: dict[tuple[Any, ...], int] = {}
    epoch: dict[int, float] = {}  # id(datetime) -> epoch s: each shared datetime once

    def at(d: datetime) -> float:
        t = epoch.get(id(d))
        if t is None:
            t = epoch[id(d)] = d.timestamp()
        return t

    for r in rows:
        labels = (r["model"], r["model_version"], r["priority"])
        fkey = (*labels, r["status"])
        finished[fkey] = finished.get(fkey, 0) + 1
        consumed = r["consumed_at"]
        if consumed is None:
            continue
        q = queued.get(labels)
        if q is None:
            q = queued[labels] = []
        q.append(max(0.0, at(consumed) - r["received_at"].timestamp()))
        key = (labels, consumed, r["batched_at"], r["compute_start_at"], r["compute_end_at"])
        shared[key] = shared.get(key, 0) + 1
    for labels, values in queued.items():
        observe_many((_stages.get(labels) or _stage_children(labels))[0], values)
    for (labels, consumed, batched, start, end), n in shared.items():
        _, batch_wait, compute, persist = _stages[labels]
        if batched is not None:
            observe_many(batch_wait, [max(0.0, at(batched) - at(consumed))], n)
        if start is not None and end is not None:
            observe_many(compute, [max(0.0, at(end) - at(start))], n)
            observe_many(persist, [max(0.0, now - at(end))], n)
    for (m, v, cls_, status), n in finished.items():
        _child(FINISHED, m, v, cls_, str(status)).inc(n)


_stages: dict[tuple[str, str, str], tuple[Any, Any, Any, Any]] = {}


def _stage_children(labels: tuple[str, str, str]) -> tuple[Any, Any, Any, Any]:
    """The four stage histograms the scheduler observes for one model and class."""
    queue, batch_wait, compute, persist = (
        STAGE_SECONDS.labels(s, *labels) for s in SCHEDULER_STAGES
    )
    out = _stages[labels] = (queue, batch_wait, compute, persist)
    return out


# ---- read at scrape time -------------------------------------------------------------
@dataclass
class SchedulerState:
    """What the gauges show, copied from the service under its lock."""

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


def _oldest_of(items: Iterable[Pending], into: dict[tuple[ModelRef, int], float]) -> None:
    for p in items:
        k = (p.key.ref, p.rank)
        if p.msg.received_at < into.get(k, math.inf):
            into[k] = p.msg.received_at


def read_state(svc: SchedulerService) -> SchedulerState:
    """The service's state for one scrape (holds its lock for a few dict walks)."""
    core = svc.core
    with svc.cond:
        oldest = core.batcher.oldest_received()
        live = [w for w in core.workers if w.alive]
        for w in live:
            for e in w.queue:
                _oldest_of(e.batch.items, oldest)
        for retry in core.retries:
            _oldest_of(retry.batch.items, oldest)
        queued = {
            (ref, rank): n
            for ref, depths in core.batcher.depth_by_model().items()
            for rank, n in enumerate(depths)
        }
        workers = {w.worker_id: set(w.refs) for w in live}
        in_flight = {w.worker_id: len(w.queue) for w in live}
        served = set(core.max_batch)
    lag: dict[str, int] = {}
    paused: set[str] = set()
    for lane in svc.lanes:
        for cls_, n in lane.lag.items():
            lag[cls_] = lag.get(cls_, 0) + n
        paused |= {PRIORITY_CLASSES[r] for r in lane.paused}
        for r in lane.spec.ranks:  # a class read and not lagging shows 0, not nothing
            lag.setdefault(PRIORITY_CLASSES[r], 0)
    return SchedulerState(
        now=time.time(),
        served=served,
        queued=queued,
        oldest=oldest,
        lag=lag,
        paused=paused,
        in_flight=in_flight,
        workers=workers,
        warming=svc.pool.warming(),
    )


def gauge_families(st: SchedulerState) -> Iterator[Metric]:
    """The gauges of one state (pure: unit-tested on hand-made states)."""
    refs = sorted(st.served | {ref for ref, _ in st.queued} | {ref for ref, _ in st.oldest})
    queued = GaugeMetricFamily(
        "gristmill_requests_queued",
        "Requests read from Kafka and waiting in the batcher",
        labels=["model", "version", "class"],
    )
    age = GaugeMetricFamily(
        "gristmill_oldest_message_age_seconds",
        "Age (since the API received it) of the oldest request read and not yet "
        "persisted: queued, on a worker or waiting for a retry; 0 when none",
        labels=["class", "model", "version"],
    )
    for ref in refs:
        for rank, cls_ in enumerate(st.classes):
            queued.add_metric([ref.model, ref.version, cls_], st.queued.get((ref, rank), 0))
            t = st.oldest.get((ref, rank))
            age.add_metric(
                [cls_, ref.model, ref.version], 0.0 if t is None else max(0.0, st.now - t)
            )
    yield queued
    yield age
    lag = GaugeMetricFamily(
        "gristmill_consumer_lag_messages",
        "Messages in Kafka this scheduler's partitions hold beyond what it has read",
        labels=["class"],
    )
    paused = GaugeMetricFamily(
        "gristmill_consumer_paused",
        "1 while the class's partitions are paused because its buffer is full",
        labels=["class"],
    )
    for cls_ in sorted(st.lag):
        lag.add_metric([cls_], st.lag[cls_])
        paused.add_metric([cls_], 1.0 if cls_ in st.paused else 0.0)
    yield lag
    yield paused
    in_flight = GaugeMetricFamily(
        "gristmill_worker_batches_in_flight",
        "Batches sent to a worker whose result is not back (computing or queued on it)",
        labels=["worker"],
    )
    for w in sorted(st.in_flight):
        in_flight.add_metric([w], st.in_flight[w])
    yield in_flight
    workers = GaugeMetricFamily(
        "gristmill_workers",
        "Workers of this scheduler: ready (serving) or warming (loading, warming up)",
        labels=["state"],
    )
    workers.add_metric(["ready"], len(st.workers))
    workers.add_metric(["warming"], st.warming)
    yield workers
    per_model = GaugeMetricFamily(
        "gristmill_model_workers", "Ready workers serving each model", labels=["model", "version"]
    )
    for ref in refs:
        n = sum(1 for served in st.workers.values() if ref in served)
        per_model.add_metric([ref.model, ref.version], n)
    yield per_model


def device_families(
    samples: dict[str, tuple[dict[str, float | str], float]], now: float
) -> Iterator[Metric]:
    util = GaugeMetricFamily(
        "gristmill_gpu_utilization_ratio",
        "Share of the last sample period the worker's GPU was running kernels (NVML)",
        labels=["worker", "gpu"],
    )
    used = GaugeMetricFamily(
        "gristmill_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=["worker", "gpu"]
    )
    total = GaugeMetricFamily(
        "gristmill_gpu_memory_total_bytes", "GPU memory in all (NVML)", labels=["worker", "gpu"]
    )
    for worker, (s, at) in sorted(samples.items()):
        if now - at > DEVICE_FRESH_S:
            continue
        labels = [worker, str(s.get("gpu", ""))]
        util.add_metric(labels, float(s["utilization"]))
        used.add_metric(labels, float(s["memory_used_bytes"]))
        total.add_metric(labels, float(s["memory_total_bytes"]))
    yield util
    yield used
    yield total


_collector: Collector | None = None


class _StateCollector(Collector):
    def __init__(self, svc: SchedulerService):
        self.svc = svc

    def collect(self) -> Iterator[Metric]:
        yield from gauge_families(read_state(self.svc))
        with _devices_lock:
            samples = dict(_devices)
        yield from device_families(samples, time.monotonic())


def serve(svc: SchedulerService, settings: Settings) -> None:
    """Register the service's gauges and listen for scrapes (``metrics_port``; 0: none).
    A port already taken is logged, not fatal: the scheduler's work matters more."""
    global _collector
    if _collector is not None:  # a second service in this process (tests) replaces the first
        REGISTRY.unregister(_collector)
    _collector = _StateCollector(svc)
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
    (the gauges take the service's lock briefly)."""
    sources: list[Collector] = [STAGE_SECONDS, FINISHED, BATCHES, WORKER_BUSY]
    if _collector is not None:
        sources.append(_collector)
    return _window.publish(now, merged(snapshot(c) for c in sources))
