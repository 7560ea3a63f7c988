"""Model lifecycle: the registry of versions (backend, artifact, sha256, state), its
audit trail, per-scheduler readiness of each version, cost curves per worker class,
and replay reports. Managed through operator routes that need an admin key (0005).

Revision ID: 0012
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0012"
down_revision = "0008"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
STATES = "('staged', 'canary', 'live', 'retired')"


def upgrade() -> None:
    op.create_table(
        "model_names",
        sa.Column("name", sa.Text, primary_key=True),
        # The version that was live before the last promote: where a rollback goes.
        sa.Column("previous_live", sa.Text),
        # What keeps a caller on one side of a canary: its tenant, or its Idempotency-Key.
        sa.Column("sticky", sa.Text, nullable=False, server_default="tenant"),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("sticky in ('tenant', 'idempotency_key')", name="model_names_sticky"),
    )
    op.create_table(
        "model_versions",
        sa.Column("name", sa.Text, sa.ForeignKey("model_names.name"), primary_key=True),
        sa.Column("version", sa.Text, primary_key=True),
        sa.Column("backend", sa.Text, nullable=False),
        sa.Column("artifact", sa.Text, nullable=False, server_default=""),
        sa.Column("sha256", sa.Text, nullable=False, server_default=""),
        sa.Column("config", JSONB, nullable=False, server_default="{}"),
        sa.Column("max_batch_size", sa.Integer, nullable=False),
        sa.Column("memory_bytes", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("state", sa.Text, nullable=False, server_default="staged"),
        sa.Column("canary_share", sa.Float, nullable=False, server_default="0"),
        sa.Column("created_by", sa.Text, nullable=False, server_default=""),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint(f"state in {STATES}", name="model_versions_state"),
        sa.CheckConstraint("canary_share >= 0 and canary_share <= 1", name="model_versions_share"),
        sa.CheckConstraint("max_batch_size >= 1", name="model_versions_batch"),
    )
    # At most one live and one canary version per model, whatever a client races.
    op.create_index(
        "model_versions_one_live",
        "model_versions",
        ["name"],
        unique=True,
        postgresql_where=sa.text("state = 'live'"),
    )
    op.create_index(
        "model_versions_one_canary",
        "model_versions",
        ["name"],
        unique=True,
        postgresql_where=sa.text("state = 'canary'"),
    )
    op.create_table(
        "model_audit",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("at", TS, nullable=False, server_default=sa.func.now()),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("version", sa.Text),
        sa.Column("detail", JSONB, nullable=False, server_default="{}"),
    )
    op.create_index("model_audit_name_at", "model_audit", ["name", "at"])
    op.create_table(
        "model_readiness",
        sa.Column("scheduler_id", sa.Text, primary_key=True),
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("version", sa.Text, primary_key=True),
        sa.Column("ready_workers", sa.Integer, nullable=False, server_default="0"),
        sa.Column("loading_workers", sa.Integer, nullable=False, server_default="0"),
        # Workers whose upstream is down (an HTTP backend's open circuit) or that failed
        # to load it (a sha256 mismatch), with why and when to try again.
        sa.Column("unavailable_workers", sa.Integer, nullable=False, server_default="0"),
        sa.Column("failed_workers", sa.Integer, nullable=False, server_default="0"),
        sa.Column("error", sa.Text),
        sa.Column("retry_after_s", sa.Float),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "model_curves",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("version", sa.Text, primary_key=True),
        sa.Column("worker_class", sa.Text, primary_key=True),
        sa.Column("max_batch_size", sa.Integer, nullable=False),
        sa.Column("profile_ms", JSONB, nullable=False, server_default="{}"),
        sa.Column("workers", sa.Integer, nullable=False, server_default="0"),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "model_replays",
        sa.Column("replay_id", UUID(as_uuid=False), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("candidate", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("since", TS, nullable=False),
        sa.Column("started_at", TS, nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", TS),
        sa.Column("items", sa.Integer, nullable=False, server_default="0"),
        sa.Column("passed", sa.Boolean),
        sa.Column("report", JSONB, nullable=False, server_default="{}"),
    )
    op.create_index("model_replays_candidate", "model_replays", ["name", "candidate"])


def downgrade() -> None:
    op.drop_index("model_replays_candidate", table_name="model_replays")
    op.drop_table("model_replays")
    op.drop_table("model_curves")
    op.drop_table("model_readiness")
    op.drop_index("model_audit_name_at", table_name="model_audit")
    op.drop_table("model_audit")
    op.drop_index("model_versions_one_canary", table_name="model_versions")
    op.drop_index("model_versions_one_live", table_name="model_versions")
    op.drop_table("model_versions")
    op.drop_table("model_names")
