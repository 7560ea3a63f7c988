"""A generating request's streamed tokens, kept until its final row is written, so a
stream resumes after a dropped connection or a scheduler restart (decision 32).

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "generation_progress",
        sa.Column("request_id", UUID(as_uuid=False), primary_key=True),
        sa.Column("first_index", sa.Integer, primary_key=True),
        sa.Column("tenant_id", UUID(as_uuid=False), nullable=False),
        sa.Column("token_ids", JSONB, nullable=False),
        sa.Column("texts", JSONB, nullable=False),
        sa.Column(
            "written_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )


def downgrade() -> None:
    op.drop_table("generation_progress")
