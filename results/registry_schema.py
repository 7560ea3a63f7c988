"""The model registry's tables (migrations/versions/0012_model_registry.py), beside
results/schema.py and in its metadata."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

from results.schema import counter, json_object, metadata, version_key, written_at

model_names = Table(
    "model_names",
    metadata,
    Column("name", Text, primary_key=True),
    Column("previous_live", Text),  # where a rollback goes
    Column("sticky", Text, nullable=False, server_default="tenant"),
    written_at("created_at"),
    written_at("updated_at"),
)

model_versions = Table(
    "model_versions",
    metadata,
    *version_key(),
    Column("backend", Text, nullable=False),
    Column("artifact", Text, nullable=False, server_default=""),
    Column("sha256", Text, nullable=False, server_default=""),
    json_object("config"),
    Column("max_batch_size", Integer, nullable=False),
    Column("memory_bytes", BigInteger, nullable=False, server_default="0"),
    Column("state", Text, nullable=False, server_default="staged"),  # a VersionState
    Column("canary_share", Float, nullable=False, server_default="0"),
    Column("created_by", Text, nullable=False, server_default=""),
    written_at("created_at"),
    written_at("updated_at"),
)

model_audit = Table(
    "model_audit",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    written_at("at"),
    Column("actor", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("version", Text),
    json_object("detail"),
)

model_readiness = Table(
    "model_readiness",
    metadata,
    Column("scheduler_id", Text, primary_key=True),
    *version_key(),
    counter("ready_workers"),
    counter("loading_workers"),
    counter("unavailable_workers"),
    counter("failed_workers"),
    Column("error", Text),
    Column("retry_after_s", Float),
    written_at("updated_at"),
)

model_curves = Table(
    "model_curves",
    metadata,
    *version_key(),
    Column("worker_class", Text, primary_key=True),
    Column("max_batch_size", Integer, nullable=False),
    json_object("profile_ms"),
    counter("workers"),
    written_at("updated_at"),
)

model_replays = Table(
    "model_replays",
    metadata,
    Column("replay_id", UUID(as_uuid=False), primary_key=True),
    Column("name", Text, nullable=False),
    Column("candidate", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("since", DateTime(timezone=True), nullable=False),
    written_at("started_at"),
    Column("finished_at", DateTime(timezone=True)),
    counter("items"),
    Column("passed", Boolean),
    json_object("report"),
)

# A corpus re-embedded by a new version (migration 0029, decision 68): the migration job
# (a job of the corpus's tenant, pinned to ``to_version``) and what it was made from.
# Coverage is that job's progress (job_progress), read where it is shown.
model_migrations = Table(
    "model_migrations",
    metadata,
    Column("job_id", UUID(as_uuid=False), primary_key=True),
    Column("name", Text, nullable=False),
    Column("from_version", Text, nullable=False),
    Column("to_version", Text, nullable=False),
    Column("tenant_id", UUID(as_uuid=False), nullable=False),
    Column("corpus", JSONB, nullable=False),
    Column("created_by", Text, nullable=False),
    written_at("created_at"),
    Index("model_migrations_name", "name", "from_version"),
)
