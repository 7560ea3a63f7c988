"""Tenant plans (fair-share weight, rate-limit overrides), API instances and
scheduler load reports for capacity-driven admission.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("tenants", sa.Column("weight", sa.Float, nullable=False, server_default="1"))
    op.add_column("tenants", sa.Column("rate_rps", sa.Float))  # NULL: the tier's default
    op.add_column("tenants", sa.Column("burst", sa.Float))
    op.add_column("tenants", sa.Column("job_items_per_s", sa.Float))
    op.create_table(
        "api_instances",
        sa.Column("instance_id", sa.Text, primary_key=True),
        sa.Column("last_seen_at", TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "scheduler_load",
        sa.Column("scheduler_id", sa.Text, primary_key=True),
        # items/s per model ref ("name@version") at the best measured batch size
        sa.Column("capacity", JSONB, nullable=False, server_default="{}"),
        # queued requests per model ref and priority class, plus Kafka lag per class
        sa.Column("backlog", JSONB, nullable=False, server_default="{}"),
        sa.Column("lag", JSONB, nullable=False, server_default="{}"),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    op.drop_table("scheduler_load")
    op.drop_table("api_instances")
    for col in ("job_items_per_s", "burst", "rate_rps", "weight"):
        op.drop_column("tenants", col)
