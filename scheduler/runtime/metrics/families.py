"""The scheduler's metric families, in its own registry (names and buckets shared with
the other stages in core/metrics.py). Written by hooks.py where things happen; the
gauges read at scrape time are gauges.py's."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from core.metrics import BATCH_SIZE_BUCKETS, LATENCY_BUCKETS, RATIO_BUCKETS, STAGES, stage_histogram

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

_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, cached: the hot path pays one dict lookup."""
    key = (id(metric), *labels)
    c = _children.get(key)
    if c is None:
        c = _children[key] = metric.labels(*labels)
    return c
