"""Job-completion webhooks: signed, retried with backoff, never in the pipeline's way.

Each API instance runs this loop; ``FOR UPDATE SKIP LOCKED`` hands every due
delivery to one instance. The body is signed with HMAC-SHA256 using the job's
secret (returned once, at submission): header
``Gristmill-Signature: t=<unix seconds>,v1=<hex hmac of "<t>.<body>">``.
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

import httpx
import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from core.config import Settings

log = logging.getLogger("gristmill.ingest.webhooks")

SIGNATURE_HEADER = "Gristmill-Signature"


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


_DUE = text("""
    SELECT job_id, webhook_url, webhook_secret, webhook_attempts, tenant_id, total_items,
           succeeded, failed, expired, cancelled, cancelled_at, finished_at
    FROM jobs
    WHERE webhook_next_at <= now() AND webhook_delivered_at IS NULL
      AND webhook_url IS NOT NULL AND finished_at IS NOT NULL
    ORDER BY webhook_next_at LIMIT 10 FOR UPDATE SKIP LOCKED""")


def payload(row: Any) -> dict[str, Any]:
    status = (
        "cancelled"
        if row.cancelled_at
        else ("failed" if row.failed and not row.succeeded else "completed")
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


async def deliver_due(engine: AsyncEngine, client: httpx.AsyncClient, settings: Settings) -> int:
    """One pass: deliver what is due. Returns how many deliveries were attempted."""
    async with engine.begin() as conn:
        rows = (await conn.execute(_DUE)).all()
        for row in rows:
            body = orjson.dumps(payload(row))
            error = None
            try:
                r = await client.post(
                    row.webhook_url,
                    content=body,
                    headers={
                        "Content-Type": "application/json",
                        SIGNATURE_HEADER: sign(row.webhook_secret, body, int(time.time())),
                    },
                )
                if r.status_code >= 300:
                    error = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                error = repr(exc)
            attempts = row.webhook_attempts + 1
            if error is None:
                await conn.execute(
                    text(
                        "UPDATE jobs SET webhook_delivered_at = now(), webhook_attempts = :a, "
                        "webhook_error = NULL, webhook_next_at = NULL WHERE job_id = :j"
                    ),
                    {"a": attempts, "j": row.job_id},
                )
            else:
                give_up = attempts >= settings.webhook_max_attempts
                nxt = (
                    None
                    if give_up
                    else datetime.now(UTC) + timedelta(seconds=next_delay_s(attempts))
                )
                await conn.execute(
                    text(
                        "UPDATE jobs SET webhook_attempts = :a, webhook_error = :e, "
                        "webhook_next_at = :n WHERE job_id = :j"
                    ),
                    {
                        "a": attempts,
                        "e": error + (" (gave up)" if give_up else ""),
                        "n": nxt,
                        "j": row.job_id,
                    },
                )
                log.warning(
                    "webhook for job %s failed (%s), attempt %d", row.job_id, error, attempts
                )
        return len(rows)


async def webhook_loop(engine: AsyncEngine, settings: Settings, interval_s: float = 1.0) -> None:
    async with httpx.AsyncClient(timeout=settings.webhook_timeout_s) as client:
        while True:
            try:
                await deliver_due(engine, client, settings)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("webhook pass failed: %s", exc)
            await asyncio.sleep(interval_s)
