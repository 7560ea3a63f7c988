"""Corpora re-embedded by a new model version (decision 68): ``model_migrations`` names
each migration job, the versions it moves between, its tenant and what its corpus was.

Online: a new table; nothing existing is locked or rewritten.

Revision ID: 0029
Revises: 0027 (0022 when written; chained after main's 0026 and 0027 at the merge)
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0029"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_migrations",
        sa.Column("job_id", UUID(as_uuid=False), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("from_version", sa.Text, nullable=False),
        sa.Column("to_version", sa.Text, nullable=False),
        sa.Column("tenant_id", UUID(as_uuid=False), nullable=False),
        sa.Column("corpus", JSONB, nullable=False),
        sa.Column("created_by", sa.Text, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    # The retire gate and the coverage gauges read a model's migrations.
    op.create_index("model_migrations_name", "model_migrations", ["name", "from_version"])


def downgrade() -> None:
    op.drop_table("model_migrations")
