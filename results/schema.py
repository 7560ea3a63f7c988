"""Table definitions (SQLAlchemy Core). The schema itself changes only through
Alembic migrations in migrations/; this module mirrors the latest revision so
queries are written against typed columns."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import BYTEA, JSONB, UUID

from core.request_row import NOT_STORED, RequestRow
from core.vocab import TIERS, RequestStatus

metadata = MetaData()

# A job's item counters, by how its items ended.
JOB_COUNTERS = ("succeeded", "failed", "expired", "cancelled")


def written_at(name: str) -> Column[Any]:
    """A time the database sets when the row is written (``now()``)."""
    return Column(name, DateTime(timezone=True), nullable=False, server_default=func.now())


def json_object(name: str) -> Column[Any]:
    """A JSON object, ``{}`` until one is written."""
    return Column(name, JSONB, nullable=False, server_default="{}")


def counter(name: str, type_: type[Integer] = Integer) -> Column[Any]:
    """A count that starts at 0."""
    return Column(name, type_, nullable=False, server_default="0")


def version_key() -> tuple[Column[Any], Column[Any]]:
    """(name, version): one version of one model, in the key of the registry's tables."""
    return Column("name", Text, primary_key=True), Column("version", Text, primary_key=True)


tenants = Table(
    "tenants",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True, server_default=func.gen_random_uuid()),
    Column("name", Text, nullable=False, unique=True),
    Column("tier", Text, nullable=False),
    written_at("created_at"),
    # The tenant's plan: its share inside its tier, and overrides of the tier's limits.
    Column("weight", Float, nullable=False, server_default="1"),
    Column("rate_rps", Float),
    Column("burst", Float),
    Column("job_items_per_s", Float),
    # Days its rows stay in the request log; NULL: the deployment's default
    # (results/retention.py).
    Column("log_retention_days", Integer),
    CheckConstraint(
        f"tier in ({', '.join(repr(str(t)) for t in TIERS)})", name="tenants_tier_check"
    ),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True, server_default=func.gen_random_uuid()),
    Column("tenant_id", UUID(as_uuid=False), ForeignKey("tenants.id"), nullable=False),
    # sha256 of the key: keys are random and long, so a fast hash is enough and
    # lets every request be authenticated with one indexed lookup.
    Column("key_hash", Text, nullable=False, unique=True),
    Column("prefix", Text, nullable=False),  # first characters, to recognise a key in listings
    written_at("created_at"),
    Column("revoked_at", DateTime(timezone=True)),
    # Admin scope: operator routes (ingest/operations/admin_auth.py); tenant keys cannot reach them.
    Column("admin", Boolean, nullable=False, server_default="false"),
)

models = Table(
    "models",
    metadata,
    *version_key(),
    Column("max_batch_size", Integer, nullable=False),
    json_object("profile_ms"),
    written_at("last_seen_at"),
)

