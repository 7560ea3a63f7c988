"""OpenAI's Files and Batches APIs: uploaded files (bytes in chunks) and the batch
objects that name a job (decision 35).

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stored_files",
        sa.Column("file_id", sa.Text, primary_key=True),
        sa.Column("tenant_id", UUID(as_uuid=False), nullable=False),
        sa.Column("purpose", sa.Text, nullable=False),
        sa.Column("filename", sa.Text, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True)),
    )
    op.create_index("stored_files_tenant_created", "stored_files", ["tenant_id", "created_at"])
    op.create_table(
        "stored_file_chunks",
        sa.Column(
            "file_id",
            sa.Text,
            sa.ForeignKey("stored_files.file_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "openai_batches",
        sa.Column("batch_id", sa.Text, primary_key=True),
        sa.Column("tenant_id", UUID(as_uuid=False), nullable=False),
        sa.Column("job_id", UUID(as_uuid=False), nullable=False, unique=True),
        sa.Column("endpoint", sa.Text, nullable=False),
        sa.Column("input_file_id", sa.Text, nullable=False),
        sa.Column("completion_window", sa.Text, nullable=False),
        sa.Column("metadata", JSONB),
        sa.Column("item_params", JSONB),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("output_expires_at", sa.DateTime(timezone=True)),
    )
    op.create_index("openai_batches_tenant_created", "openai_batches", ["tenant_id", "created_at"])


def downgrade() -> None:
    op.drop_table("openai_batches")
    op.drop_table("stored_file_chunks")
    op.drop_table("stored_files")
