"""Job-item budgets charged in PostgreSQL; indexes for the webhook claim and the
idempotency-key sweep.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "job_item_budgets",
        sa.Column("tenant_id", UUID(as_uuid=False), primary_key=True),
        # NULL: never charged (a full bucket); negative: a large job's debt.
        sa.Column("tokens", sa.Float),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.func.now()),
    )
    # Every API instance looks for due webhooks each second.
    op.create_index(
        "jobs_webhook_due",
        "jobs",
        ["webhook_next_at"],
        postgresql_where=sa.text("webhook_next_at IS NOT NULL AND webhook_delivered_at IS NULL"),
    )
    # The sweeper frees job idempotency keys older than their time to live.
    op.create_index(
        "jobs_idempotency_created",
        "jobs",
        ["created_at"],
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("jobs_idempotency_created", "jobs")
    op.drop_index("jobs_webhook_due", "jobs")
    op.drop_table("job_item_budgets")
