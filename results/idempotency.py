"""Idempotency-Key claims for sync requests. The sweeper (results/sweeper.py) expires
them, and the keys of jobs, after their time to live."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


@dataclass(frozen=True)
class KeyClaim:
    first: bool  # the key was free (never used, or expired): this call owns it now
    request_id: str  # the request the key names: this call's, or the first one's
    body_hash: str
    deadline_at: datetime  # when the first attempt's caller gave up
    # When the first attempt was received (the request log's partition key); None for
    # a claim made before the column existed.
    received_at: datetime | None
    # The version the first attempt was routed to; None for a claim made before the
    # column existed.
    model_version: str | None = None


# A key older than its time to live is taken over as if it were free: a reused key
# after expiry is a new request (with a new request id), whether or not the sweeper
# has deleted the old claim yet.
_CLAIM = text("""
    INSERT INTO idempotency_keys
        (tenant_id, key, request_id, body_hash, deadline_at, received_at, model_version)
    VALUES (:t, :k, :rid, :h, :deadline, :received, :version)
    ON CONFLICT (tenant_id, key) DO UPDATE
        SET request_id = EXCLUDED.request_id, body_hash = EXCLUDED.body_hash,
            deadline_at = EXCLUDED.deadline_at, received_at = EXCLUDED.received_at,
            model_version = EXCLUDED.model_version, created_at = now()
        WHERE idempotency_keys.created_at < now() - make_interval(secs => :ttl_s)
    RETURNING request_id""")

_EXISTING = text(
    "SELECT request_id, body_hash, deadline_at, received_at, model_version "
    "FROM idempotency_keys WHERE tenant_id = :t AND key = :k"
)


async def claim_key(
    engine: AsyncEngine,
    *,
    tenant_id: str,
    key: str,
    request_id: str,
    body_hash: str,
    deadline_at: datetime,
    received_at: datetime,
    ttl_h: float,
    model_version: str,
) -> KeyClaim:
    """Claim ``key`` for ``request_id`` (routed to ``model_version``), or return the
    claim that holds it."""
    params = {
        "t": tenant_id,
        "k": key,
        "rid": request_id,
        "h": body_hash,
        "deadline": deadline_at,
        "received": received_at,
        "version": model_version,
        "ttl_s": ttl_h * 3600,
    }
    async with engine.begin() as conn:
        if (await conn.execute(_CLAIM, params)).first() is not None:
            return KeyClaim(True, request_id, body_hash, deadline_at, received_at, model_version)
        row = (await conn.execute(_EXISTING, params)).one()
    return KeyClaim(
        False,
        str(row.request_id),
        row.body_hash,
        row.deadline_at,
        row.received_at,
        row.model_version,
    )


async def release_key(engine: AsyncEngine, *, tenant_id: str, key: str, request_id: str) -> None:
    """Free a claim whose request never reached Kafka, so a retry sends it again at once
    (only this request's claim: a key another request took since stays)."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "DELETE FROM idempotency_keys "
                "WHERE tenant_id = :t AND key = :k AND request_id = :rid"
            ),
            {"t": tenant_id, "k": key, "rid": request_id},
        )
