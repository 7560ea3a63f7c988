"""Jobs: status derivation (pure), the job row's queries, and the counters the
scheduler advances as results land."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy import Select, select, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from core.vocab import ItemStatus, JobStatus
from results.schema import job_items, jobs, requests


def finished_count(j: Any) -> int:
    return int(j.succeeded + j.failed + j.expired + j.cancelled)


def job_status(j: Any, now: datetime) -> JobStatus:
    """The job's status from its counters and times."""
    done = finished_count(j) >= j.total_items
    window_closed = now >= j.expires_at
    if done:
        if j.cancelled_at is not None:
            return JobStatus.CANCELLED
        if j.expired and not (j.succeeded or j.failed):
            return JobStatus.EXPIRED
        if j.failed and not j.succeeded:
            return JobStatus.FAILED
        return JobStatus.COMPLETED
    if j.cancelled_at is not None:
        return JobStatus.CANCELLING
    if window_closed:
        return JobStatus.EXPIRED
    if j.started_at is not None or finished_count(j):
        return JobStatus.RUNNING
    return JobStatus.QUEUED


def item_status(result_status: str | None, j: Any, now: datetime) -> ItemStatus:
    """An item without a result row yet reads as cancelled/expired once the job says so."""
    if result_status is not None:
        return ItemStatus(result_status)
    if j.cancelled_at is not None:
        return ItemStatus.CANCELLED
    if now >= j.expires_at:
        return ItemStatus.EXPIRED
    return ItemStatus.QUEUED


def counts(j: Any) -> dict[str, int]:
    return {
        "total": int(j.total_items),
        "queued": int(j.total_items) - finished_count(j),
        "succeeded": int(j.succeeded),
        "failed": int(j.failed),
        "expired": int(j.expired),
        "cancelled": int(j.cancelled),
    }


def usage(j: Any) -> dict[str, int]:
    """Items answered from the base job's results apart from items the model ran (an
    incremental job, decision 61): ``computed`` grows as results land; at the end
    ``reused + computed`` is every item that has an answer (succeeded or failed)."""
    return {
        "reused_items": int(j.reused),
        "computed_items": int(j.succeeded) - int(j.reused) + int(j.failed),
    }


# --- the job API's queries (ingest, async) ---


async def get_job(engine: AsyncEngine, tenant_id: str, job_id: str) -> Row[Any] | None:
    """The job row, only if it belongs to the tenant (``job_id`` in canonical form)."""
    async with engine.connect() as conn:
        return (
            await conn.execute(
                select(jobs).where(jobs.c.job_id == job_id, jobs.c.tenant_id == tenant_id)
            )
        ).first()


async def list_jobs(
    engine: AsyncEngine, tenant_id: str, before: datetime | None, limit: int
) -> list[Row[Any]]:
    """The tenant's jobs, newest first, created before ``before`` if given."""
    q = select(jobs).where(jobs.c.tenant_id == tenant_id)
    if before is not None:
        q = q.where(jobs.c.created_at < before)
    async with engine.connect() as conn:
        return list((await conn.execute(q.order_by(jobs.c.created_at.desc()).limit(limit))).all())


async def cancel_job(engine: AsyncEngine, job_id: str, now: datetime) -> None:
    """Mark the job cancelled (the scheduler then cancels its unstarted items)."""
    async with engine.begin() as conn:
        await conn.execute(
            update(jobs)
            .where(
                jobs.c.job_id == job_id,
                jobs.c.cancelled_at.is_(None),
                jobs.c.finished_at.is_(None),
            )
            .values(cancelled_at=now)
        )


async def lock_job(conn: AsyncConnection, tenant_id: str, job_id: str) -> Row[Any] | None:
    """The job row, locked until the transaction ends: a retry and the results the
    scheduler writes for the job then take turns (see ``record_job_results``)."""
    return (
        await conn.execute(
            select(jobs)
            .where(jobs.c.job_id == job_id, jobs.c.tenant_id == tenant_id)
            .with_for_update()
        )
    ).first()


async def unsucceeded_items(conn: AsyncConnection, job_id: str) -> list[int]:
    """Indexes of the items whose current attempt has no successful result."""
    redo = (
        select(job_items.c.item_index)
        .select_from(job_items.outerjoin(requests, requests.c.request_id == job_items.c.request_id))
        .where(job_items.c.job_id == job_id)
        .where((requests.c.status.is_(None)) | (requests.c.status != "succeeded"))
        .order_by(job_items.c.item_index)
    )
    return [r[0] for r in (await conn.execute(redo)).all()]


