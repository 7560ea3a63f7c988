"""The API's Prometheus metrics, defined beside what they measure (served by
ingest/operations/metrics.py).

An API instance is several uvicorn processes on one port; a scrape lands on any
one of them. Each process writes its values to files in the directory that whoever
started the processes named in ``PROMETHEUS_MULTIPROC_DIR`` (gristmill/cli/main.py
``api``, gristmill/devservices/stack.py) and emptied first; ``/metrics`` sums
them all (prometheus_client's multiprocess mode), so a scrape sees the instance.
Without that variable (one process, tests) the values live in this process.

Per request the hot path does a few counter increments and histogram observations
on label children cached here (no label lookup per request). The gauges (event-loop
lag, answer delay, in-flight requests) are written once a second by ``publish_loop``,
not per request (ingest/operations/metrics.py); job gauges are read from PostgreSQL every
``JOB_GAUGES_S`` by ``job_gauges_loop`` there, so a scrape runs no query however often
scrapes come.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from functools import partial
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

from core.errors import GristmillError
from core.messages import RequestMessage
from core.metrics import LATENCY_BUCKETS, snapshot, stage_histogram
from core.metrics_window import API_SERIES, MetricsWindow
from core.vocab import RequestStatus
from ingest.edge.http import DATABASE_ERRORS  # the one list of what means "database down"

REGISTRY = CollectorRegistry()
# Every metric of the API in its registry; latencies in the stages' buckets.
_counter = partial(Counter, registry=REGISTRY)
_latency = partial(Histogram, buckets=LATENCY_BUCKETS, registry=REGISTRY)
_gauge = partial(Gauge, registry=REGISTRY)

ADMISSION = _counter(
    "gristmill_admission_total",
    "Sync requests by what admission made of them: admitted (durable in Kafka), or "
    "refused with 429 / 503, or answered 504; by tier and reason",
    ["tier", "outcome", "reason"],
)
RESPONSES = _counter(
    "gristmill_api_responses_total",
    "Answers to POST /v1/infer by tier (none: before authentication) and status code",
    ["tier", "code"],
)
REQUEST_SECONDS = _latency(
    "gristmill_request_duration_seconds",
    "Sync requests answered 200: API received -> answer sent",
    ["model", "version", "class"],
)
STAGE_SECONDS = stage_histogram(REGISTRY)  # the API observes stage="respond"
PRODUCE_SECONDS = _latency(
    "gristmill_kafka_produce_duration_seconds",
    "Time for Kafka to acknowledge a produced request (acks=all)",
    ["client"],
)
PRODUCE_ERRORS = _counter(
    "gristmill_kafka_produce_errors_total",
    "Messages Kafka did not take (the request was answered 503), by client and error",
    ["client", "reason"],
)
JOBS_SUBMITTED = _counter("gristmill_jobs_submitted_total", "Jobs accepted (202) by tier", ["tier"])
JOB_ITEMS_SUBMITTED = _counter(
    "gristmill_job_items_submitted_total",
    "Items of accepted jobs by tier",
    ["tier"],
)
JOB_SUBMIT_SECONDS = Histogram(
    "gristmill_job_submit_seconds",
    "POST /v1/jobs by phase: stage (body read and validated into a temp file), record "
    "(the COPY, budget and job row, one transaction), publish (every item into Kafka)",
    ["phase"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320),
    registry=REGISTRY,
)
# The OpenTelemetry GenAI conventions' model-server metrics (decision 59), named as the
# OpenTelemetry-to-Prometheus translation names them: dots become underscores and the
# unit "s" a "_seconds" suffix (a "{token}" annotation adds none); the buckets are the
# conventions' advised boundaries. Labels come from the model registry (acceptance/genai.py).
GENAI_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                          20.48, 40.96, 81.92)  # fmt: skip
GENAI_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                      2.5, 5.0, 7.5, 10.0)  # fmt: skip
GENAI_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
GENAI_LABELS = ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model",
                "gen_ai_response_model"]  # fmt: skip
GENAI_DURATION = Histogram(
    "gen_ai_server_request_duration_seconds",
    "gen_ai.server.request.duration: API received -> last byte of the answer (a stream's "
    "end), by operation and model; error_type names a failure (empty: succeeded)",
    [*GENAI_LABELS, "error_type"],
    buckets=GENAI_DURATION_BUCKETS,
    registry=REGISTRY,
)
GENAI_TOKENS = Histogram(
    "gen_ai_server_token_usage",
    "Tokens per succeeded request by gen_ai_token_type (input, output), where they are "
    "known: a generation's prompt and completion, the inputs the API tokenized itself "
    "(the shape of gen_ai.client.token.usage, measured at the server)",
    [*GENAI_LABELS, "gen_ai_token_type"],
    buckets=GENAI_TOKEN_BUCKETS,
    registry=REGISTRY,
)
GENAI_TTFT = Histogram(
    "gen_ai_server_time_to_first_token_seconds",
    "gen_ai.server.time_to_first_token: API received -> first token sent, streamed completions",
    GENAI_LABELS,
    buckets=GENAI_TTFT_BUCKETS,
    registry=REGISTRY,
)
# Written once a second by each process; "livemax"/"livesum" across the live processes.
LOOP_LAG = _gauge(
    "gristmill_api_event_loop_lag_seconds",
    "How late the event loop runs a timer, smoothed (the worst process of the instance)",
    multiprocess_mode="livemax",
)
ANSWER_DELAY = _gauge(
    "gristmill_api_answer_delay_seconds",
    "Result committed -> answer sent, smoothed (the worst process of the instance)",
    multiprocess_mode="livemax",
)
INFLIGHT = _gauge(
    "gristmill_api_inflight_requests",
    "Sync requests the instance holds now",
    multiprocess_mode="livesum",
)
LISTENER_UP = _gauge(
    "gristmill_api_result_listener_up",
    "1 while every process listens for results (LISTEN/NOTIFY); 0: answers wait for polls",
    multiprocess_mode="livemin",
)

# The tier of the request this task serves, set once it is authenticated.
request_tier: ContextVar[str] = ContextVar("gristmill_request_tier", default="none")

_admitted: dict[str, Any] = {}
_responses: dict[tuple[str, int], Any] = {}
_timing: dict[tuple[str, str, str], tuple[Any, Any]] = {}
_produce = PRODUCE_SECONDS.labels("api")


def admitted(tier: str) -> None:
    """The request is durable in Kafka."""
    c = _admitted.get(tier)
    if c is None:
        c = _admitted[tier] = ADMISSION.labels(tier, "admitted", "")
    c.inc()


def reason_of(error: BaseException | None) -> str:
    if error is None:
        return ""
    if isinstance(error, GristmillError):
        return error.reason
    return "database" if isinstance(error, DATABASE_ERRORS) else "internal"


def responded(code: int, error: BaseException | None) -> None:
    """An answer to POST /v1/infer left (``error``: what it answers, if not 200)."""
    tier = request_tier.get()
    c = _responses.get((tier, code))
    if c is None:
        c = _responses[(tier, code)] = RESPONSES.labels(tier, str(code))
    c.inc()
    if code in (429, 503, 504):
        ADMISSION.labels(tier, str(code), reason_of(error)).inc()


def refused(tier: str, error: GristmillError) -> None:
    """A refusal outside /v1/infer's answer path (a completion refused for KV capacity)."""
    ADMISSION.labels(tier, str(error.status), error.reason).inc()