# The request log and result store: exactly one row per request id. Partitioned by
# range of received_at (results/partitions.py); the key includes it, and every message
# of one request carries the same received_at, so a redelivery meets its first row
# (docs/decisions/0029-compact-results-and-a-partitioned-request-log.md).
requests = Table(
    "requests",
    metadata,
    Column("request_id", UUID(as_uuid=False), primary_key=True),
    Column("tenant_id", UUID(as_uuid=False), nullable=False),
    Column("priority", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("model_version", Text, nullable=False),
    json_object("params"),
    Column("input", JSONB(none_as_null=True)),  # NULL for job items (kept in job_items)
    Column("status", Text, nullable=False),  # a RequestStatus
    Column("output", JSONB(none_as_null=True)),  # NULL for a vector output
    # A vector output as little-endian float32 (results/vectors.py); NULL otherwise.
    # Stored EXTERNAL, rows kept in the heap up to a page (revision 0019, decision 29).
    Column("output_vector", BYTEA),
    Column("error", Text),
    Column("attempts", Integer, nullable=False, server_default="1"),
    Column("batch_id", UUID(as_uuid=False)),
    Column("batch_size", Integer),
    Column("job_id", UUID(as_uuid=False)),
    Column("item_index", Integer),
    Column("received_at", DateTime(timezone=True), nullable=False, primary_key=True),
    Column("produced_at", DateTime(timezone=True)),
    Column("consumed_at", DateTime(timezone=True)),
    Column("batched_at", DateTime(timezone=True)),
    Column("compute_start_at", DateTime(timezone=True)),
    Column("compute_end_at", DateTime(timezone=True)),
    written_at("persisted_at"),
    Column("deadline_at", DateTime(timezone=True)),
    Column("kafka_topic", Text),
    Column("kafka_partition", Integer),
    Column("kafka_offset", BigInteger),
    # What the caller was served as, as its answer echoed it: flex | default | priority
    # (decision 66, revision 0027); NULL for job items and rows written before.
    Column("service_tier", Text),
    CheckConstraint(
        f"status in ({', '.join(repr(str(s)) for s in RequestStatus)})",
        name="requests_status_check",
    ),
    Index("requests_tenant_received", "tenant_id", "received_at"),
    Index("requests_job_item", "job_id", "item_index"),
    Index("requests_received_brin", "received_at", postgresql_using="brin"),
    postgresql_partition_by="RANGE (received_at)",
)


# A generating request's tokens so far, one row per flush of the scheduler that runs it
# (scheduler/runtime/generation/flusher.py, decision 32): what its stream delivered, read by a
# stream that reconnects and by the next owner after a crash. Deleted in the
# transaction that writes the request's final row to ``requests``.
generation_progress = Table(
    "generation_progress",
    metadata,
    Column("request_id", UUID(as_uuid=False), primary_key=True),
    Column("first_index", Integer, primary_key=True),  # the first token's output index
    Column("tenant_id", UUID(as_uuid=False), nullable=False),
    Column("token_ids", JSONB, nullable=False),  # [int, ...]
    Column("texts", JSONB, nullable=False),  # [str, ...]: the text each token released
    written_at("written_at"),
)


REQUEST_ROW_COLUMNS = tuple(k for k in RequestRow.__annotations__ if k not in NOT_STORED)
_DB_STAMPED = {"persisted_at"}
if set(REQUEST_ROW_COLUMNS) != {c.name for c in requests.columns} - _DB_STAMPED:
    raise RuntimeError("RequestRow and the requests table disagree on their columns")

batches = Table(
    "batches",
    metadata,
    Column("batch_id", UUID(as_uuid=False), primary_key=True),
    Column("model", Text, nullable=False),
    Column("model_version", Text, nullable=False),
    Column("batch_key", Text, nullable=False),
    Column("size", Integer, nullable=False),
    Column("reason", Text, nullable=False),  # full | linger | deadline | priority | retry
    Column("worker_id", Text),
    Column("status", Text, nullable=False),
    Column("error", Text),
    Column("formed_at", DateTime(timezone=True), nullable=False),
    # When its worker read it and began launching it (migration 0030): formed_at to
    # compute_start_at is the way to the worker, its queue, then the device's.
    Column("worker_received_at", DateTime(timezone=True)),
    Column("launched_at", DateTime(timezone=True)),
    Column("compute_start_at", DateTime(timezone=True)),
    Column("compute_end_at", DateTime(timezone=True)),
    Column("compute_ms", Float),
    # {tier: {tenant id: [device ms received, device ms entitled]}} (decision 65)
    Column("shares", JSONB),
    written_at("persisted_at"),
    Index("batches_formed", "formed_at"),
)

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("tenant_id", UUID(as_uuid=False), primary_key=True),
    Column("key", Text, primary_key=True),
    Column("request_id", UUID(as_uuid=False), nullable=False),
    Column("body_hash", Text, nullable=False),
    # When the first attempt's caller gave up: a retry after it re-sends the request,
    # in case the first attempt died between claiming the key and reaching Kafka.
    Column("deadline_at", DateTime(timezone=True), nullable=False),
    written_at("created_at"),
    # The first attempt's received_at: a resent request keeps it, so its row lands where
    # the first attempt's would (the request log's partition key). NULL: claimed before
    # the column existed.
    Column("received_at", DateTime(timezone=True)),
    # The version routing picked for the first attempt: a retry runs on it whatever
    # routing decides since (decision 44). NULL: claimed before the column existed.
    Column("model_version", Text),
    Index("idempotency_keys_created", "created_at"),
)

