"""Compact results and what retention needs, all additive (safe under running code):
vector outputs as float32 bytes (requests.output_vector) and gristmill_vector() to read
them; the request log's future key (request_id, received_at) built concurrently;
per-tenant log retention; jobs' output_expires_at; the first attempt's received_at on
idempotency keys; the refusal counts and answer timeouts tables, partitioned by time.

Old code keeps working after this revision (its upsert still finds the request_id
key), and the code of this revision works before the next one, which partitions the
request log: upgrade a running system by migrating to this revision, rolling the
schedulers and APIs, then migrating to head (docs/decisions/0029).

Revision ID: 0015
Revises: 0014
"""

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import BYTEA

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
# A catalog-only change waits at most this long for its lock (a running system's writes
# queue behind a waiting ALTER); the migration fails rather than stall them, and can be
# run again: every step is idempotent.
LOCK_TIMEOUT = "2s"
# The first partitions of the new tables: from yesterday (late rows of the day before)
# to three days ahead; the sweeper keeps making them from then on.
FIRST_DAYS = range(-1, 4)

# Little-endian IEEE 754 binary32 bytes -> real[], in SQL: analysts read vectors with it.
# Subnormals, infinities and NaN decoded too; 384 values take about 0.2 ms.
VECTOR_FUNCTION = r"""
CREATE OR REPLACE FUNCTION gristmill_vector(v bytea) RETURNS real[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(
        CASE
            WHEN e = 255 AND m = 0 THEN (CASE WHEN s = 1 THEN '-Infinity' ELSE 'Infinity' END)::real
            WHEN e = 255 THEN 'NaN'::real
            WHEN e = 0 THEN ((1 - 2 * s) * m * 2.0::float8 ^ -149)::real
            ELSE ((1 - 2 * s) * (8388608 + m) * 2.0::float8 ^ (e - 150))::real
        END ORDER BY i), '{}')
    FROM (
        SELECT i, (b >> 31) & 1 AS s, (b >> 23) & 255 AS e, b & 8388607 AS m
        FROM (
            SELECT i, (get_byte(v, 4 * i)::bigint)
                    | (get_byte(v, 4 * i + 1)::bigint << 8)
                    | (get_byte(v, 4 * i + 2)::bigint << 16)
                    | (get_byte(v, 4 * i + 3)::bigint << 24) AS b
            FROM generate_series(0, length(v) / 4 - 1) AS i
        ) AS words
    ) AS fields
$$"""


def _index_concurrently(name: str, ddl: str) -> None:
    """CREATE INDEX CONCURRENTLY, idempotent: an invalid leftover of an interrupted
    build is dropped first."""
    bind = op.get_bind()
    state = bind.execute(
        sa.text(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = :n AND c.relnamespace = current_schema()::regnamespace"
        ),
        {"n": name},
    ).scalar()
    if state is True:
        return
    if state is False:
        op.execute(f"DROP INDEX CONCURRENTLY {name}")
    op.execute(ddl)


def _partitioned(name: str, columns: str, key: str, indexes: list[str]) -> None:
    op.execute(f"CREATE TABLE IF NOT EXISTS {name} ({columns}) PARTITION BY RANGE ({key})")
    for ddl in indexes:
        op.execute(ddl)
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    for d in FIRST_DAYS:
        lo = today + timedelta(days=d)
        hi = lo + timedelta(days=1)
        op.execute(
            f"CREATE TABLE IF NOT EXISTS {name}_p{lo:%Y%m%d} PARTITION OF {name} "
            f"FOR VALUES FROM ('{lo.isoformat()}') TO ('{hi.isoformat()}')"
        )


def upgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    bind = op.get_bind()

    def has(table: str, column: str) -> bool:
        return column in {c["name"] for c in sa.inspect(bind).get_columns(table)}

    for table, column, type_ in (
        ("requests", "output_vector", BYTEA),
        ("tenants", "log_retention_days", sa.Integer),
        ("jobs", "output_expires_at", TS),
        ("jobs", "output_expired_at", TS),
        ("idempotency_keys", "received_at", TS),
    ):
        if not has(table, column):  # nullable, no default: catalog only, no rewrite
            op.add_column(table, sa.Column(column, type_))
    op.execute(VECTOR_FUNCTION)
    _partitioned(
        "refusals",
        "at timestamptz NOT NULL, tenant_id uuid, tier text, status smallint NOT NULL, "
        "reason text NOT NULL, count integer NOT NULL",
        "at",
        [
            "CREATE INDEX IF NOT EXISTS refusals_at ON refusals (at)",
            "CREATE INDEX IF NOT EXISTS refusals_tenant_at ON refusals (tenant_id, at)",
        ],
    )
    _partitioned(
        "answer_timeouts",
        "request_id uuid NOT NULL, received_at timestamptz NOT NULL, tenant_id uuid NOT NULL, "
        "gave_up_at timestamptz NOT NULL, PRIMARY KEY (request_id, received_at)",
        "received_at",
        [],
    )
    with op.get_context().autocommit_block():
        # The partitioned log's key, and a BRIN index for scans by time; built without
        # blocking writes (minutes on a large log).
        _index_concurrently(
            "requests_key",
            "CREATE UNIQUE INDEX CONCURRENTLY requests_key ON requests (request_id, received_at)",
        )
        _index_concurrently(
            "requests_received_brin",
            "CREATE INDEX CONCURRENTLY requests_received_brin ON requests USING brin (received_at)",
        )
        # Batches by time: the analysts' batch fill, and retention's deletes.
        _index_concurrently(
            "batches_formed", "CREATE INDEX CONCURRENTLY batches_formed ON batches (formed_at)"
        )
        _index_concurrently(
            "jobs_output_due",
            "CREATE INDEX CONCURRENTLY jobs_output_due ON jobs (output_expires_at) "
            "WHERE output_expired_at IS NULL AND output_expires_at IS NOT NULL",
        )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS jobs_output_due")
    op.execute("DROP INDEX IF EXISTS batches_formed")
    op.execute("DROP INDEX IF EXISTS requests_received_brin")
    op.execute("DROP INDEX IF EXISTS requests_key")
    op.execute("DROP TABLE IF EXISTS answer_timeouts")
    op.execute("DROP TABLE IF EXISTS refusals")
    op.execute("DROP FUNCTION IF EXISTS gristmill_vector(bytea)")
    for table, column in (
        ("idempotency_keys", "received_at"),
        ("jobs", "output_expired_at"),
        ("jobs", "output_expires_at"),
        ("tenants", "log_retention_days"),
        ("requests", "output_vector"),
    ):
        op.drop_column(table, column)
