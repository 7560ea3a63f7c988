"""Traces: W3C trace context through every stage, exported by OTLP/HTTP when asked.

Off unless ``otlp_traces_endpoint`` is set: then nothing of OpenTelemetry is even
imported, and every hook in the stages is one test of a module flag. On, each
process exports its spans in the background (OpenTelemetry SDK, batch processor,
OTLP over HTTP with protobuf), tagged with its service name:

* the API (``gristmill-api``) continues the caller's ``traceparent`` (or starts a
  trace) with a span for ``POST /v1/infer`` and puts its context in the Kafka
  message's headers (ingest/edge/tracing.py);
* the scheduler (``gristmill-scheduler``) continues it with a span per request
  from consumed to persisted, and a span per batch that links to the spans of
  all its requests; the batch span's parent is its first traced request, so that
  request's trace also holds the batch and its compute (scheduler/runtime/tracing.py);
* the worker (``gristmill-worker``) adds the batch's compute span under the batch
  span, whose context travels in the WorkBatch (workers/tracing.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from core.kafka import KafkaHeaders

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from core.config import ObservabilitySettings

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# How often a process ships its finished spans (ms): short enough that a trace is
# complete in the collector a second or two after the request.
EXPORT_EVERY_MS = 1000

_tracer: Tracer | None = None
_provider: TracerProvider | None = None


def setup(settings: ObservabilitySettings, service: str) -> bool:
    """Start exporting this process's spans, if an endpoint is configured."""
    global _tracer, _provider
    if not settings.otlp_traces_endpoint or _tracer is not None:
        return _tracer is not None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(
        resource=Resource.create({"service.name": service}),
        sampler=ParentBased(TraceIdRatioBased(settings.trace_sample_ratio)),
    )
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=settings.otlp_traces_endpoint),
            schedule_delay_millis=EXPORT_EVERY_MS,
        )
    )
    _provider = provider
    _tracer = provider.get_tracer("gristmill")
    log.info("tracing on: %s spans to %s", service, settings.otlp_traces_endpoint)
    return True


def enabled() -> bool:
    return _tracer is not None


def tracer() -> Tracer:
    assert _tracer is not None, "tracing is off"
    return _tracer


def shutdown() -> None:
    """Ship what is buffered (at a process's orderly end)."""
    if _provider is not None:
        _provider.shutdown()


def ns(epoch_s: float) -> int:
    """OpenTelemetry's timestamps: integer nanoseconds since the epoch."""
    return int(epoch_s * 1e9)


def headers() -> KafkaHeaders | None:
    """The current span's context as Kafka message headers (None while tracing is off)."""
    if _tracer is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return [(k, v.encode()) for k, v in carrier.items()] or None


def context_from(carrier: dict[str, str]) -> Context | None:
    """The remote context in ``carrier`` (``traceparent``, ``tracestate``), if valid."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    ctx = TraceContextTextMapPropagator().extract(carrier)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def context_from_headers(raw: list[tuple[str, bytes | None]] | None) -> Context | None:
    if not raw:
        return None
    carrier = {k: v.decode("latin-1") for k, v in raw if k in (TRACEPARENT, TRACESTATE) and v}
    return context_from(carrier) if TRACEPARENT in carrier else None


def context_of_span(span: Span) -> Context:
    from opentelemetry import trace

    return trace.set_span_in_context(span)


def traceparent_of(span: Span) -> str:
    sc = span.get_span_context()
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


def link_to(span: Span) -> Any:
    from opentelemetry.trace import Link

    return Link(span.get_span_context())