jobs = Table(
    "jobs",
    metadata,
    Column("job_id", UUID(as_uuid=False), primary_key=True),
    Column("tenant_id", UUID(as_uuid=False), nullable=False),
    Column("model", Text, nullable=False),
    Column("model_version", Text, nullable=False),
    json_object("params"),
    Column("metadata", JSONB),
    Column("total_items", Integer, nullable=False),
    Column("submit_state", Text, nullable=False, server_default="submitting"),
    Column(
        "submit_heartbeat_at", DateTime(timezone=True), nullable=False, server_default=func.now()
    ),
    *(counter(c) for c in JOB_COUNTERS),
    counter("attempt"),
    written_at("created_at"),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("cancelled_at", DateTime(timezone=True)),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("idempotency_key", Text),
    Column("body_hash", Text),
    Column("webhook_url", Text),
    Column("webhook_secret", Text),
    counter("webhook_attempts"),
    Column("webhook_next_at", DateTime(timezone=True)),
    Column("webhook_delivered_at", DateTime(timezone=True)),
    Column("webhook_error", Text),
    # output_expires_after (OpenAI's batches): its items' results and inputs are deleted
    # at this time (results/sweeper.py), then output_expired_at is set. NULL: they live
    # as long as the tenant's request log retention.
    Column("output_expires_at", DateTime(timezone=True)),
    Column("output_expired_at", DateTime(timezone=True)),
    # An incremental job (decision 61): the job it reused results of, and how many of its
    # items took a stored result instead of being computed (fixed at submission).
    Column("base_job_id", UUID(as_uuid=False)),
    counter("reused"),
    Index(
        "jobs_webhook_due",
        "webhook_next_at",
        postgresql_where=text("webhook_next_at IS NOT NULL AND webhook_delivered_at IS NULL"),
    ),
    Index(
        "jobs_idempotency_created",
        "created_at",
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
)

# Each tenant's job-item token bucket (results/job_quota.py).
job_item_budgets = Table(
    "job_item_budgets",
    metadata,
    Column("tenant_id", UUID(as_uuid=False), primary_key=True),
    Column("tokens", Float),  # NULL: never charged; negative: a large job's debt
    written_at("updated_at"),
)

job_items = Table(
    "job_items",
    metadata,
    Column("job_id", UUID(as_uuid=False), primary_key=True),
    Column("item_index", Integer, primary_key=True),
    Column("custom_id", Text),
    Column("input", JSONB, nullable=False),
    Column("request_id", UUID(as_uuid=False), nullable=False),
    counter("attempt"),
    # sha256 of what decides the item's output (ingest/jobs/incremental.py); NULL for
    # items staged before revision 0022. ``reused``: written by releases before decision
    # 61's amendment only; a reused item is now told by its result row's attempts = 0
    # (results/job_items.py), and a later migration may drop the column.
    Column("content_hash", BYTEA),
    Column("reused", Boolean, nullable=False, server_default="false"),
)

# Each result writer's counts of a job's current attempt (migration 0025, decision 64).
job_counts = Table(
    "job_counts",
    metadata,
    Column(
        "job_id",
        UUID(as_uuid=False),
        ForeignKey("jobs.job_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("attempt", Integer, primary_key=True),
    Column("writer", UUID(as_uuid=False), primary_key=True),
    *(counter(c) for c in JOB_COUNTERS),
)

# A view (migration 0025): a job's counters as they stand, the job row's plus its
# writers' counts. Described apart from ``metadata``: it is not a table to create.
job_progress = Table(
    "job_progress",
    MetaData(),
    Column("job_id", UUID(as_uuid=False), primary_key=True),
    *(Column(c, Integer) for c in JOB_COUNTERS),
)

api_instances = Table(
    "api_instances",
    metadata,
    Column("instance_id", Text, primary_key=True),
    written_at("last_seen_at"),
    # this process's metrics window (core/metrics_window.py), for the dashboard
    json_object("metrics"),
)

scheduler_load = Table(
    "scheduler_load",
    metadata,
    Column("scheduler_id", Text, primary_key=True),
    json_object("capacity"),
    json_object("backlog"),
    json_object("lag"),
    # the largest tenants' queues per model ref and class (results.load.REST: the rest)
    json_object("tenant_backlog"),
    # this scheduler's metrics window (core/metrics_window.py), for the dashboard
    json_object("metrics"),
    # generation model ref -> its KV cache (core.load_report.KVState), for KV admission
    json_object("kv"),
    written_at("updated_at"),
)

# Refused requests (401, 429, 503, 504), counted per second, tenant, tier, status and
# reason by each API process and written about once a second (ingest/edge/refusal_counts.py):
# an overload never becomes a row per refusal. Partitioned by range of ``at``.
refusals = Table(
    "refusals",
    metadata,
    Column("at", DateTime(timezone=True), nullable=False),  # the second (truncated)
    Column("tenant_id", UUID(as_uuid=False)),  # NULL: no tenant (a bad key)
    Column("tier", Text),
    Column("status", SmallInteger, nullable=False),
    Column("reason", Text, nullable=False),
    Column("count", Integer, nullable=False),
    Index("refusals_at", "at"),
    Index("refusals_tenant_at", "tenant_id", "at"),
    postgresql_partition_by="RANGE (at)",
)

# When an API instance gave up on a sync request (its 504): a row stored after this
# time is a late answer (the view late_answers). Partitioned like the request log and
# keyed like it, so it joins a request's row in one partition.
answer_timeouts = Table(
    "answer_timeouts",
    metadata,
    Column("request_id", UUID(as_uuid=False), primary_key=True),
    Column("received_at", DateTime(timezone=True), primary_key=True),
    Column("tenant_id", UUID(as_uuid=False), nullable=False),
    Column("gave_up_at", DateTime(timezone=True), nullable=False),
    postgresql_partition_by="RANGE (received_at)",
)

# --- OpenAI's Files and Batches APIs (decision 35) ---

# An uploaded file, tenant-scoped; its bytes are in stored_file_chunks.
stored_files = Table(
    "stored_files",
    metadata,
    Column("file_id", Text, primary_key=True),
    Column("tenant_id", UUID(as_uuid=False), nullable=False),
    Column("purpose", Text, nullable=False),
    Column("filename", Text, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    written_at("created_at"),
    # Past it the file is gone for its tenant and the sweeper deletes it (decision 42).
    Column("expires_at", DateTime(timezone=True)),
    Index("stored_files_tenant_created", "tenant_id", "created_at"),
    Index("stored_files_expires", "expires_at", postgresql_where=text("expires_at IS NOT NULL")),
)

# A file's bytes in pieces of at most results.files.CHUNK_BYTES, so neither an upload
# nor a download ever holds a whole file in memory.
stored_file_chunks = Table(
    "stored_file_chunks",
    metadata,
    Column(
        "file_id",
        Text,
        ForeignKey("stored_files.file_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("seq", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)

# An OpenAI batch: a job (its items, results, status) plus what OpenAI's object names.
openai_batches = Table(
    "openai_batches",
    metadata,
    Column("batch_id", Text, primary_key=True),
    Column("tenant_id", UUID(as_uuid=False), nullable=False),
    Column("job_id", UUID(as_uuid=False), nullable=False, unique=True),
    Column("endpoint", Text, nullable=False),
    Column("input_file_id", Text, nullable=False),
    Column("completion_window", Text, nullable=False),
    Column("metadata", JSONB),
    Column("item_params", JSONB),  # per-endpoint options for the answer (encoding_format)
    written_at("created_at"),
    Column("output_expires_at", DateTime(timezone=True)),
    Index("openai_batches_tenant_created", "tenant_id", "created_at"),
)

# --- The durability ledger (gristmill/ledger/, decision 54) ---

# Where the ledger of a consumer group stands on each request-topic partition: every
# message below next_offset is counted in ledger_counts, and every message appended
# before settled_through is below it. Advanced in the transaction that adds the counts,
# only from the offset its writer read (a compare-and-set): a redelivery or a second
# instance never counts a message twice.
ledger_partitions = Table(
    "ledger_partitions",
    metadata,
    Column("consumer_group", Text, primary_key=True),
    Column("topic", Text, primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("next_offset", BigInteger, nullable=False),
    Column("settled_through", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# Counted messages by tenant and minute of their received time: accepted (distinct
# requests: terminal + missing) and the copies of a request already counted (duplicate).
ledger_counts = Table(
    "ledger_counts",
    metadata,
    Column("consumer_group", Text, primary_key=True),
    Column("tenant_id", UUID(as_uuid=False), primary_key=True),
    Column("minute", DateTime(timezone=True), primary_key=True),
    counter("accepted", BigInteger),
    counter("terminal", BigInteger),
    counter("missing", BigInteger),
    counter("duplicate", BigInteger),
)

# Messages read and not yet counted, per partition (replaced at each store): an export's
# pending. Small: what the ledger holds in memory.
ledger_pending = Table(
    "ledger_pending",
    metadata,
    Column("consumer_group", Text, primary_key=True),
    Column("topic", Text, primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("tenant_id", UUID(as_uuid=False), primary_key=True),
    Column("minute", DateTime(timezone=True), primary_key=True),
    Column("pending", BigInteger, nullable=False),
)

# Each message found missing, by name, for the operator who gets the alert.
ledger_missing = Table(
    "ledger_missing",
    metadata,
    Column("consumer_group", Text, primary_key=True),
    Column("topic", Text, primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("kafka_offset", BigInteger, primary_key=True),
    Column("request_id", UUID(as_uuid=False), nullable=False),
    Column("tenant_id", UUID(as_uuid=False), nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False),
    Column("found_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ledger_missing_tenant", "tenant_id", "received_at"),
)
