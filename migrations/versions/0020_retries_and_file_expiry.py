"""A retry keeps the version its first attempt was routed to, and files expire.

``idempotency_keys.model_version``: the version routing picked for the request a key
names; a retry with the key runs on it whatever routing decided since (decision 44).
NULL: claimed before the column existed (such a retry goes where routing says now).

``stored_files_expires``: the sweeper finds files past their ``expires_at`` without
reading every file (decision 42); files without an expiry are not indexed.

Online: a nullable column without a default is a catalog change; the index is built
CONCURRENTLY (outside the migration's transaction), so uploads never wait for it.

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("idempotency_keys", sa.Column("model_version", sa.Text))
    with op.get_context().autocommit_block():
        op.create_index(
            "stored_files_expires",
            "stored_files",
            ["expires_at"],
            postgresql_where=sa.text("expires_at IS NOT NULL"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(
            "stored_files_expires",
            table_name="stored_files",
            postgresql_concurrently=True,
            if_exists=True,
        )
    op.drop_column("idempotency_keys", "model_version")
