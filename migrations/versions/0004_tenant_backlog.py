"""Schedulers report the largest tenants' queues per model and class, so admission
sheds the tenant that owns a backlog rather than its whole tier.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "scheduler_load",
        sa.Column("tenant_backlog", JSONB, nullable=False, server_default="{}"),
    )


def downgrade() -> None:
    op.drop_column("scheduler_load", "tenant_backlog")
