"""The API's Prometheus metrics and its ``GET /metrics``.

An API instance is several uvicorn processes on one port; a scrape lands on any
one of them. Each process writes its values to files in the directory that whoever
started the processes named in ``PROMETHEUS_MULTIPROC_DIR`` (gristmill/cli/main.py
``api``, gristmill/devservices/stack.py) and emptied first; ``/metrics`` sums
them all (prometheus_client's multiprocess mode), so a scrape sees the instance.
Without that variable (one process, tests) the values live in this process.

Per request the hot path does a few counter increments and histogram observations
on label children cached here (no label lookup per request). The gauges (event-loop
lag, answer delay, in-flight requests) are written once a second by ``publish_loop``,
not per request; job gauges are read from PostgreSQL every ``JOB_GAUGES_S`` by
``job_gauges_loop``, so a scrape runs no query however often scrapes come.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as mp
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from core.errors import GristmillError
from core.messages import RequestMessage
from core.metrics import LATENCY_BUCKETS, multiprocess_dir, snapshot, stage_histogram
from core.metrics_window import API_SERIES, MetricsWindow
from core.vocab import RequestStatus
from ingest.http import DATABASE_ERRORS  # the one list of what means "database down"
from results.metrics import JobGauges, job_gauges_of, job_gauges_stmt

if TYPE_CHECKING:
    from ingest.state import AppState

log = logging.getLogger("gristmill.ingest.metrics")

REGISTRY = CollectorRegistry()

ADMISSION = Counter(
    "gristmill_admission_total",
    "Sync requests by what admission made of them: admitted (durable in Kafka), or "
    "refused with 429 / 503, or answered 504; by tier and reason",
    ["tier", "outcome", "reason"],
    registry=REGISTRY,
)
RESPONSES = Counter(
    "gristmill_api_responses_total",
    "Answers to POST /v1/infer by tier (none: before authentication) and status code",
    ["tier", "code"],
    registry=REGISTRY,
)
REQUEST_SECONDS = Histogram(
    "gristmill_request_duration_seconds",
    "Sync requests answered 200: API received -> answer sent",
    ["model", "version", "class"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
STAGE_SECONDS = stage_histogram(REGISTRY)  # the API observes stage="respond"
PRODUCE_SECONDS = Histogram(
    "gristmill_kafka_produce_duration_seconds",
    "Time for Kafka to acknowledge a produced request (acks=all)",
    ["client"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
PRODUCE_ERRORS = Counter(
    "gristmill_kafka_produce_errors_total",
    "Messages Kafka did not take (the request was answered 503), by client and error",
    ["client", "reason"],
    registry=REGISTRY,
)
JOBS_SUBMITTED = Counter(
    "gristmill_jobs_submitted_total", "Jobs accepted (202) by tier", ["tier"], registry=REGISTRY
)
JOB_ITEMS_SUBMITTED = Counter(
    "gristmill_job_items_submitted_total",
    "Items of accepted jobs by tier",
    ["tier"],
    registry=REGISTRY,
)
JOB_SUBMIT_SECONDS = Histogram(
    "gristmill_job_submit_seconds",
    "POST /v1/jobs by phase: stage (body read and validated into a temp file), record "
    "(the COPY, budget and job row, one transaction), publish (every item into Kafka)",
    ["phase"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320),
    registry=REGISTRY,
)
# Written once a second by each process; "livemax"/"livesum" across the live processes.
LOOP_LAG = Gauge(
    "gristmill_api_event_loop_lag_seconds",
    "How late the event loop runs a timer, smoothed (the worst process of the instance)",
    registry=REGISTRY,
    multiprocess_mode="livemax",
)
ANSWER_DELAY = Gauge(
    "gristmill_api_answer_delay_seconds",
    "Result committed -> answer sent, smoothed (the worst process of the instance)",
    registry=REGISTRY,
    multiprocess_mode="livemax",
)
INFLIGHT = Gauge(
    "gristmill_api_inflight_requests",
    "Sync requests the instance holds now",
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
LISTENER_UP = Gauge(
    "gristmill_api_result_listener_up",
    "1 while every process listens for results (LISTEN/NOTIFY); 0: answers wait for polls",
    registry=REGISTRY,
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


def answered(msg: RequestMessage, row: dict[str, Any], now: float) -> None:
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


# ---- gauges --------------------------------------------------------------------------
async def publish_loop(state: AppState, interval_s: float = 1.0) -> None:
    """This process's gauges, once a second; on cancel (shutdown) its live gauges go."""
    try:
        while True:
            LOOP_LAG.set(state.overload.lag.lag_ms / 1000)
            ANSWER_DELAY.set(state.overload.answer.ms() / 1000)
            INFLIGHT.set(state.inflight.inflight)
            LISTENER_UP.set(1 if state.waiter.listening.is_set() else 0)
            await asyncio.sleep(interval_s)
    finally:
        path = multiprocess_dir()
        if path is not None:
            with contextlib.suppress(OSError):
                mp.mark_process_dead(os.getpid(), path)


class _JobsCollector(Collector):
    """Unfinished jobs and their items, as read from PostgreSQL for this scrape."""

    def __init__(self, gauges: JobGauges | None):
        self.gauges = gauges

    def collect(self) -> Any:
        if self.gauges is None:
            return
        jobs = GaugeMetricFamily(
            "gristmill_jobs", "Jobs not finished yet, by status", labels=["status"]
        )
        for status, n in self.gauges.jobs.items():
            jobs.add_metric([status], n)
        items = GaugeMetricFamily(
            "gristmill_job_items",
            "Items of the jobs not finished yet: queued (no result yet) or done, by status",
            labels=["status"],
        )
        for status, n in self.gauges.items.items():
            items.add_metric([status], n)
        yield jobs
        yield items


def api_registry(jobs: JobGauges | None = None) -> CollectorRegistry:
    """Every value of this API instance: all its processes' files in multiprocess mode,
    else this process's registry (plus the job gauges, when read)."""
    path = multiprocess_dir()
    if path is None:
        if jobs is None:
            return REGISTRY
        reg = CollectorRegistry()
        reg.register(_Forward(REGISTRY))
    else:
        reg = CollectorRegistry()
        mp.MultiProcessCollector(reg, path)
    reg.register(_JobsCollector(jobs))
    return reg


class _Forward(Collector):
    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def collect(self) -> Any:
        return self.registry.collect()


async def read_job_gauges(state: AppState, timeout_s: float = 2.0) -> JobGauges | None:
    try:
        async with asyncio.timeout(timeout_s), state.engine.connect() as conn:
            return job_gauges_of((await conn.execute(job_gauges_stmt())).one())
    except Exception as exc:  # the database away: the rest of the scrape still answers
        log.warning("job gauges unavailable: %s", exc)
        return None


# How often each API process reads the job gauges (s): a scrape serves the last reading
# (Prometheus scrapes every 15-60 s), so the gauges are at most this old.
JOB_GAUGES_S = 10.0
_job_gauges: JobGauges | None = None  # this process's last reading; None: none yet, or failed


async def job_gauges_loop(state: AppState, interval_s: float = JOB_GAUGES_S) -> None:
    global _job_gauges
    while True:
        _job_gauges = await read_job_gauges(state)  # None (no gauges) while unreadable
        await asyncio.sleep(interval_s)


router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics() -> Response:
    # Reading every process's files is file I/O and parsing: off the event loop.
    body = await asyncio.to_thread(generate_latest, api_registry(_job_gauges))
    return Response(body, media_type=CONTENT_TYPE_LATEST)
