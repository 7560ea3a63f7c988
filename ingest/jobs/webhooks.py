"""Job-completion webhooks: signed, retried with backoff, never in the pipeline's way.

Each API instance runs ``webhook_loop``. A pass claims due deliveries under a lease
(results/webhooks.py: each goes to one instance), delivers them concurrently with no
database transaction open, and records each outcome as a status class. The body is
signed by the Standard Webhooks specification with the job's secret (returned once, at
submission); what it carries and how it is signed: ingest/jobs/webhook_events.py,
decision 53.
Where a webhook may go, and how one is sent: decision 27, ingest/jobs/destinations.py,
ingest/jobs/webhook_client.py.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpcore
import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from core.config import Settings
from ingest.jobs import webhook_client
from ingest.jobs import webhook_events as events
from ingest.jobs.destinations import AllowList
from results import webhooks as store
from results.jobs import job_status

log = logging.getLogger(__name__)

# A receiver's answer is never used; reading a little of it lets the connection end
# cleanly, and nothing a receiver sends can fill our memory.
MAX_RESPONSE_BYTES = 64 * 1024
# A claim outlives the delivery's deadline by this much (seconds), the time to record
# the outcome, so no other instance claims a delivery still under way.
LEASE_MARGIN_S = 5.0
# Deliveries claimed per pass and instance (each runs concurrently, within its deadline).
CLAIM_BATCH = 10


def next_delay_s(attempt: int, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter for the ``attempt``-th failed delivery. The
    schedule lives in PostgreSQL (webhook_next_at), not in a sleeping coroutine, so
    it survives API restarts and any instance can make the next attempt."""
    cap = min(300.0, 2.0**attempt)
    return (rng or random).uniform(cap / 2, cap)


def event(row: Any, now: datetime) -> tuple[str, dict[str, Any]]:
    """The claimed job's terminal event: its id and body (ingest/jobs/webhook_events.py)."""
    job_id = str(row.job_id)
    status = job_status(row, now)
    if row.batch_id is not None:
        return events.event_id(job_id), events.batch_event(
            job_id, row.batch_id, status, row.finished_at
        )
    counts = {
        "total": row.total_items,
        "succeeded": row.succeeded,
        "failed": row.failed,
        "expired": row.expired,
        "cancelled": row.cancelled,
    }
    return events.event_id(job_id), events.job_event(job_id, status, counts, row.finished_at)


async def deliver_one(
    engine: AsyncEngine, pool: httpcore.AsyncConnectionPool, settings: Settings, row: Any
) -> str | None:
    """Send one claimed delivery and record its outcome; returns the failure class."""
    msg_id, content = event(row, datetime.now(UTC))
    body = orjson.dumps(content)
    error = await webhook_client.post(
        pool,
        row.webhook_url,
        body,
        events.headers(row.webhook_secret, msg_id, int(time.time()), body),
        deadline_s=settings.webhook_timeout_s,
        max_response_bytes=MAX_RESPONSE_BYTES,
    )
    attempt = int(row.webhook_attempts)
    if error is None:
        await store.record_delivered(engine, str(row.job_id), attempt)
        return None
    give_up = attempt >= settings.webhook_max_attempts
    nxt = None if give_up else datetime.now(UTC) + timedelta(seconds=next_delay_s(attempt))
    await store.record_failed(engine, str(row.job_id), attempt, error, nxt)
    log.info("webhook for job %s failed (%s), attempt %d", row.job_id, error, attempt)
    return error


async def deliver_due(
    engine: AsyncEngine, pool: httpcore.AsyncConnectionPool, settings: Settings
) -> int:
    """One pass: claim what is due and deliver it. Returns how many were attempted."""
    rows = await store.claim_due(engine, settings.webhook_timeout_s + LEASE_MARGIN_S, CLAIM_BATCH)
    if rows:
        await asyncio.gather(*(deliver_one(engine, pool, settings, r) for r in rows))
    return len(rows)


async def webhook_loop(engine: AsyncEngine, settings: Settings, interval_s: float = 1.0) -> None:
    async with webhook_client.new_pool(AllowList.parse(settings.webhook_allow_networks)) as pool:
        while True:
            try:
                await deliver_due(engine, pool, settings)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("webhook pass failed: %s", exc)
            await asyncio.sleep(interval_s)
