"""The request log's vectors stored EXTERNAL, and rows kept in the heap up to 8,160 bytes.

``output_vector`` (float32 bytes) goes from the default storage EXTENDED to EXTERNAL:
PostgreSQL no longer tries to compress it (a model's floats do not compress; the
attempt only cost CPU). Every partition of ``requests`` gets ``toast_tuple_target =
8160``, so a row that fits in a page stays in the heap instead of being moved into the
TOAST table (one heap insert and one index insert fewer per row). Measured in
docs/bench/store.md ("Vectors of other widths"); why, in
docs/decisions/0029-compact-results-and-a-partitioned-request-log.md. Partitions made
later get both from results/partitions.py (a partitioned table's storage parameters
are not inherited).

Online: only catalog entries change, nothing is rewritten. Each statement waits for its
lock at most ``LOCK_TIMEOUT_MS`` and is tried again, so writers never queue long behind
it. Rows already stored stay as they were written (a 384-wide vector inline, a wider one
compressed-if-it-ever-did and out of line in the TOAST table) and read the same; only
rows written from now on are stored the new way. The old rows leave with their
partitions under the retention.

Revision ID: 0019
Revises: 0018
"""

import time

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# As in 0016: writers queue behind a waiting lock, so it waits little and is retried.
LOCK_TIMEOUT_MS = 300
LOCK_TRIES = 100
LOCK_PAUSE_S = 1.0
# The value results/partitions.py gives new partitions (REQUESTS_TOAST_TUPLE_TARGET);
# written out here so this revision stays as it was whatever that constant becomes.
TOAST_TUPLE_TARGET = 8160

_PARTITIONS = """
    SELECT c.relname FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    JOIN pg_class p ON p.oid = i.inhparent
    WHERE p.relname = 'requests' AND p.relnamespace = current_schema()::regnamespace
      AND c.relkind = 'r'
    ORDER BY 1"""


def _retrying(bind: sa.Connection, sql: str) -> None:
    for tries in range(1, LOCK_TRIES + 1):
        savepoint = bind.begin_nested()
        try:
            bind.execute(sa.text(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}"))
            bind.execute(sa.text(sql))
            savepoint.commit()
            return
        except sa.exc.OperationalError as exc:
            savepoint.rollback()
            if "lock timeout" not in str(exc) or tries == LOCK_TRIES:
                raise
            time.sleep(LOCK_PAUSE_S)


def _partitions(bind: sa.Connection) -> list[str]:
    return [r[0] for r in bind.execute(sa.text(_PARTITIONS))]


def upgrade() -> None:
    bind = op.get_bind()
    # On the partitioned parent, this reaches every partition too.
    _retrying(bind, "ALTER TABLE requests ALTER COLUMN output_vector SET STORAGE EXTERNAL")
    for name in _partitions(bind):
        _retrying(bind, f"ALTER TABLE {name} SET (toast_tuple_target = {TOAST_TUPLE_TARGET})")


def downgrade() -> None:
    """As online as the upgrade; rows written meanwhile stay as they were stored."""
    bind = op.get_bind()
    _retrying(bind, "ALTER TABLE requests ALTER COLUMN output_vector SET STORAGE EXTENDED")
    for name in _partitions(bind):
        _retrying(bind, f"ALTER TABLE {name} RESET (toast_tuple_target)")
