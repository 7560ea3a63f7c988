"""Jobs: status derivation (pure) and the queries the job API and scheduler share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Select, and_, case, func, select, update

from results.schema import job_items, jobs, requests

ITEM_STATUSES = ("queued", "succeeded", "failed", "expired", "cancelled")
JOB_STATUSES = (
    "queued",
    "running",
    "completed",
    "failed",
    "cancelling",
    "cancelled",
    "expired",
)


def finished_count(j: Any) -> int:
    return int(j.succeeded + j.failed + j.expired + j.cancelled)


def job_status(j: Any, now: datetime) -> str:
    """The job's status from its counters and times (see JOB_STATUSES)."""
    done = finished_count(j) >= j.total_items
    window_closed = now >= j.expires_at
    if done:
        if j.cancelled_at is not None:
            return "cancelled"
        if j.expired and not (j.succeeded or j.failed):
            return "expired"
        if j.failed and not j.succeeded:
            return "failed"
        return "completed"
    if j.cancelled_at is not None:
        return "cancelling"
    if window_closed:
        return "expired"
    if j.started_at is not None or finished_count(j):
        return "running"
    return "queued"


def item_status(result_status: str | None, j: Any, now: datetime) -> str:
    """An item without a result row yet reads as cancelled/expired once the job says so."""
    if result_status is not None:
        return result_status
    if j.cancelled_at is not None:
        return "cancelled"
    if now >= j.expires_at:
        return "expired"
    return "queued"


def counts(j: Any) -> dict[str, int]:
    return {
        "total": int(j.total_items),
        "queued": int(j.total_items) - finished_count(j),
        "succeeded": int(j.succeeded),
        "failed": int(j.failed),
        "expired": int(j.expired),
        "cancelled": int(j.cancelled),
    }


def items_stmt(job_id: str, start: int, limit: int) -> Select[Any]:
    """Items of a job in input order with their current attempt's result, if any."""
    return (
        select(
            job_items.c.item_index,
            job_items.c.custom_id,
            job_items.c.input,
            job_items.c.attempt,
            requests.c.status,
            requests.c.output,
            requests.c.output_vector,
            requests.c.error,
            requests.c.attempts,
        )
        .select_from(job_items.outerjoin(requests, requests.c.request_id == job_items.c.request_id))
        .where(job_items.c.job_id == job_id, job_items.c.item_index >= start)
        .order_by(job_items.c.item_index)
        .limit(limit)
    )


def record_job_results(conn: Connection, written: Iterable[tuple[str | None, str]]) -> None:
    """Advance job counters by the newly written result rows (job_id, status).

    Runs inside the results transaction, so counters match the rows exactly even
    when Kafka redelivers a request (the upsert skips it; it is not counted).
    """
    per_job: dict[str, Counter[str]] = {}
    for job_id, status in written:
        if job_id is not None:
            per_job.setdefault(job_id, Counter())[status] += 1
    for job_id in sorted(per_job):  # one lock order across transactions: no deadlocks
        c = per_job[job_id]
        new_done = (
            jobs.c.succeeded + jobs.c.failed + jobs.c.expired + jobs.c.cancelled + sum(c.values())
        )
        finished = new_done >= jobs.c.total_items
        conn.execute(
            update(jobs)
            .where(jobs.c.job_id == job_id)
            .values(
                succeeded=jobs.c.succeeded + c["succeeded"],
                failed=jobs.c.failed + c["failed"],
                expired=jobs.c.expired + c["expired"],
                cancelled=jobs.c.cancelled + c["cancelled"],
                started_at=func.coalesce(jobs.c.started_at, func.now()),
                finished_at=case((finished, func.now()), else_=jobs.c.finished_at),
                webhook_next_at=case(
                    (and_(finished, jobs.c.webhook_url.is_not(None)), func.now()),
                    else_=jobs.c.webhook_next_at,
                ),
            )
        )


def cancelled_unfinished_stmt() -> Select[Any]:
    """Jobs (and which attempt of each) whose remaining items the scheduler should
    cancel instead of running. A retry starts a new attempt, whose items run."""
    return select(jobs.c.job_id, jobs.c.attempt).where(
        jobs.c.cancelled_at.is_not(None), jobs.c.finished_at.is_(None)
    )
