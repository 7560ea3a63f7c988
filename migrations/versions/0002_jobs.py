"""Async batch jobs: jobs, their items, and the 'cancelled' request status.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("job_id", UUID(as_uuid=False), primary_key=True),
        sa.Column("tenant_id", UUID(as_uuid=False), nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("model_version", sa.Text, nullable=False),
        sa.Column("params", JSONB, nullable=False, server_default="{}"),
        sa.Column("metadata", JSONB),
        sa.Column("total_items", sa.Integer, nullable=False),
        # submitting: items recorded, not yet all in Kafka; submitted: every item in Kafka.
        sa.Column("submit_state", sa.Text, nullable=False, server_default="submitting"),
        sa.Column("submit_heartbeat_at", TS, nullable=False, server_default=sa.func.now()),
        sa.Column("succeeded", sa.Integer, nullable=False, server_default="0"),
        sa.Column("failed", sa.Integer, nullable=False, server_default="0"),
        sa.Column("expired", sa.Integer, nullable=False, server_default="0"),
        sa.Column("cancelled", sa.Integer, nullable=False, server_default="0"),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
        sa.Column("started_at", TS),
        sa.Column("finished_at", TS),
        sa.Column("cancelled_at", TS),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("idempotency_key", sa.Text),
        sa.Column("body_hash", sa.Text),
        sa.Column("webhook_url", sa.Text),
        sa.Column("webhook_secret", sa.Text),
        sa.Column("webhook_attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("webhook_next_at", TS),
        sa.Column("webhook_delivered_at", TS),
        sa.Column("webhook_error", sa.Text),
        sa.UniqueConstraint("tenant_id", "idempotency_key", name="jobs_tenant_idempotency"),
    )
    op.create_index("jobs_tenant_created", "jobs", ["tenant_id", "created_at"])
    op.create_index(
        "jobs_submitting",
        "jobs",
        ["submit_state"],
        postgresql_where=sa.text("submit_state = 'submitting'"),
    )
    op.create_table(
        "job_items",
        sa.Column("job_id", UUID(as_uuid=False), primary_key=True),
        sa.Column("item_index", sa.Integer, primary_key=True),
        sa.Column("custom_id", sa.Text),
        sa.Column("input", JSONB, nullable=False),
        # The request id of the item's current attempt (a retry gives it a new one).
        sa.Column("request_id", UUID(as_uuid=False), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    )
    op.drop_constraint("requests_status_check", "requests")
    op.create_check_constraint(
        "requests_status_check",
        "requests",
        "status in ('succeeded', 'failed', 'expired', 'cancelled')",
    )


def downgrade() -> None:
    op.drop_constraint("requests_status_check", "requests")
    op.create_check_constraint(
        "requests_status_check", "requests", "status in ('succeeded', 'failed', 'expired')"
    )
    op.drop_table("job_items")
    op.drop_table("jobs")
