"""Writing results: one transaction per batch, then one announcement.

Rows are upserted keyed by request id with ON CONFLICT DO NOTHING, so a request
redelivered by Kafka (after a crash between persist and offset commit) never
yields a second row and the first answer stands. The NOTIFY is sent inside
the same transaction, so PostgreSQL delivers it exactly when the rows become
visible; it carries the sync answers themselves (results/announce.py). See
docs/decisions/0003-results-announced-by-notify.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from sqlalchemy import BigInteger, Connection, DateTime, Engine, Integer, Text, func, select
from sqlalchemy.dialects.postgresql import JSONB, UUID, insert

from results import announce
from results.db import RESULTS_CHANNEL
from results.jobs import record_job_results
from results.schema import REQUEST_ROW_COLUMNS, RequestRow, batches, requests

_INSERT_BATCH = insert(batches).on_conflict_do_nothing()

# Request rows go in as one array per column through unnest(): a single short,
# cached statement whatever the batch size, instead of a multi-row VALUES list
# that the driver would re-parse for every batch (it showed up as the scheduler's
# top hot spot under job load).
_PG_TYPES: dict[type, str] = {
    UUID: "uuid",
    Text: "text",
    JSONB: "jsonb",
    Integer: "int4",
    BigInteger: "int8",
    DateTime: "timestamptz",
}
# (column, PostgreSQL type) in RequestRow's order, from the table's own column types.
_REQUEST_COLUMNS: tuple[tuple[str, str], ...] = tuple(
    (name, _PG_TYPES[type(requests.c[name].type)]) for name in REQUEST_ROW_COLUMNS
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
    + ") ON CONFLICT (request_id) DO NOTHING "
    "RETURNING request_id, job_id, status, persisted_at, item_index"
)
_OUTPUT = [c for c, _ in _REQUEST_COLUMNS].index("output")


def _json(value: Any) -> str:
    """JSON text of a column value. A numpy row (a model's array output) is written as
    float64, which orjson prints exactly as it prints the same values as Python floats."""
    if hasattr(value, "dtype") and hasattr(value, "astype"):
        return orjson.dumps(value.astype("float64"), option=orjson.OPT_SERIALIZE_NUMPY).decode()
    return orjson.dumps(value).decode()


def _column_arrays(rows: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
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
    arrays = _column_arrays(request_rows)
    cur.execute(_INSERT_REQUESTS, arrays)
    rows = cur.fetchall()
    written = [str(rid) for rid, *_ in rows]
    record_job_results(
        conn, ((str(rid), None if j is None else str(j), i, st) for rid, j, st, _, i in rows)
    )
    for payload in announcements(request_rows, arrays[_OUTPUT], rows):
        conn.execute(select(func.pg_notify(RESULTS_CHANNEL, payload)))
    return written


def announcements(
    request_rows: list[RequestRow], outputs: list[str | None], returned: list[Any]
) -> list[str]:
    """Every sync request is announced, written now or before: a waiter may be waiting
    on a redelivered request whose first row landed while it was not listening. Those
    written now carry their answer; the others (and answers too large to inline) are
    announced by id and fetched. Job items have no waiter (job results are read by
    polling the job's rows): announcing thousands a second would only keep every API
    instance busy."""
    persisted_at = {str(rid): at for rid, _, _, at, *_ in returned}
    inline: list[bytes] = []
    by_id: list[str] = []
    for row, output in zip(request_rows, outputs, strict=True):
        if row.get("job_id") is not None:
            continue
        rid = str(row["request_id"])
        at = persisted_at.get(rid)
        answer = None if at is None else announce.inline_result(row, at, output)
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
