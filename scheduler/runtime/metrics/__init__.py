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

Three modules: families.py (the registry and its families), hooks.py (written where
things happen), gauges.py (read at scrape time, and the dashboard's window).
"""

from scheduler.runtime.metrics.families import (
    BATCHES,
    FINISHED,
    GEN_KV_TOTAL,
    REGISTRY,
    STAGE_SECONDS,
    WORKER_BUSY,
)
from scheduler.runtime.metrics.gauges import (
    DEVICE_FRESH_S,
    SchedulerState,
    device_families,
    gauge_families,
    serve,
    state_of,
    window,
)
from scheduler.runtime.metrics.hooks import (
    batch_done,
    committed,
    dead_lettered,
    generation_step,
    generation_ttft,
    merged_writes,
    persist_retried,
    persisted,
    produce_failed,
    timed_store,
    worker_lost,
)

__all__ = [
    "BATCHES",
    "DEVICE_FRESH_S",
    "FINISHED",
    "GEN_KV_TOTAL",
    "REGISTRY",
    "STAGE_SECONDS",
    "WORKER_BUSY",
    "SchedulerState",
    "batch_done",
    "committed",
    "dead_lettered",
    "device_families",
    "gauge_families",
    "generation_step",
    "generation_ttft",
    "merged_writes",
    "persist_retried",
    "persisted",
    "produce_failed",
    "serve",
    "state_of",
    "timed_store",
    "window",
    "worker_lost",
]
