"""ingest/metrics.py: what one answer adds, by tier, status code and reason."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import httpx
import psycopg
from fastapi import FastAPI

from core.errors import RateLimited, Unavailable
from core.messages import RequestMessage
from core.metrics import snapshot
from core.vocab import RequestStatus
from ingest import metrics
from ingest.operations import metrics as scrape
from results.metrics import JobGauges


def added(before: dict[str, float], name: str, **labels: str) -> float:
    return snapshot(metrics.REGISTRY).get(name, **labels) - before.get(name, 0.0)


def test_refusals_are_counted_by_tier_code_and_reason() -> None:
    token = metrics.request_tier.set("free")
    try:
        snap = snapshot(metrics.REGISTRY)
        base = {
            "429": snap.get("gristmill_admission_total", tier="free", outcome="429"),
            "kafka": snap.get("gristmill_admission_total", tier="free", reason="kafka"),
            "db": snap.get("gristmill_admission_total", tier="free", reason="database"),
            "200": snap.get("gristmill_api_responses_total", tier="free", code="200"),
        }
        metrics.responded(429, RateLimited("over"))
        metrics.responded(503, Unavailable("down", reason="kafka"))
        metrics.responded(503, psycopg.OperationalError("gone"))
        metrics.responded(200, None)
        metrics.responded(422, None)  # a client's mistake: a response, not an admission outcome
        snap = snapshot(metrics.REGISTRY)
        assert snap.get("gristmill_admission_total", tier="free", outcome="429") - base["429"] == 1
        assert (
            snap.get("gristmill_admission_total", tier="free", reason="kafka") - base["kafka"] == 1
        )
        assert (
            snap.get("gristmill_admission_total", tier="free", reason="database") - base["db"] == 1
        )
        assert snap.get("gristmill_api_responses_total", tier="free", code="200") - base["200"] == 1
        assert snap.get("gristmill_admission_total", tier="free", outcome="422") == 0
    finally:
        metrics.request_tier.reset(token)
    assert metrics.request_tier.get() == "none"  # before authentication


def test_an_answer_observes_total_and_respond_only_when_it_succeeded() -> None:
    now = time.time()
    msg = RequestMessage("r", "t", "enterprise", "sim", "7", "x", {}, now + 1, now - 0.3)
    row = {
        "status": RequestStatus.SUCCEEDED,
        "persisted_at": datetime.fromtimestamp(now - 0.01, UTC),
    }
    labels = {"model": "sim", "version": "7", "class": "enterprise"}
    before = snapshot(metrics.REGISTRY)
    metrics.answered(msg, row, now)
    metrics.answered(msg, {**row, "status": RequestStatus.EXPIRED}, now)
    after = snapshot(metrics.REGISTRY)
    total = after.get("gristmill_request_duration_seconds_count", **labels) - before.get(
        "gristmill_request_duration_seconds_count", **labels
    )
    assert total == 1
    # 300 ms: inside the 0.5 s bucket, not the 0.2 s one
    assert after.get("gristmill_request_duration_seconds_bucket", le="0.5", **labels) == 1
    assert after.get("gristmill_request_duration_seconds_bucket", le="0.2", **labels) == 0
    respond = after.get("gristmill_stage_duration_seconds_sum", stage="respond", **labels)
    assert 0.009 < respond < 0.05


class _CountingEngine:
    """Stands in for the database: counts what would have queried it."""

    def __init__(self) -> None:
        self.connects = 0

    def connect(self) -> Any:
        self.connects += 1
        raise OSError("no database in a unit test")


def test_a_scrape_runs_no_query_and_serves_the_last_job_gauges() -> None:
    engine = _CountingEngine()
    app = FastAPI()
    app.include_router(scrape.router)
    app.state.gristmill = SimpleNamespace(engine=engine)

    async def scrapes(n: int) -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return [await client.get("/metrics") for _ in range(n)]

    saved = scrape._job_gauges
    scrape._job_gauges = JobGauges({"running": 3}, {"queued": 7})
    try:
        answers = asyncio.run(scrapes(50))
    finally:
        scrape._job_gauges = saved
    assert engine.connects == 0
    assert all(r.status_code == 200 for r in answers)
    assert 'gristmill_jobs{status="running"} 3.0' in answers[-1].text


def test_the_job_gauges_are_read_in_the_background_and_dropped_when_unreadable() -> None:
    engine = _CountingEngine()

    async def run_for(seconds: float) -> None:
        task = asyncio.create_task(
            scrape.job_gauges_loop(SimpleNamespace(engine=engine), interval_s=0.05)  # type: ignore[arg-type]
        )
        await asyncio.sleep(seconds)
        task.cancel()

    saved = scrape._job_gauges
    scrape._job_gauges = JobGauges({"running": 1}, {})
    try:
        asyncio.run(run_for(0.22))
        assert scrape._job_gauges is None  # unreadable: no stale numbers
    finally:
        scrape._job_gauges = saved
    assert 3 <= engine.connects <= 6


def test_re_embed_coverage_is_a_gauge_per_model_version() -> None:
    from prometheus_client import generate_latest

    gauges = JobGauges({"running": 1}, {}, {("emb", "2"): 0.375})
    text = generate_latest(scrape.api_registry(gauges)).decode()
    assert 'gristmill_version_coverage{model="emb",version="2"} 0.375' in text
