"""The scheduler's spans (core/tracing.py): one per traced request, consumed to
persisted, under the API's span; one per batch, linked to all of them.

Every hook returns at once while tracing is off. Spans are started when a batch is
sent (with the times it was consumed and formed as their start) and ended when its
rows are committed or it fails, so the worker's compute span can hang under the
batch span while it runs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from confluent_kafka import Message

from core import tracing
from core.protocol import WorkBatch, WorkResult

if TYPE_CHECKING:
    from scheduler.core.batcher import Batch


def context_of(msg: Message) -> Any:
    """The trace context the API put in the message's headers (None: not traced)."""
    if not tracing.enabled():
        return None
    return tracing.context_from_headers(msg.headers())  # type: ignore[arg-type]


def sent(batch: Batch, work: WorkBatch, worker_id: str) -> WorkBatch:
    """Start the spans of a batch about to go to ``worker_id``; its WorkBatch carries
    the batch span's context to the worker."""
    if not tracing.enabled():
        return work
    traced = [p for p in batch.items if p.trace is not None]
    if not traced:
        return work
    from opentelemetry.trace import SpanKind

    tr = tracing.tracer()
    spans = [
        tr.start_span(
            "gristmill.schedule",
            context=p.trace,
            kind=SpanKind.CONSUMER,
            start_time=tracing.ns(p.consumed_at),
            attributes={
                "gristmill.request_id": p.msg.request_id,
                "gristmill.model": batch.key.ref.label(),
                "gristmill.class": p.msg.priority,
                "gristmill.batch_id": batch.batch_id,
                "gristmill.queue_s": max(0.0, p.consumed_at - p.msg.received_at),
            },
        )
        for p in traced
    ]
    batch_span = tr.start_span(
        "gristmill.batch",
        context=tracing.context_of_span(spans[0]),
        start_time=tracing.ns(batch.formed_at),
        links=[tracing.link_to(s) for s in spans],
        attributes={
            "gristmill.batch_id": batch.batch_id,
            "gristmill.model": batch.key.ref.label(),
            "gristmill.batch_size": len(batch.items),
            "gristmill.flush_reason": batch.reason,
            "gristmill.worker": worker_id,
        },
    )
    batch.trace = (batch_span, spans)
    work.traceparent = tracing.traceparent_of(batch_span)
    return work


def finished(
    batch: Batch | None, compute: tuple[float, float] | None = None, error: str | None = None
) -> None:
    """The batch's rows are committed (or it failed): end its spans. ``compute``: the
    worker's compute start and end (epoch s)."""
    if batch is None or batch.trace is None:
        return
    from opentelemetry.trace import StatusCode

    batch_span, spans = batch.trace
    batch.trace = None
    end = tracing.ns(time.time())
    for span in (*spans, batch_span):
        if compute is not None:
            span.set_attribute("gristmill.compute_s", compute[1] - compute[0])
        if error is not None:
            span.set_status(StatusCode.ERROR, error[:200])
        span.end(end_time=end)


def returned(batch: Batch, result: WorkResult) -> None:
    """A batch's result is back: a failed one's spans end here (its retries are new
    batches); a computed one's when its rows are committed (``finished``)."""
    if result.error is not None:
        finished(batch, (result.compute_start, result.compute_end), result.error)
