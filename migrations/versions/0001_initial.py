"""Initial schema: tenants, keys, models, request log, batches, idempotency keys.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column(
            "id", UUID(as_uuid=False), primary_key=True, server_default=sa.text("gen_random_uuid()")
        ),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("tier", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("tier in ('free', 'paid', 'enterprise')", name="tenants_tier_check"),
    )
    op.create_table(
        "api_keys",
        sa.Column(
            "id", UUID(as_uuid=False), primary_key=True, server_default=sa.text("gen_random_uuid()")
        ),
        sa.Column("tenant_id", UUID(as_uuid=False), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("key_hash", sa.Text, nullable=False, unique=True),
        sa.Column("prefix", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
        sa.Column("revoked_at", TS),
    )
    op.create_table(
        "models",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("version", sa.Text, primary_key=True),
        sa.Column("max_batch_size", sa.Integer, nullable=False),
        sa.Column("profile_ms", JSONB, nullable=False, server_default="{}"),
        sa.Column("last_seen_at", TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "requests",
        sa.Column("request_id", UUID(as_uuid=False), primary_key=True),
        sa.Column("tenant_id", UUID(as_uuid=False), nullable=False),
        sa.Column("priority", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("model_version", sa.Text, nullable=False),
        sa.Column("params", JSONB, nullable=False, server_default="{}"),
        sa.Column("input", JSONB),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("output", JSONB),
        sa.Column("error", sa.Text),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="1"),
        sa.Column("batch_id", UUID(as_uuid=False)),
        sa.Column("batch_size", sa.Integer),
        sa.Column("job_id", UUID(as_uuid=False)),
        sa.Column("item_index", sa.Integer),
        sa.Column("received_at", TS, nullable=False),
        sa.Column("produced_at", TS),
        sa.Column("consumed_at", TS),
        sa.Column("batched_at", TS),
        sa.Column("compute_start_at", TS),
        sa.Column("compute_end_at", TS),
        sa.Column("persisted_at", TS, nullable=False, server_default=sa.func.now()),
        sa.Column("deadline_at", TS),
        sa.Column("kafka_topic", sa.Text),
        sa.Column("kafka_partition", sa.Integer),
        sa.Column("kafka_offset", sa.BigInteger),
        sa.CheckConstraint(
            "status in ('succeeded', 'failed', 'expired')", name="requests_status_check"
        ),
    )
    op.create_index("requests_tenant_received", "requests", ["tenant_id", "received_at"])
    op.create_index("requests_job_item", "requests", ["job_id", "item_index"])
    op.create_table(
        "batches",
        sa.Column("batch_id", UUID(as_uuid=False), primary_key=True),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("model_version", sa.Text, nullable=False),
        sa.Column("batch_key", sa.Text, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("worker_id", sa.Text),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("formed_at", TS, nullable=False),
        sa.Column("compute_start_at", TS),
        sa.Column("compute_end_at", TS),
        sa.Column("compute_ms", sa.Float),
        sa.Column("persisted_at", TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "idempotency_keys",
        sa.Column("tenant_id", UUID(as_uuid=False), primary_key=True),
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("request_id", UUID(as_uuid=False), nullable=False),
        sa.Column("body_hash", sa.Text, nullable=False),
        sa.Column("deadline_at", TS, nullable=False),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_index("idempotency_keys_created", "idempotency_keys", ["created_at"])


def downgrade() -> None:
    for table in ("idempotency_keys", "batches", "requests", "models", "api_keys", "tenants"):
        op.drop_table(table)
