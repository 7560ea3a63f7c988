"""Writing results: one transaction per batch, then one announcement.

Rows are upserted keyed by request id with ON CONFLICT DO NOTHING, so a request
redelivered by Kafka (after a crash between persist and offset commit) never
yields a second row and the first answer stands. The NOTIFY is sent inside
the same transaction, so PostgreSQL delivers it exactly when the rows become
visible. See docs/decisions/0003-results-announced-by-notify.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.dialects.postgresql import insert

from results.db import RESULTS_CHANNEL
from results.jobs import record_job_results
from results.schema import batches

# PostgreSQL caps a NOTIFY payload at 8000 bytes; stay well below.
_NOTIFY_CHUNK = 7000

_INSERT_BATCH = insert(batches).on_conflict_do_nothing()

# Request rows go in as one array per column through unnest(): a single short,
# cached statement whatever the batch size, instead of a multi-row VALUES list
# that the driver would re-parse for every batch (it showed up as the scheduler's
# top hot spot under job load).
_REQUEST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("request_id", "uuid"),
    ("tenant_id", "uuid"),
    ("priority", "text"),
    ("model", "text"),
    ("model_version", "text"),
    ("params", "jsonb"),
    ("input", "jsonb"),
    ("status", "text"),
    ("output", "jsonb"),
    ("error", "text"),
    ("attempts", "int4"),
    ("batch_id", "uuid"),
    ("batch_size", "int4"),
    ("job_id", "uuid"),
    ("item_index", "int4"),
    ("received_at", "timestamptz"),
    ("produced_at", "timestamptz"),
    ("consumed_at", "timestamptz"),
    ("batched_at", "timestamptz"),
    ("compute_start_at", "timestamptz"),
    ("compute_end_at", "timestamptz"),
    ("deadline_at", "timestamptz"),
    ("kafka_topic", "text"),
    ("kafka_partition", "int4"),
    ("kafka_offset", "int8"),
)
_INSERT_REQUESTS = (
    f"INSERT INTO requests ({', '.join(c for c, _ in _REQUEST_COLUMNS)}) "
    f"SELECT * FROM unnest("
    + ", ".join(
        "%s::text[]::jsonb[]"
        if t == "jsonb"
        else f"%s::{'text' if t == 'uuid' else t}[]" + ("::uuid[]" if t == "uuid" else "")
        for _, t in _REQUEST_COLUMNS
    )
    + ") ON CONFLICT (request_id) DO NOTHING RETURNING request_id, job_id, status"
)


def _json(value: Any) -> str:
    """JSON text of a column value. A numpy row (a model's array output) is written as
    float64, which orjson prints exactly as it prints the same values as Python floats."""
    if hasattr(value, "dtype") and hasattr(value, "astype"):
        return orjson.dumps(value.astype("float64"), option=orjson.OPT_SERIALIZE_NUMPY).decode()
    return orjson.dumps(value).decode()


def _column_arrays(rows: list[dict[str, Any]]) -> list[list[Any]]:
    out = []
    for name, pgtype in _REQUEST_COLUMNS:
        if pgtype == "jsonb":
            out.append([None if r[name] is None else _json(r[name]) for r in rows])
        else:
            out.append([r[name] for r in rows])
    return out


def notify_payloads(request_ids: Sequence[str]) -> list[str]:
    """Comma-separated ids, split so each payload fits a NOTIFY."""
    out: list[str] = []
    cur: list[str] = []
    size = 0
    for rid in request_ids:
        if cur and size + len(rid) + 1 > _NOTIFY_CHUNK:
            out.append(",".join(cur))
            cur, size = [], 0
        cur.append(rid)
        size += len(rid) + 1
    if cur:
        out.append(",".join(cur))
    return out


def write_results(
    conn: Connection, request_rows: list[dict[str, Any]], batch_row: dict[str, Any] | None
) -> list[str]:
    """Upsert rows and announce them; returns the ids that were newly written."""
    if batch_row is not None:
        conn.execute(_INSERT_BATCH, batch_row)
    if not request_rows:
        return []
    driver = conn.connection.driver_connection  # the psycopg connection, same transaction
    assert driver is not None
    cur = driver.cursor()
    cur.execute(_INSERT_REQUESTS, _column_arrays(request_rows))
    rows = cur.fetchall()
    written = [str(rid) for rid, _, _ in rows]
    record_job_results(conn, ((None if j is None else str(j), st) for _, j, st in rows))
    # Announce every sync id, written now or before: a waiter may be waiting on a
    # redelivered request whose first row landed while it was not yet listening.
    # Job items have no waiter (job results are read by polling the job's rows), and
    # announcing thousands a second would only keep every API instance busy.
    waited = [r["request_id"] for r in request_rows if r.get("job_id") is None]
    for payload in notify_payloads(waited):
        conn.execute(select(func.pg_notify(RESULTS_CHANNEL, payload)))
    return written


def persist(
    engine: Engine, request_rows: list[dict[str, Any]], batch_row: dict[str, Any] | None
) -> list[str]:
    with engine.begin() as conn:
        return write_results(conn, request_rows, batch_row)
