"""The job backlog of one model version: every unfinished job, whose, when submitted and
how many of its items are left, with its tenant's weight. Read for completion-time
quotes (ingest/jobs/quote.py, decision 69)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncEngine

from results.job_submission import job_for_key
from results.schema import JOB_COUNTERS, job_progress, jobs, tenants


async def pending_jobs(
    engine: AsyncEngine, model: str, version: str, now: datetime
) -> list[Row[Any]]:
    """(job_id, tenant_id, created_at, remaining, weight) of each job of this model
    version neither finished, cancelled nor past its window. Unfinished jobs are few
    (each holds many items), so this is one row per job, not per item."""
    done = sum(job_progress.c[c] for c in JOB_COUNTERS)
    q: Select[Any] = (
        select(
            jobs.c.job_id,
            jobs.c.tenant_id,
            jobs.c.created_at,
            (jobs.c.total_items - done).label("remaining"),
            tenants.c.weight,
        )
        .select_from(
            jobs.join(job_progress, job_progress.c.job_id == jobs.c.job_id).join(
                tenants, tenants.c.id == jobs.c.tenant_id
            )
        )
        .where(
            jobs.c.model == model,
            jobs.c.model_version == version,
            jobs.c.finished_at.is_(None),
            jobs.c.cancelled_at.is_(None),
            jobs.c.expires_at > now,
        )
    )
    async with engine.connect() as conn:
        return list((await conn.execute(q)).all())


async def key_has_job(engine: AsyncEngine, tenant_id: str, key: str) -> bool:
    """Whether a job was recorded under this Idempotency-Key (a retry of a submission
    is answered with that job, whatever the load now)."""
    async with engine.connect() as conn:
        return await job_for_key(conn, tenant_id, key) is not None
