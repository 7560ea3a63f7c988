"""Idempotency-Key claims for sync requests, and the sweep that expires them and the
keys of jobs after their time to live."""

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


# A key older than its time to live is taken over as if it were free: a reused key
# after expiry is a new request (with a new request id), whether or not the sweeper
# has deleted the old claim yet.
_CLAIM = text("""
    INSERT INTO idempotency_keys (tenant_id, key, request_id, body_hash, deadline_at)
    VALUES (:t, :k, :rid, :h, :deadline)
    ON CONFLICT (tenant_id, key) DO UPDATE
        SET request_id = EXCLUDED.request_id, body_hash = EXCLUDED.body_hash,
            deadline_at = EXCLUDED.deadline_at, created_at = now()
        WHERE idempotency_keys.created_at < now() - make_interval(secs => :ttl_s)
    RETURNING request_id""")

_EXISTING = text(
    "SELECT request_id, body_hash, deadline_at FROM idempotency_keys "
    "WHERE tenant_id = :t AND key = :k"
)


async def claim_key(
    engine: AsyncEngine,
    *,
    tenant_id: str,
    key: str,
    request_id: str,
    body_hash: str,
    deadline_at: datetime,
    ttl_h: float,
) -> KeyClaim:
    """Claim ``key`` for ``request_id``, or return the claim that holds it."""
    params = {
        "t": tenant_id,
        "k": key,
        "rid": request_id,
        "h": body_hash,
        "deadline": deadline_at,
        "ttl_s": ttl_h * 3600,
    }
    async with engine.begin() as conn:
        if (await conn.execute(_CLAIM, params)).first() is not None:
            return KeyClaim(True, request_id, body_hash, deadline_at)
        row = (await conn.execute(_EXISTING, params)).one()
    return KeyClaim(False, str(row.request_id), row.body_hash, row.deadline_at)


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


# One sweeper at a time across every API instance: whoever holds this transaction-level
# advisory lock deletes a batch; the others skip that pass.
SWEEP_LOCK = 0x67_6D_69_64  # "gmid"

_SWEEP_KEYS = text("""
    DELETE FROM idempotency_keys WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM idempotency_keys
        WHERE created_at < now() - make_interval(secs => :ttl_s) LIMIT :n))""")

_SWEEP_JOB_KEYS = text("""
    UPDATE jobs SET idempotency_key = NULL WHERE job_id = ANY(ARRAY(
        SELECT job_id FROM jobs
        WHERE idempotency_key IS NOT NULL
          AND created_at < now() - make_interval(secs => :ttl_s) LIMIT :n))""")


async def sweep_batch(engine: AsyncEngine, ttl_h: float, batch: int) -> int | None:
    """Expire up to ``batch`` sync claims and ``batch`` job keys older than ``ttl_h``
    hours, in one short transaction. None when another instance holds the sweep."""
    async with engine.begin() as conn:
        got = (
            await conn.execute(text("SELECT pg_try_advisory_xact_lock(:l)"), {"l": SWEEP_LOCK})
        ).scalar()
        if not got:
            return None
        keys = await conn.execute(_SWEEP_KEYS, {"ttl_s": ttl_h * 3600, "n": batch})
        job_keys = await conn.execute(_SWEEP_JOB_KEYS, {"ttl_s": ttl_h * 3600, "n": batch})
        return int(keys.rowcount or 0) + int(job_keys.rowcount or 0)
