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

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.dialects.postgresql import insert

from results.db import RESULTS_CHANNEL
from results.jobs import record_job_results
from results.schema import batches, requests

# PostgreSQL caps a NOTIFY payload at 8000 bytes; stay well below.
_NOTIFY_CHUNK = 7000
_INSERT_CHUNK = 1000


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
        conn.execute(insert(batches).values(batch_row).on_conflict_do_nothing())
    if not request_rows:
        return []
    rows: list[Any] = []
    # One multi-row INSERT per chunk: PostgreSQL caps a statement at 65535 parameters.
    for i in range(0, len(request_rows), _INSERT_CHUNK):
        stmt = (
            insert(requests)
            .values(request_rows[i : i + _INSERT_CHUNK])
            .on_conflict_do_nothing(index_elements=["request_id"])
            .returning(requests.c.request_id, requests.c.job_id, requests.c.status)
        )
        rows.extend(conn.execute(stmt).all())
    written = [str(r.request_id) for r in rows]
    record_job_results(conn, ((r.job_id, r.status) for r in rows))
    # Announce every id, written now or before: a waiter may be waiting on a
    # redelivered request whose first row landed while it was not yet listening.
    for payload in notify_payloads([r["request_id"] for r in request_rows]):
        conn.execute(select(func.pg_notify(RESULTS_CHANNEL, payload)))
    return written


def persist(
    engine: Engine, request_rows: list[dict[str, Any]], batch_row: dict[str, Any] | None
) -> list[str]:
    with engine.begin() as conn:
        return write_results(conn, request_rows, batch_row)
