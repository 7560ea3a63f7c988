"""What the request log tells the metrics: jobs not yet finished and their items, and
each version's coverage of the corpora re-embedded with it (decision 68; a row per
migration, which are few: one per corpus and model change).

Read at scrape time by the API's ``/metrics`` (ingest/operations/metrics.py): one aggregate over
the unfinished jobs, so its cost follows the jobs in flight. The job's status is
derived as results/jobs.py ``job_status`` derives it for one job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from core.models.reembed import version_coverage
from core.vocab import ItemStatus, JobStatus
from results.reembed import read_migrations

# Unfinished jobs only (finished_at is set once the job's last result committed), their
# counters as they stand (job_progress: the row's and its result writers').
_UNFINISHED = text(
    """
    SELECT
      count(*) FILTER (WHERE cancelled_at IS NOT NULL) AS cancelling,
      count(*) FILTER (WHERE cancelled_at IS NULL AND expires_at <= now()) AS expired,
      count(*) FILTER (
        WHERE cancelled_at IS NULL AND expires_at > now()
          AND (started_at IS NOT NULL OR p.succeeded + p.failed + p.expired + p.cancelled > 0)
      ) AS running,
      count(*) FILTER (
        WHERE cancelled_at IS NULL AND expires_at > now()
          AND started_at IS NULL AND p.succeeded + p.failed + p.expired + p.cancelled = 0
      ) AS queued,
      coalesce(sum(total_items - p.succeeded - p.failed - p.expired - p.cancelled), 0)
          AS items_queued,
      coalesce(sum(p.succeeded), 0) AS items_succeeded,
      coalesce(sum(p.failed), 0) AS items_failed,
      coalesce(sum(p.expired), 0) AS items_expired,
      coalesce(sum(p.cancelled), 0) AS items_cancelled
    FROM jobs j JOIN job_progress p ON p.job_id = j.job_id
    WHERE finished_at IS NULL
    """
)


@dataclass(frozen=True)
class JobGauges:
    jobs: dict[str, int]  # unfinished jobs by JobStatus
    items: dict[str, int]  # their items by ItemStatus
    # (model, version) -> the share of its re-embedded corpora it has embedded (decision 68)
    coverage: dict[tuple[str, str], float] = field(default_factory=dict)


async def read_job_gauges(engine: AsyncEngine) -> JobGauges:
    async with engine.connect() as conn:
        gauges = job_gauges_of((await conn.execute(_UNFINISHED)).one())
        coverage = version_coverage(await read_migrations(conn))
    return JobGauges(gauges.jobs, gauges.items, coverage)


def job_gauges_of(row: object) -> JobGauges:
    m = row._mapping  # type: ignore[attr-defined]
    shown = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.CANCELLING, JobStatus.EXPIRED)
    # expired: the window closed while items are still unrecorded
    jobs = {str(s): int(m[str(s)]) for s in shown}
    items = {str(s): int(m[f"items_{s}"]) for s in ItemStatus}
    return JobGauges(jobs, items)
