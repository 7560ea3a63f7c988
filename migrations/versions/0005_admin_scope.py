"""An admin scope on API keys: operator routes (the dashboard, the model registry)
accept only keys that carry it; a tenant's ordinary key cannot reach them.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "api_keys", sa.Column("admin", sa.Boolean, nullable=False, server_default="false")
    )


def downgrade() -> None:
    op.drop_column("api_keys", "admin")