async def start_attempt(
    conn: AsyncConnection, j: Any, attempt: int, now: datetime, succeeded: int
) -> None:
    """Reset the job for a new attempt (its items already carry their new request ids):
    counters restart from the items that keep their successful result, the window
    restarts at ``now`` with the job's original length, the webhook is due again."""
    window: timedelta = j.expires_at - j.created_at
    await conn.execute(
        update(jobs)
        .where(jobs.c.job_id == j.job_id)
        .values(
            attempt=attempt,
            succeeded=succeeded,
            failed=0,
            expired=0,
            cancelled=0,
            finished_at=None,
            cancelled_at=None,
            expires_at=now + window,
            submit_state="submitting",
            submit_heartbeat_at=now,
            webhook_delivered_at=None,
            webhook_attempts=0,
            webhook_next_at=None,
            webhook_error=None,
        )
    )


# --- the scheduler's side: counters advanced with the result rows (sync) ---

# Plain SQL for the driver's cursor: the results transaction runs on a psycopg
# connection of its own (results/store.py). Arrays travel in binary (the driver's text
# format for a list is built in Python, element by element).
_LOCK_JOBS = (
    "SELECT 1 FROM jobs WHERE job_id = ANY(%(ids)b::text[]::uuid[]) ORDER BY job_id FOR UPDATE"
)

# Counts only rows of each item's *current* attempt: a row of an older attempt (still
# queued when the job was retried, persisted afterwards) is in the request log but is
# not this attempt's result, so it must not advance the counters.
_ADVANCE = """
    UPDATE jobs j SET
        succeeded = j.succeeded + c.succeeded,
        failed = j.failed + c.failed,
        expired = j.expired + c.expired,
        cancelled = j.cancelled + c.cancelled,
        started_at = coalesce(j.started_at, now()),
        finished_at = CASE WHEN j.finished_at IS NULL AND j.succeeded + j.failed + j.expired
                               + j.cancelled + c.n >= j.total_items THEN now()
                           ELSE j.finished_at END,
        webhook_next_at = CASE WHEN j.finished_at IS NULL AND j.webhook_url IS NOT NULL
                                    AND j.succeeded + j.failed + j.expired + j.cancelled
                                        + c.n >= j.total_items THEN now()
                               ELSE j.webhook_next_at END
    FROM (
        SELECT i.job_id,
               count(*) AS n,
               count(*) FILTER (WHERE w.status = 'succeeded') AS succeeded,
               count(*) FILTER (WHERE w.status = 'failed') AS failed,
               count(*) FILTER (WHERE w.status = 'expired') AS expired,
               count(*) FILTER (WHERE w.status = 'cancelled') AS cancelled
        FROM unnest(%(rids)b::text[]::uuid[], %(jobs)b::text[]::uuid[],
                    %(idx)b::int4[], %(st)b::text[])
             AS w(request_id, job_id, item_index, status)
        JOIN job_items i ON i.job_id = w.job_id AND i.item_index = w.item_index
                        AND i.request_id = w.request_id
        GROUP BY i.job_id
    ) c
    WHERE j.job_id = c.job_id"""


def record_job_results(
    cur: psycopg.Cursor[Any], written: Iterable[tuple[str, str | None, int | None, str]]
) -> None:
    """Advance job counters by newly written result rows (request id, job id, item
    index, status), in the results transaction: counters match the rows exactly even
    when Kafka redelivers a request (the upsert skips it; it is not counted).

    The job rows are locked first, in one order (no deadlocks), and counted by the
    next statement, which therefore sees a retry that committed while we waited:
    a retry (``start_attempt``) and this count never interleave."""
    rows = [(r, j, i, s) for r, j, i, s in written if j is not None and i is not None]
    if not rows:
        return
    ids = sorted(Counter(j for _, j, _, _ in rows))
    cur.execute(_LOCK_JOBS, {"ids": ids})
    cur.execute(
        _ADVANCE,
        {
            "rids": [r for r, _, _, _ in rows],
            "jobs": [j for _, j, _, _ in rows],
            "idx": [i for _, _, i, _ in rows],
            "st": [s for _, _, _, s in rows],
        },
    )


def cancelled_unfinished_stmt() -> Select[Any]:
    """Jobs (and which attempt of each) whose remaining items the scheduler should
    cancel instead of running. A retry starts a new attempt, whose items run."""
    return select(jobs.c.job_id, jobs.c.attempt).where(
        jobs.c.cancelled_at.is_not(None), jobs.c.finished_at.is_(None)
    )
