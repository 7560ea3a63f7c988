"""Incremental jobs (decision 61): a content hash per job item, the item's ``reused``
mark, and on the job its base and how many of its items were reused.

Online: nullable columns and columns with a constant default (PostgreSQL 11+ adds them
without rewriting the table); nothing existing is locked for long.

Revision ID: 0022
Revises: 0025 (numbered 0022 when it was written; it runs after 0025, which landed first)
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import BYTEA, UUID

revision = "0022"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # sha256 of (tenant, model, version, params, input): NULL for items staged before.
    op.add_column("job_items", sa.Column("content_hash", BYTEA))
    op.add_column(
        "job_items", sa.Column("reused", sa.Boolean, nullable=False, server_default="false")
    )
    op.add_column("jobs", sa.Column("base_job_id", UUID(as_uuid=False)))
    op.add_column("jobs", sa.Column("reused", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("jobs", "reused")
    op.drop_column("jobs", "base_job_id")
    op.drop_column("job_items", "reused")
    op.drop_column("job_items", "content_hash")
