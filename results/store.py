"""Writing results: one transaction per batch, then one announcement.

Rows are upserted with ON CONFLICT DO NOTHING on the request log's key (request_id,
received_at): every message of one request carries the same received_at, so a request
redelivered by Kafka (after a crash between persist and offset commit) meets its first
row, never yields a second, and the first answer stands. The NOTIFY is sent inside the
same transaction, so PostgreSQL delivers it exactly when the rows become visible; it
carries the sync answers themselves (results/announce.py). See
docs/decisions/0003-results-announced-by-notify.md.

The write is shaped by what it costs per row (docs/decisions/0029-compact-results-and-a-
partitioned-request-log.md, docs/bench/store.md): vector outputs go in as float32 bytes
(results/vectors.py), every column as one array in PostgreSQL's binary format (text
arrays of timestamps and bytes cost the driver 30 to 40 us a row to format and the
server as much to parse), through one cached statement whatever the batch size; all
the batch's announcements leave in one statement; job counters are advanced last, so
the job's row lock is held only while the transaction commits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import BigInteger, Connection, DateTime, Engine, Integer, Text
from sqlalchemy.dialects.postgresql import BYTEA, JSONB, UUID, insert

from results import announce
from results.db import RESULTS_CHANNEL
from results.jobs import record_job_results
from results.schema import REQUEST_ROW_COLUMNS, RequestRow, batches, requests
from results.vectors import to_base64

_INSERT_BATCH = insert(batches).on_conflict_do_nothing()

_PG_TYPES: dict[type, str] = {
    UUID: "uuid",
    Text: "text",
    JSONB: "jsonb",
    BYTEA: "bytea",
    Integer: "int4",
    BigInteger: "int8",
    DateTime: "timestamptz",
}
# (column, PostgreSQL type) in RequestRow's order, from the table's own column types.
_REQUEST_COLUMNS: tuple[tuple[str, str], ...] = tuple(
    (name, _PG_TYPES[type(requests.c[name].type)]) for name in REQUEST_ROW_COLUMNS
)


def _array_param(pgtype: str) -> str:
    """One column's array parameter. Uuids and JSON travel as text (each element is
    parsed once by the server); the rest in their own binary format. The driver picks
    the smallest integer type that holds a list's values, so integers are cast."""
    if pgtype == "jsonb":
        return "%b::text[]::jsonb[]"
    if pgtype == "uuid":
        return "%b::text[]::uuid[]"
    return f"%b::{pgtype}[]"


# ON CONFLICT without a target: the key alone can conflict, and the statement works on
# the partitioned log and on the single table before it (docs/decisions/0029).
_INSERT_REQUESTS = (
    f"INSERT INTO requests ({', '.join(c for c, _ in _REQUEST_COLUMNS)}) "
    f"SELECT * FROM unnest({', '.join(_array_param(t) for _, t in _REQUEST_COLUMNS)}) "
    "ON CONFLICT DO NOTHING RETURNING request_id, job_id, status, persisted_at, item_index"
)
_NOTIFY = f"SELECT pg_notify('{RESULTS_CHANNEL}', p) FROM unnest(%b::text[]) AS p"
_OUTPUT = [c for c, _ in _REQUEST_COLUMNS].index("output")
_VECTOR = [c for c, _ in _REQUEST_COLUMNS].index("output_vector")


def _json(value: Any) -> str:
    """JSON text of a column value. A numpy row (a model's array output not stored as a
    vector) is written as float64, which orjson prints exactly as it prints the same
    values as Python floats."""
    if hasattr(value, "dtype") and hasattr(value, "astype"):
        return orjson.dumps(value.astype("float64"), option=orjson.OPT_SERIALIZE_NUMPY).decode()
    return orjson.dumps(value).decode()


def column_arrays(rows: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """The rows as one list per column, in ``_REQUEST_COLUMNS``' order."""
    out = []
    for name, pgtype in _REQUEST_COLUMNS:
        if pgtype == "jsonb":
            out.append([None if r[name] is None else _json(r[name]) for r in rows])
        else:
            out.append([r[name] for r in rows])
    return out


def write_results(
    conn: Connection, request_rows: list[RequestRow], batch_row: dict[str, Any] | None
) -> list[str]:
    """Upsert rows and announce them; returns the ids that were newly written."""
    if batch_row is not None:
        conn.execute(_INSERT_BATCH, batch_row)
    if not request_rows:
        return []
    driver = conn.connection.driver_connection  # the psycopg connection, same transaction
    assert driver is not None
    cur = driver.cursor()
    arrays = column_arrays(request_rows)
    cur.execute(_INSERT_REQUESTS, arrays)
    rows = cur.fetchall()
    written = [str(rid) for rid, *_ in rows]
    notes = announcements(request_rows, arrays[_OUTPUT], arrays[_VECTOR], rows)
    if notes:
        cur.execute(_NOTIFY, (notes,))
    record_job_results(
        conn, ((str(rid), None if j is None else str(j), i, st) for rid, j, st, _, i in rows)
    )
    return written


def announcements(
    request_rows: list[RequestRow],
    outputs: list[str | None],
    vectors: list[bytes | None],
    returned: list[Any],
) -> list[str]:
    """Every sync request is announced, written now or before: a waiter may be waiting
    on a redelivered request whose first row landed while it was not listening. Those
    written now carry their answer; the others (and answers too large to inline) are
    announced by id and fetched. Job items have no waiter (job results are read by
    polling the job's rows): announcing thousands a second would only keep every API
    instance busy."""
    persisted_at: dict[str, datetime] = {str(rid): at for rid, _, _, at, *_ in returned}
    inline: list[bytes] = []
    by_id: list[str] = []
    for row, output, vector in zip(request_rows, outputs, vectors, strict=True):
        if row.get("job_id") is not None:
            continue
        rid = str(row["request_id"])
        at = persisted_at.get(rid)
        answer = None
        if at is not None:
            b64 = None if vector is None else to_base64(vector)
            answer = announce.inline_result(row, at, output, b64)
        if answer is not None and len(answer) <= announce.INLINE_MAX:
            inline.append(answer)
        else:
            by_id.append(rid)
    return announce.payloads(inline, by_id)


def persist(
    engine: Engine, request_rows: list[RequestRow], batch_row: dict[str, Any] | None
) -> list[str]:
    with engine.begin() as conn:
        return write_results(conn, request_rows, batch_row)
