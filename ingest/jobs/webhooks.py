"""Job-completion webhooks: signed, retried with backoff, never in the pipeline's way.

Each API instance runs ``webhook_loop``. A pass claims due deliveries under a lease
(results/webhooks.py: each goes to one instance), delivers them concurrently with no
database transaction open, and records each outcome as a status class. The body is
signed with HMAC-SHA256 using the job's secret (returned once, at submission):
header ``Gristmill-Signature: t=<unix seconds>,v1=<hex hmac of "<t>.<body>">``.
Where a webhook may go, and how one is sent: decision 27, ingest/jobs/destinations.py,
ingest/jobs/webhook_client.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpcore
import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from core.config import Settings
from core.vocab import JobStatus
from ingest.jobs import webhook_client
from ingest.jobs.destinations import AllowList
from results import webhooks as store

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "Gristmill-Signature"
# A receiver's answer is never used; reading a little of it lets the connection end
# cleanly, and nothing a receiver sends can fill our memory.
MAX_RESPONSE_BYTES = 64 * 1024
# A claim outlives the delivery's deadline by this much (seconds), the time to record
# the outcome, so no other instance claims a delivery still under way.
LEASE_MARGIN_S = 5.0
# Deliveries claimed per pass and instance (each runs concurrently, within its deadline).
CLAIM_BATCH = 10


def sign(secret: str, body: bytes, ts: int) -> str:
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}"


def verify(secret: str, body: bytes, header: str, *, tolerance_s: int = 300) -> bool:
    """What a receiver does: check the signature and that it is recent."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        ts = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - ts) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, body, ts), header)


def next_delay_s(attempt: int, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter for the ``attempt``-th failed delivery. The
    schedule lives in PostgreSQL (webhook_next_at), not in a sleeping coroutine, so
    it survives API restarts and any instance can make the next attempt."""
    cap = min(300.0, 2.0**attempt)
    return (rng or random).uniform(cap / 2, cap)


def payload(row: Any) -> dict[str, Any]:
    status = (
        JobStatus.CANCELLED
        if row.cancelled_at
        else (JobStatus.FAILED if row.failed and not row.succeeded else JobStatus.COMPLETED)
    )
    return {
        "type": "job.finished",
        "job_id": str(row.job_id),
        "status": status,
        "counts": {
            "total": row.total_items,
            "succeeded": row.succeeded,
            "failed": row.failed,
            "expired": row.expired,
            "cancelled": row.cancelled,
        },
        "finished_at": row.finished_at.isoformat(),
    }


async def deliver_one(
    engine: AsyncEngine, pool: httpcore.AsyncConnectionPool, settings: Settings, row: Any
) -> str | None:
    """Send one claimed delivery and record its outcome; returns the failure class."""
    body = orjson.dumps(payload(row))
    error = await webhook_client.post(
        pool,
        row.webhook_url,
        body,
        {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(row.webhook_secret, body, int(time.time())),
        },
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
