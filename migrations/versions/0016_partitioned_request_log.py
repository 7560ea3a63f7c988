"""The request log partitioned by time (range of received_at), online.

The existing table is not copied: it becomes the new table's first partition, holding
every time before a cutover two days ahead. Steps, none of which blocks writers for
longer than a catalog change:

1. a CHECK constraint ``received_at < cutover`` is added NOT VALID (a brief lock) and
   then validated (a scan that takes no lock writers wait for);
2. one short transaction, retried while its lock is not granted within
   ``LOCK_TIMEOUT_MS``: the table is renamed ``requests_legacy`` (its indexes too), its
   single-column key dropped, a partitioned ``requests`` made with the same columns, the
   key (request_id, received_at) and the same indexes, and the old table attached as
   the partition FROM (MINVALUE) TO (cutover): the validated constraint spares the
   attach a scan, and the indexes built by the previous revision are adopted as the
   partition's; then daily partitions from the cutover, three days of them.

The old table's rows are then dropped with it, as one partition, once they are all
older than the retention. docs/decisions/0029-compact-results-and-a-partitioned-request-log.md.

Revision ID: 0016
Revises: 0015
"""

import re
import time
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# The swap's lock: writers queue behind it while it waits, so it waits little and is
# tried again (a persist transaction takes milliseconds; a long analyst query is waited
# out by retrying, not by holding every writer).
LOCK_TIMEOUT_MS = 300
LOCK_TRIES = 100
LOCK_PAUSE_S = 1.0
CUTOVER_DAYS = 2
FIRST_PARTITIONS = 3

_INDEX_RENAMES = (
    ("requests_key", "requests_legacy_key"),
    ("requests_tenant_received", "requests_legacy_tenant_received"),
    ("requests_job_item", "requests_legacy_job_item"),
    ("requests_received_brin", "requests_legacy_received_brin"),
)


def _is_partitioned(bind: sa.Connection) -> bool:
    kind = bind.execute(
        sa.text(
            "SELECT relkind FROM pg_class WHERE relname = 'requests' "
            "AND relnamespace = current_schema()::regnamespace"
        )
    ).scalar()
    return kind == "p"


def _cutover() -> datetime:
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today + timedelta(days=CUTOVER_DAYS)


def _existing_bound(bind: sa.Connection) -> datetime | None:
    """The cutover of a bound constraint left by an interrupted earlier run."""
    bind.execute(sa.text("SET LOCAL timezone = 'UTC'"))
    expr = bind.execute(
        sa.text(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conname = 'requests_legacy_bound'"
        )
    ).scalar()
    m = re.search(r"'([^']+)'", expr or "")
    return None if m is None else datetime.fromisoformat(m.group(1))


def _swap(bind: sa.Connection, cutover: datetime) -> None:
    c = cutover.isoformat()
    statements = [
        f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}",
        "LOCK TABLE requests IN ACCESS EXCLUSIVE MODE",
        "ALTER TABLE requests RENAME TO requests_legacy",
        *(f"ALTER INDEX {old} RENAME TO {new}" for old, new in _INDEX_RENAMES),
        # Its key becomes (request_id, received_at), built by the previous revision; as a
        # constraint, so the attach adopts it as the partition's part of the new key
        # (an index without one would be built again, under the lock).
        "ALTER TABLE requests_legacy DROP CONSTRAINT requests_pkey",
        "ALTER TABLE requests_legacy ADD CONSTRAINT requests_legacy_pkey "
        "PRIMARY KEY USING INDEX requests_legacy_key",
        # Same columns in the same order, defaults, NOT NULLs and the status CHECK
        # (which a partition must share by name); the bound is the legacy table's own.
        "CREATE TABLE requests (LIKE requests_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        " PARTITION BY RANGE (received_at)",
        "ALTER TABLE requests DROP CONSTRAINT requests_legacy_bound",
        "ALTER TABLE requests ADD CONSTRAINT requests_pkey PRIMARY KEY (request_id, received_at)",
        "CREATE INDEX requests_tenant_received ON requests (tenant_id, received_at)",
        "CREATE INDEX requests_job_item ON requests (job_id, item_index)",
        "CREATE INDEX requests_received_brin ON requests USING brin (received_at)",
        f"ALTER TABLE requests ATTACH PARTITION requests_legacy "
        f"FOR VALUES FROM (MINVALUE) TO ('{c}')",
        "ALTER TABLE requests_legacy DROP CONSTRAINT requests_legacy_bound",
    ]
    for d in range(FIRST_PARTITIONS):
        lo = cutover + timedelta(days=d)
        hi = lo + timedelta(days=1)
        statements.append(
            f"CREATE TABLE requests_p{lo:%Y%m%d} PARTITION OF requests "
            f"FOR VALUES FROM ('{lo.isoformat()}') TO ('{hi.isoformat()}')"
        )
    for tries in range(1, LOCK_TRIES + 1):
        savepoint = bind.begin_nested()
        try:
            for sql in statements:
                bind.execute(sa.text(sql))
            savepoint.commit()
            return
        except sa.exc.OperationalError as exc:
            savepoint.rollback()
            if "lock timeout" not in str(exc) or tries == LOCK_TRIES:
                raise
            time.sleep(LOCK_PAUSE_S)


def upgrade() -> None:
    bind = op.get_bind()
    if _is_partitioned(bind):
        return
    cutover = _existing_bound(bind)
    if cutover is None or cutover < datetime.now(UTC) + timedelta(hours=12):
        if cutover is not None:  # too close to now to be safe: a new one
            op.execute("ALTER TABLE requests DROP CONSTRAINT requests_legacy_bound")
        cutover = _cutover()
        op.execute("SET LOCAL lock_timeout = '2s'")
        op.execute(
            "ALTER TABLE requests ADD CONSTRAINT requests_legacy_bound "
            f"CHECK (received_at < '{cutover.isoformat()}') NOT VALID"
        )
    with op.get_context().autocommit_block():
        op.execute("ALTER TABLE requests VALIDATE CONSTRAINT requests_legacy_bound")
    _swap(bind, cutover)


def downgrade() -> None:
    """Offline: every row is copied into a plain table (writers wait meanwhile)."""
    op.execute("LOCK TABLE requests IN ACCESS EXCLUSIVE MODE")
    op.execute(
        "CREATE TABLE requests_flat (LIKE requests INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
    )
    op.execute("INSERT INTO requests_flat SELECT * FROM requests")
    op.execute("DROP TABLE requests")
    op.execute("ALTER TABLE requests_flat RENAME TO requests")
    op.execute("ALTER TABLE requests ADD CONSTRAINT requests_pkey PRIMARY KEY (request_id)")
    op.execute("CREATE UNIQUE INDEX requests_key ON requests (request_id, received_at)")
    op.execute("CREATE INDEX requests_tenant_received ON requests (tenant_id, received_at)")
    op.execute("CREATE INDEX requests_job_item ON requests (job_id, item_index)")
    op.execute("CREATE INDEX requests_received_brin ON requests USING brin (received_at)")
