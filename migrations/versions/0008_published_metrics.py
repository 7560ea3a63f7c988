"""Each scheduler and API process publishes a window of its own metrics beside its load
report (core/metrics_window.py), so the dashboard page sums the whole deployment from
PostgreSQL without a Prometheus server (decision 33).

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("scheduler_load", "api_instances"):
        op.add_column(table, sa.Column("metrics", JSONB, nullable=False, server_default="{}"))


def downgrade() -> None:
    for table in ("scheduler_load", "api_instances"):
        op.drop_column(table, "metrics")
