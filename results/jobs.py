"""Jobs: status derivation (pure), the job row's queries, and the counters the
scheduler advances as results land."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy import Select, delete, select, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from core.vocab import ItemStatus, JobStatus
from results.schema import JOB_COUNTERS, job_counts, job_items, job_progress, jobs, requests


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


def job_rows() -> Select[Any]:
    """The job rows with their counters as they stand (``job_progress``: the row's own
    plus what its result writers counted since), under the job table's column names."""
    kept = [c for c in jobs.c if c.name not in JOB_COUNTERS]
    return select(*kept, *(job_progress.c[c] for c in JOB_COUNTERS)).select_from(
        jobs.join(job_progress, job_progress.c.job_id == jobs.c.job_id)
    )


async def get_job(engine: AsyncEngine, tenant_id: str, job_id: str) -> Row[Any] | None:
    """The job row, only if it belongs to the tenant (``job_id`` in canonical form)."""
    async with engine.connect() as conn:
        return (
            await conn.execute(
                job_rows().where(jobs.c.job_id == job_id, jobs.c.tenant_id == tenant_id)
            )
        ).first()


async def list_jobs(
    engine: AsyncEngine, tenant_id: str, before: datetime | None, limit: int
) -> list[Row[Any]]:
    """The tenant's jobs, newest first, created before ``before`` if given."""
    q = job_rows().where(jobs.c.tenant_id == tenant_id)
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
    """The job row, locked until the transaction ends: a retry, a cancel and a settle
    of the job's results take turns (see ``settle``)."""
    return (
        await conn.execute(
            job_rows()
            .where(jobs.c.job_id == job_id, jobs.c.tenant_id == tenant_id)
            .with_for_update(of=jobs)
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
    # What earlier attempts' writers counted is in ``succeeded`` (from the items' rows).
    await conn.execute(delete(job_counts).where(job_counts.c.job_id == j.job_id))
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
#
# Each result writer (a scheduler's persist connection) adds its newly written rows to
# its own ``job_counts`` row of the job's attempt, in the results transaction: the
# counts match the rows exactly even when Kafka redelivers a request (the upsert skips
# it; it is not counted), and no two writers of one job ever wait for each other. (The
# counters were the job row's own, and its lock, held from the update to the commit,
# serialized every write of a job - and, with group commit, of every job a write
# merged: bench/store/commit_rate.py measured half the rows a second.) After the
# commit, ``settle`` marks the job started and, once every item is counted, finished.
# Decision 64.

# Plain SQL for the driver's cursor: the results transaction runs on a psycopg
# connection of its own (results/store.py). Arrays travel in binary (the driver's text
# format for a list is built in Python, element by element).
#
# Counts only rows of each item's *current* attempt: a row of an older attempt (still
# queued when the job was retried, persisted afterwards) is in the request log but is
# not this attempt's result. One statement, one snapshot: the items' request ids and the
# job's attempt are read together, so a retry committing meanwhile is either wholly seen
# (the old row matches no item) or not at all (the row counts toward the old attempt,
# which ``job_progress`` no longer reads).
_COUNT = """
    INSERT INTO job_counts AS c (job_id, attempt, writer, succeeded, failed, expired, cancelled)
    SELECT i.job_id, j.attempt, %(writer)s::uuid,
           count(*) FILTER (WHERE w.status = 'succeeded'),
           count(*) FILTER (WHERE w.status = 'failed'),
           count(*) FILTER (WHERE w.status = 'expired'),
           count(*) FILTER (WHERE w.status = 'cancelled')
    FROM unnest(%(rids)b::text[]::uuid[], %(jobs)b::text[]::uuid[],
                %(idx)b::int4[], %(st)b::text[])
         AS w(request_id, job_id, item_index, status)
    JOIN job_items i ON i.job_id = w.job_id AND i.item_index = w.item_index
                    AND i.request_id = w.request_id
    JOIN jobs j ON j.job_id = i.job_id
    GROUP BY i.job_id, j.attempt
    ON CONFLICT (job_id, attempt, writer) DO UPDATE SET
        succeeded = c.succeeded + excluded.succeeded,
        failed = c.failed + excluded.failed,
        expired = c.expired + excluded.expired,
        cancelled = c.cancelled + excluded.cancelled"""

# After the counts commit: the job is started, and finished once every item is counted
# - then its writers' counts are folded into its row and deleted, in one statement. Only
# a job that changes is locked (the first write of each, and its last): the WHERE reads
# the others without a lock and writes nothing, so a settle costs a round trip, not a
# commit's flush. Whichever writer commits a job's last counts sees every other
# writer's (they committed before it), so the job is finished exactly once; a crash
# before the settle leaves the write's offsets uncommitted, and its redelivery settles.
# The counts are read at the statement's start, the row re-read once locked: a retry
# that committed in between (a new attempt, its counters reset) must not receive the
# old attempt's totals, hence ``j.attempt = p.attempt``.
_SETTLE = """
    WITH p AS (
        SELECT p.*, j.attempt,
               p.succeeded + p.failed + p.expired + p.cancelled >= j.total_items AS fin
        FROM job_progress p JOIN jobs j ON j.job_id = p.job_id
        WHERE p.job_id = ANY(%(ids)b::text[]::uuid[])
    ), done AS (
        UPDATE jobs j SET
            started_at = coalesce(j.started_at, now()),
            finished_at = CASE WHEN p.fin THEN now() END,
            webhook_next_at = CASE WHEN p.fin AND j.webhook_url IS NOT NULL THEN now()
                                   ELSE j.webhook_next_at END,
            succeeded = CASE WHEN p.fin THEN p.succeeded ELSE j.succeeded END,
            failed = CASE WHEN p.fin THEN p.failed ELSE j.failed END,
            expired = CASE WHEN p.fin THEN p.expired ELSE j.expired END,
            cancelled = CASE WHEN p.fin THEN p.cancelled ELSE j.cancelled END
        FROM p
        WHERE j.job_id = p.job_id AND j.finished_at IS NULL AND j.attempt = p.attempt
          AND (j.started_at IS NULL OR p.fin)
        RETURNING j.job_id, j.attempt, p.fin
    )
    DELETE FROM job_counts c USING done
    WHERE done.fin AND c.job_id = done.job_id AND c.attempt = done.attempt"""


_writer = threading.local()


def writer_id() -> str:
    """This thread's writer id (its own ``job_counts`` rows): a thread runs one results
    transaction at a time, so its rows are never waited for by itself."""
    wid: str | None = getattr(_writer, "id", None)
    if wid is None:
        wid = _writer.id = str(uuid.uuid4())
    return wid


def record_job_results(
    cur: psycopg.Cursor[Any],
    written: Iterable[tuple[str, str | None, int | None, str]],
    writer: str,
) -> None:
    """Add newly written result rows (request id, job id, item index, status) to
    ``writer``'s counts of their jobs, in the results transaction."""
    rows = [(r, j, i, s) for r, j, i, s in written if j is not None and i is not None]
    if not rows:
        return
    cur.execute(
        _COUNT,
        {
            "writer": writer,
            "rids": [r for r, _, _, _ in rows],
            "jobs": [j for _, j, _, _ in rows],
            "idx": [i for _, _, i, _ in rows],
            "st": [s for _, _, _, s in rows],
        },
    )


def settle(cur: psycopg.Cursor[Any], job_ids: Iterable[str]) -> None:
    """Mark these jobs started, and finished if every item is counted (see ``_SETTLE``),
    after the transaction that counted their results committed; the caller commits."""
    ids = sorted(set(job_ids))
    if ids:
        cur.execute(_SETTLE, {"ids": ids})


def cancelled_unfinished_stmt() -> Select[Any]:
    """Jobs (and which attempt of each) whose remaining items the scheduler should
    cancel instead of running. A retry starts a new attempt, whose items run."""
    return select(jobs.c.job_id, jobs.c.attempt).where(
        jobs.c.cancelled_at.is_not(None), jobs.c.finished_at.is_(None)
    )
