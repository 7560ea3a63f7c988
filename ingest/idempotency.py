"""Idempotency-Key handling (after the IETF httpapi Idempotency-Key draft).

The request id is derived from (tenant, key), so every retry names the same
result row. The key is also claimed in PostgreSQL with a fingerprint of the
body: the same key with another body is a 422; the same body is a retry that
gets the first answer (waiting for it if it is still in flight).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from core.errors import IdempotencyConflict
from results.db import ts
from results.schema import idempotency_keys

MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class Claim:
    first: bool  # this call is the first with the key
    first_deadline: datetime | None = None  # when the first attempt's caller gave up
    # When the first attempt was received: a resend carries it, so the request keeps
    # one row (the request log's key includes received_at). None: an old claim.
    first_received: datetime | None = None


async def claim(
    engine: AsyncEngine,
    *,
    tenant_id: str,
    key: str,
    request_id: str,
    body_hash: str,
    deadline: float,
    received: float,
) -> Claim:
    stmt = (
        insert(idempotency_keys)
        .values(
            tenant_id=tenant_id,
            key=key,
            request_id=request_id,
            body_hash=body_hash,
            deadline_at=ts(deadline),
            received_at=ts(received),
        )
        .on_conflict_do_nothing()
        .returning(idempotency_keys.c.request_id)
    )
    async with engine.begin() as conn:
        if (await conn.execute(stmt)).first() is not None:
            return Claim(first=True)
        row = (
            await conn.execute(
                select(
                    idempotency_keys.c.body_hash,
                    idempotency_keys.c.deadline_at,
                    idempotency_keys.c.received_at,
                ).where(idempotency_keys.c.tenant_id == tenant_id, idempotency_keys.c.key == key)
            )
        ).one()
    if row.body_hash != body_hash:
        raise IdempotencyConflict(
            "Idempotency-Key was already used with a different request body",
            field="Idempotency-Key",
        )
    return Claim(first=False, first_deadline=row.deadline_at, first_received=row.received_at)


async def expire_old(engine: AsyncEngine, ttl_h: int) -> int:
    """Keys are kept at least ``ttl_h`` hours; older ones may be reused."""
    async with engine.begin() as conn:
        res = await conn.execute(
            delete(idempotency_keys).where(
                idempotency_keys.c.created_at < func.now() - func.make_interval(0, 0, 0, 0, ttl_h)
            )
        )
        return int(res.rowcount or 0)
