"""The job row through submission (decision 10): recorded with its items in one
transaction (phase 1), then 'submitting' until every item is in Kafka (phase 2),
finished by any API instance if the one that started it died."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from results.schema import jobs


@dataclass(frozen=True)
class NewJob:
    job_id: str
    tenant_id: str
    model: str
    model_version: str
    params: dict[str, Any]
    metadata: dict[str, Any] | None
    total_items: int
    expires_at: datetime
    idempotency_key: str | None
    body_hash: str
    webhook_url: str | None
    webhook_secret: str | None
    # An incremental job (decision 61): started as it is recorded when some of its
    # items will be reused (their rows are copied by its publish: results/job_reuse.py).
    base_job_id: str | None = None
    started_at: datetime | None = None


async def forget_expired_key(conn: AsyncConnection, tenant_id: str, key: str, ttl_h: float) -> None:
    """A key older than its ``ttl_h`` hours is free again: the job keeps its row, not the
    key (the sweeper does the same in bulk; this makes expiry exact at the boundary)."""
    await conn.execute(
        text(
            "UPDATE jobs SET idempotency_key = NULL WHERE tenant_id = :t AND idempotency_key = :k "
            "AND created_at < now() - make_interval(secs => :ttl_s)"
        ),
        {"t": tenant_id, "k": key, "ttl_s": ttl_h * 3600},
    )


async def job_for_key(conn: AsyncConnection, tenant_id: str, key: str) -> Row[Any] | None:
    """(job_id, body_hash, submit_state) of the job submitted earlier with this key."""
    return (
        await conn.execute(
            text(
                "SELECT job_id, body_hash, submit_state FROM jobs "
                "WHERE tenant_id = :t AND idempotency_key = :k"
            ),
            {"t": tenant_id, "k": key},
        )
    ).first()


async def insert_job(conn: AsyncConnection, job: NewJob) -> bool:
    """Insert the job row; False when a concurrent submission took its idempotency key."""
    stmt = (
        insert(jobs)
        .values(**asdict(job))  # its fields are the row's columns
        .on_conflict_do_nothing(index_elements=["tenant_id", "idempotency_key"])
        .returning(jobs.c.job_id)
    )
    return (await conn.execute(stmt)).first() is not None


# --- phase 2 (the publisher's thread, sync, through its pool) ---


def job_to_publish(conn: Connection, job_id: str) -> Row[Any] | None:
    """What every item message of the job carries, the tenant's weight, and the base
    job of an incremental one."""
    return conn.execute(
        text(
            "SELECT j.tenant_id, j.model, j.model_version, j.params, j.created_at, "
            "j.expires_at, j.total_items, j.base_job_id, t.weight FROM jobs j "
            "JOIN tenants t ON t.id = j.tenant_id "
            "WHERE j.job_id = :j"
        ),
        {"j": job_id},
    ).first()


def heartbeat(engine: Engine, job_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE jobs SET submit_heartbeat_at = now() WHERE job_id = :j"), {"j": job_id}
        )


_SUBMITTED = text("UPDATE jobs SET submit_state = 'submitted' WHERE job_id = :j")


def mark_submitted(engine: Engine, job_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(_SUBMITTED, {"j": job_id})


def claim_stale(engine: Engine, stale_s: float) -> str | None:
    """A job some API instance left 'submitting' (it died): take it over."""
    with engine.begin() as conn:
        row = conn.execute(
            text(
                """UPDATE jobs SET submit_heartbeat_at = now()
                   WHERE job_id = (SELECT job_id FROM jobs WHERE submit_state = 'submitting'
                                     AND submit_heartbeat_at < now() - make_interval(secs => :s)
                                   ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED)
                   RETURNING job_id"""
            ),
            {"s": stale_s},
        ).first()
    return str(row[0]) if row else None
