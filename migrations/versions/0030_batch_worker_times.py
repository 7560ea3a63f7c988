"""When a batch's worker read it and began launching it: ``batches.worker_received_at``
and ``batches.launched_at``, so the wait between a batch's forming and its compute
splits into the way to the worker, the worker's queue and the device's (r18 on the GPU
host found sync batches waiting 110-270 ms there beside a job, and nothing said where).

Online: two nullable columns, no default: PostgreSQL adds them without rewriting the
table; rows written before have them empty.

Revision ID: 0030
Revises: 0029
"""

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("worker_received_at", sa.DateTime(timezone=True)))
    op.add_column("batches", sa.Column("launched_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("batches", "launched_at")
    op.drop_column("batches", "worker_received_at")
