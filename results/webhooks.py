"""Webhook deliveries: claimed under a lease, delivered with no transaction open,
then recorded.

A claim moves ``webhook_next_at`` past the lease and counts the attempt, in one short
transaction (``FOR UPDATE SKIP LOCKED``: each due delivery goes to one instance).
The attempt number is the claim's fencing token: the outcome is recorded only while
the job still holds that attempt, so a delivery that outlived its lease (and was
claimed again elsewhere), or a job retried meanwhile, cannot overwrite newer state.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncEngine

_CLAIM = text("""
    UPDATE jobs SET webhook_next_at = now() + make_interval(secs => :lease_s),
                    webhook_attempts = webhook_attempts + 1
    WHERE job_id = ANY(ARRAY(
        SELECT job_id FROM jobs
        WHERE webhook_next_at <= now() AND webhook_delivered_at IS NULL
          AND webhook_url IS NOT NULL AND finished_at IS NOT NULL
        ORDER BY webhook_next_at LIMIT :n FOR UPDATE SKIP LOCKED))
    RETURNING job_id, webhook_url, webhook_secret, webhook_attempts, total_items,
              succeeded, failed, expired, cancelled, cancelled_at, finished_at,
              started_at, expires_at,
              (SELECT b.batch_id FROM openai_batches b WHERE b.job_id = jobs.job_id)
                AS batch_id""")


async def claim_due(engine: AsyncEngine, lease_s: float, limit: int) -> list[Row[Any]]:
    """Up to ``limit`` due deliveries, leased for ``lease_s`` seconds to this caller."""
    async with engine.begin() as conn:
        return list((await conn.execute(_CLAIM, {"lease_s": lease_s, "n": limit})).all())


async def record_delivered(engine: AsyncEngine, job_id: str, attempt: int) -> bool:
    async with engine.begin() as conn:
        res = await conn.execute(
            text(
                "UPDATE jobs SET webhook_delivered_at = now(), webhook_error = NULL, "
                "webhook_next_at = NULL WHERE job_id = :j AND webhook_attempts = :a "
                "AND webhook_delivered_at IS NULL"
            ),
            {"j": job_id, "a": attempt},
        )
        return bool(res.rowcount)


async def record_failed(
    engine: AsyncEngine, job_id: str, attempt: int, error: str, next_at: datetime | None
) -> bool:
    """Record a failed attempt's status class; ``next_at`` None: no more attempts."""
    async with engine.begin() as conn:
        res = await conn.execute(
            text(
                "UPDATE jobs SET webhook_error = :e, webhook_next_at = :n "
                "WHERE job_id = :j AND webhook_attempts = :a AND webhook_delivered_at IS NULL"
            ),
            {"j": job_id, "a": attempt, "e": error, "n": next_at},
        )
        return bool(res.rowcount)
