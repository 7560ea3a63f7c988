"""Job counters advanced per writer, without the job row's lock (decision 64).

``job_counts`` holds each result writer's running counts of a job's attempt: a write
adds to its own row, so two writers of one job never wait for each other (the job row's
lock, held from the counter update to the commit, halved the rows a second a job's
results were stored at: bench/store/commit_rate.py). ``job_progress`` is a job's
counters as they stand: the job row's (what earlier attempts and finished runs folded
in) plus its writers' counts of the current attempt. When a job's last result commits,
its counts are folded into the job row and deleted (results/jobs.py, ``settle``).
``job_summaries`` (the analysts' view) now reads ``job_progress``.

Online: a new table and views; nothing existing is locked or rewritten.

Revision ID: 0025
Revises: 0021
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0025"
down_revision = "0021"
branch_labels = None
depends_on = None

COUNTERS = ("succeeded", "failed", "expired", "cancelled")

JOB_PROGRESS = f"""
    SELECT j.job_id,
           {", ".join(f"j.{c} + coalesce(w.{c}, 0) AS {c}" for c in COUNTERS)}
    FROM jobs j
    LEFT JOIN LATERAL (
        SELECT {", ".join(f"sum({c})::int AS {c}" for c in COUNTERS)}
        FROM job_counts c WHERE c.job_id = j.job_id AND c.attempt = j.attempt
    ) w ON true"""


def _summaries(counters: str) -> str:
    """The analysts' job view (0017's), its counters read from ``counters``."""
    return f"""
        SELECT j.job_id, j.tenant_id, t.name AS tenant, j.model, j.model_version,
               j.total_items, p.succeeded, p.failed, p.expired, p.cancelled,
               j.total_items - p.succeeded - p.failed - p.expired - p.cancelled AS unfinished,
               CASE WHEN j.cancelled_at IS NOT NULL AND j.finished_at IS NULL THEN 'cancelling'
                    WHEN j.cancelled_at IS NOT NULL THEN 'cancelled'
                    WHEN j.finished_at IS NOT NULL THEN 'finished'
                    WHEN j.expires_at <= now() THEN 'expired'
                    WHEN j.started_at IS NOT NULL THEN 'running'
                    ELSE 'queued' END AS state,
               j.created_at, j.started_at, j.finished_at, j.expires_at,
               extract(epoch FROM j.finished_at - j.created_at) AS run_s,
               (p.succeeded + p.failed)
                   / nullif(extract(epoch FROM j.finished_at - j.started_at), 0) AS items_per_s,
               j.output_expires_at, j.output_expired_at
        FROM jobs j JOIN {counters} p ON p.job_id = j.job_id
        LEFT JOIN tenants t ON t.id = j.tenant_id"""


def upgrade() -> None:
    op.create_table(
        "job_counts",
        sa.Column(
            "job_id",
            UUID(as_uuid=False),
            sa.ForeignKey("jobs.job_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("attempt", sa.Integer, primary_key=True),
        # One row per result writer (a scheduler's persist connection): its own row is
        # the only one it ever updates.
        sa.Column("writer", UUID(as_uuid=False), primary_key=True),
        *(sa.Column(c, sa.Integer, nullable=False, server_default="0") for c in COUNTERS),
    )
    op.execute(f"CREATE VIEW job_progress AS {JOB_PROGRESS}")
    op.execute(f"CREATE OR REPLACE VIEW job_summaries AS {_summaries('job_progress')}")


def downgrade() -> None:
    # Fold what writers counted into the job rows first: nothing counted is lost.
    op.execute(
        "UPDATE jobs j SET "
        + ", ".join(f"{c} = p.{c}" for c in COUNTERS)
        + " FROM job_progress p WHERE p.job_id = j.job_id"
    )
    op.execute(
        f"CREATE OR REPLACE VIEW job_summaries AS "
        f"{_summaries('(SELECT job_id, succeeded, failed, expired, cancelled FROM jobs)')}"
    )
    op.execute("DROP VIEW job_progress")
    op.drop_table("job_counts")
