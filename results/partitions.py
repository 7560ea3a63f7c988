"""Time partitions of the log tables in PostgreSQL: list, create ahead, drop old.

Both changes are made without blocking writers. A partition is created as a plain
table and then attached (``ATTACH PARTITION`` takes only a SHARE UPDATE EXCLUSIVE lock
on the parent, which inserts do not wait for; ``CREATE TABLE .. PARTITION OF`` would
take an ACCESS EXCLUSIVE one). A partition is detached with ``DETACH .. CONCURRENTLY``
(no lock that blocks readers or writers; it waits for queries that may still read it)
and then dropped. That is why the tables have no DEFAULT partition: PostgreSQL allows
a concurrent detach only without one. Every DDL statement runs with a short
``lock_timeout``, so one never queues in front of the writers; it is retried at the
next sweep. What to create and drop is decided in results/retention.py.

A partition is made with the parent's column storage (``INCLUDING STORAGE``, the
request log's vectors are stored EXTERNAL) and the table's storage parameters, which a
partition does not inherit from its partitioned parent (see ``TABLE_OPTIONS``).
"""

from __future__ import annotations

import logging
import re
from datetime import datetime

from sqlalchemy import Connection, Engine, text

from results.retention import Partition, Slot

log = logging.getLogger(__name__)

# A DDL statement waits at most this long for its lock, then gives up until the next
# sweep: writers queued behind a waiting DDL lock would wait as long (a sync answer's
# persist step is a few milliseconds; 200 ms is a tenth of the paid tier's SLO).
DDL_LOCK_TIMEOUT_MS = 200
# A concurrent detach blocks nobody while it waits (for queries that may still read the
# partition), so it may wait longer; if it still times out, it is finished next sweep.
DETACH_WAIT_MS = 30_000

# A request row stays in the heap up to this many bytes, PostgreSQL's largest
# toast_tuple_target (TOAST_TUPLE_TARGET_MAIN for 8 KB pages; the default is 2,032): a
# row with a 768- or 1,536-wide float32 vector then costs the server 22% less CPU than
# moved out of line, and fewer bytes (docs/bench/store.md, "Vectors of other
# widths"; docs/decisions/0029).
REQUESTS_TOAST_TUPLE_TARGET = 8160
# Storage parameters of each partitioned table's partitions, set when one is created
# (migrations/versions/0019_vector_storage.py set them on the partitions made before).
TABLE_OPTIONS: dict[str, dict[str, int]] = {
    "requests": {"toast_tuple_target": REQUESTS_TOAST_TUPLE_TARGET},
}

_BOUND = re.compile(r"FOR VALUES FROM \((?P<lo>[^)]*)\) TO \((?P<hi>[^)]*)\)")

_LIST = text("""
    SELECT parent.relname AS parent, child.relname AS child, i.inhdetachpending AS pending,
           pg_get_expr(child.relpartbound, child.oid) AS bound
    FROM pg_inherits i
    JOIN pg_class parent ON parent.oid = i.inhparent
    JOIN pg_class child ON child.oid = i.inhrelid
    WHERE parent.relname = ANY(:tables) AND parent.relnamespace = current_schema()::regnamespace
    ORDER BY 1, 2""")


def _bound_value(v: str) -> datetime | None:
    v = v.strip()
    if v.upper() == "MINVALUE":
        return None
    return datetime.fromisoformat(v.strip("'"))


def list_partitions(
    conn: Connection, tables: list[str]
) -> tuple[list[Partition], list[tuple[str, str]]]:
    """The partitions of ``tables`` (bounds read in UTC), and (table, partition) of any
    left half-detached by an interrupted concurrent detach."""
    conn.execute(text("SET LOCAL timezone = 'UTC'"))
    parts: list[Partition] = []
    pending: list[tuple[str, str]] = []
    for r in conn.execute(_LIST, {"tables": tables}):
        if r.pending:
            pending.append((r.parent, r.child))
            continue
        m = _BOUND.search(r.bound or "")
        if m is None:
            continue  # not a range partition of ours
        upper = _bound_value(m["hi"])
        if upper is None:
            continue
        parts.append(Partition(r.parent, r.child, _bound_value(m["lo"]), upper))
    return parts, pending


def _ident(name: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"not a plain identifier: {name!r}")
    return name


def with_clause(table: str) -> str:
    """The ``WITH (..)`` clause that gives a new partition of ``table`` its parameters."""
    options = TABLE_OPTIONS.get(table)
    if not options:
        return ""
    return " WITH (" + ", ".join(f"{_ident(k)} = {int(v)}" for k, v in options.items()) + ")"


def create(engine: Engine, slot: Slot, key: str) -> None:
    """Make ``slot``'s partition as a table of its own, then attach it (one transaction).
    The CHECK constraint matching its bound lets the attach skip a scan."""
    table, name = _ident(slot.table), _ident(slot.name)
    lo, hi = slot.lower.isoformat(), slot.upper.isoformat()
    with engine.begin() as conn:
        conn.execute(text(f"SET LOCAL lock_timeout = {DDL_LOCK_TIMEOUT_MS}"))
        conn.execute(
            text(
                f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
                f"INCLUDING STORAGE INCLUDING COMPRESSION){with_clause(table)}"
            )
        )
        conn.execute(
            text(
                f"ALTER TABLE {name} ADD CONSTRAINT {name}_bound "
                f"CHECK ({_ident(key)} >= '{lo}' AND {key} < '{hi}')"
            )
        )
        conn.execute(
            text(
                f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM ('{lo}') TO ('{hi}')"
            )
        )
        conn.execute(text(f"ALTER TABLE {name} DROP CONSTRAINT {name}_bound"))
    log.info("created partition %s [%s, %s)", name, lo, hi)


def drop(engine: Engine, table: str, name: str, *, finalize: bool = False) -> None:
    """Detach ``name`` concurrently (or finish an interrupted detach), then drop it."""
    table, name = _ident(table), _ident(name)
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        wait = DDL_LOCK_TIMEOUT_MS if finalize else DETACH_WAIT_MS
        conn.execute(text(f"SET lock_timeout = {wait}"))
        how = "FINALIZE" if finalize else "CONCURRENTLY"
        conn.execute(text(f"ALTER TABLE {table} DETACH PARTITION {name} {how}"))
        conn.execute(text(f"SET lock_timeout = {DDL_LOCK_TIMEOUT_MS}"))
        conn.execute(text(f"DROP TABLE {name}"))
        conn.execute(text("RESET lock_timeout"))
    log.info("dropped partition %s of %s", name, table)
