"""``GET /metrics``: the API instance's Prometheus metrics (ingest/metrics.py defines
them), and the gauges each process writes once a second.

An API instance is several uvicorn processes on one port; a scrape lands on any one of
them. In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) ``/metrics`` sums every
process's files, so a scrape sees the instance; job gauges are read from PostgreSQL
every ``JOB_GAUGES_S`` by ``job_gauges_loop``, so a scrape runs no query however often
scrapes come.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client import multiprocess as mp
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from core.metrics import multiprocess_dir
from ingest.acceptance.state import AppState
from ingest.metrics import ANSWER_DELAY, INFLIGHT, LISTENER_UP, LOOP_LAG, REGISTRY
from results.metrics import JobGauges
from results.metrics import read_job_gauges as read_gauges

log = logging.getLogger(__name__)


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
        coverage = GaugeMetricFamily(
            "gristmill_version_coverage",
            "Share of the corpora re-embedded with a model version that it has embedded "
            "(decision 68; 1 once every corpus moved)",
            labels=["model", "version"],
        )
        for (model, version), share in sorted(self.gauges.coverage.items()):
            coverage.add_metric([model, version], share)
        yield jobs
        yield items
        yield coverage


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
        async with asyncio.timeout(timeout_s):
            return await read_gauges(state.engine)
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
