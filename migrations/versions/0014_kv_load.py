"""The scheduler running a generation model publishes its KV cache beside its load
report (pool, blocks in use, blocks wanted per class, decode rate), so the API admits
completions from KV capacity (decision 32, core/load_report.py's KVState).

Revision ID: 0014
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0014"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("scheduler_load", sa.Column("kv", JSONB, nullable=False, server_default="{}"))


def downgrade() -> None:
    op.drop_column("scheduler_load", "kv")