def answered(msg: RequestMessage, row: Mapping[str, Any], now: float) -> None:
    """A sync result reached its caller: the respond stage and the whole request."""
    if row["status"] != RequestStatus.SUCCEEDED:
        return  # expired or failed: counted by its status code in ``responded``
    key = (msg.model, msg.version, msg.priority)
    pair = _timing.get(key)
    if pair is None:
        pair = _timing[key] = (
            REQUEST_SECONDS.labels(*key),
            STAGE_SECONDS.labels("respond", *key),
        )
    pair[0].observe(now - msg.received_at)
    persisted = row.get("persisted_at")
    if persisted is not None:
        pair[1].observe(max(0.0, now - persisted.timestamp()))


_genai_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Histogram, labels: tuple[str, ...]) -> Any:
    key = (metric, *labels)
    c = _genai_children.get(key)
    if c is None:
        c = _genai_children[key] = metric.labels(*labels)
    return c


def genai_duration(labels: tuple[str, ...], error_type: str, seconds: float) -> None:
    _child(GENAI_DURATION, (*labels, error_type)).observe(max(0.0, seconds))


def genai_tokens(labels: tuple[str, ...], input_: int | None, output: int | None) -> None:
    if input_ is not None:
        _child(GENAI_TOKENS, (*labels, "input")).observe(input_)
    if output is not None:
        _child(GENAI_TOKENS, (*labels, "output")).observe(output)


def genai_first_token(labels: tuple[str, ...], seconds: float) -> None:
    _child(GENAI_TTFT, labels).observe(max(0.0, seconds))


def produced(seconds: float) -> None:
    _produce.observe(seconds)


def produce_failed(reason: str) -> None:
    PRODUCE_ERRORS.labels("api", reason).inc()


def job_phase(phase: str, seconds: float) -> None:
    JOB_SUBMIT_SECONDS.labels(phase).observe(seconds)


def job_submitted(tier: str, items: int) -> None:
    JOBS_SUBMITTED.labels(tier).inc()
    JOB_ITEMS_SUBMITTED.labels(tier).inc(items)


# ---- published for the dashboard -------------------------------------------------------
_window = MetricsWindow(API_SERIES)


def window(now: float) -> dict[str, Any]:
    """This process's metrics window (core/metrics_window.py), published once a second
    beside its heartbeat. This process's own values, also in multiprocess mode (each
    process publishes its row; the dashboard sums the rows)."""
    return _window.publish(now, snapshot(REGISTRY))
