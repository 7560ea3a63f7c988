"""The request log says which service tier ran each request (decision 66): ``flex``,
``default`` or ``priority`` as the answer echoed it; NULL for job items and for rows
written before this revision.

Online: one nullable column, added without rewriting any partition.

Revision ID: 0027
Revises: 0026
"""

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("requests", sa.Column("service_tier", sa.Text))


def downgrade() -> None:
    op.drop_column("requests", "service_tier")
