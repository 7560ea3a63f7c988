"""The scheduler's metrics written where things happen: a batch back from its worker,
rows committed, an offset commit, a generation step. Each is a few dictionary lookups
(``_child`` caches the labelled series): they run on the hot path."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from core.metrics import observe_many
from core.protocol import WorkResult
from core.request_row import RequestRow
from core.vocab import ModelRef
from scheduler.runtime import tracing
from scheduler.runtime.metrics.families import (
    BATCH_FAILURES,
    BATCH_FILL,
    BATCH_SIZE,
    BATCHES,
    COMMIT_ERRORS,
    COMMIT_SECONDS,
    DEAD_LETTERS,
    FINISHED,
    GEN_KV_USED,
    GEN_PREEMPTIONS,
    GEN_STEP,
    GEN_TOKENS,
    GEN_TTFT,
    PERSIST_MERGED,
    PERSIST_RETRIES,
    PERSIST_SECONDS,
    PRODUCE_ERRORS,
    SCHEDULER_STAGES,
    STAGE_SECONDS,
    WORKER_BUSY,
    _child,
)

if TYPE_CHECKING:
    from scheduler.core.batcher import Batch, Pending

T = TypeVar("T")


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
