"""The worker's span: one per traced batch, its compute, under the scheduler's batch
span (core/tracing.py). Nothing while tracing is off or the batch carries no context."""

from __future__ import annotations

from core import tracing
from core.protocol import WorkBatch, WorkResult


def computed(batch: WorkBatch, result: WorkResult) -> None:
    if batch.traceparent is None or not tracing.enabled():
        return
    from opentelemetry.trace import StatusCode

    parent = tracing.context_from({tracing.TRACEPARENT: batch.traceparent})
    span = tracing.tracer().start_span(
        "gristmill.compute",
        context=parent,
        start_time=tracing.ns(result.compute_start),
        attributes={
            "gristmill.batch_id": batch.batch_id,
            "gristmill.model": f"{batch.model}@{batch.version}",
            "gristmill.batch_size": len(batch.inputs),
        },
    )
    if result.error is not None:
        span.set_status(StatusCode.ERROR, result.error[:200])
    span.end(end_time=tracing.ns(result.compute_end))
