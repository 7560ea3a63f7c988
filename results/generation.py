"""Generation in PostgreSQL: a request's streamed tokens until it ends, then its row.

The scheduler that runs a request writes, in one transaction per flush
(``write_flush``), the new tokens of requests still generating (progress rows) and
the final request-log rows of those that ended, deleting their progress rows in the
same transaction; so a request always has either progress rows or its final row,
never both (decision 32). A stream reads both (``stream_rows``): it follows the
progress rows, and once the final row exists it takes the rest from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, any_, bindparam, delete, select
from sqlalchemy.dialects.postgresql import ARRAY, UUID, insert

from results.schema import RequestRow, generation_progress, requests
from results.store import write_results

_INSERT_PROGRESS = insert(generation_progress).on_conflict_do_nothing()


@dataclass(frozen=True)
class Streamed:
    """What one request streamed so far, in output order."""

    token_ids: tuple[int, ...] = ()
    texts: tuple[str, ...] = ()


def write_flush(
    conn: Connection,
    progress: Sequence[dict[str, Any]],
    final_rows: list[RequestRow],
) -> list[str]:
    """Progress rows (``generation_progress`` columns) and final rows in the caller's
    transaction; returns the final rows' ids that were newly written."""
    if progress:
        conn.execute(_INSERT_PROGRESS, list(progress))
    if not final_rows:
        return []
    written = write_results(conn, final_rows, None)
    ids = [r["request_id"] for r in final_rows]
    conn.execute(delete(generation_progress).where(generation_progress.c.request_id == _any(ids)))
    return written


def read_streamed(conn: Connection, ids: Sequence[str]) -> dict[str, Streamed]:
    """The progress of each of ``ids`` that has any, for a scheduler taking it over."""
    if not ids:
        return {}
    rows = conn.execute(
        select(
            generation_progress.c.request_id,
            generation_progress.c.first_index,
            generation_progress.c.token_ids,
            generation_progress.c.texts,
        )
        .where(generation_progress.c.request_id == _any(ids))
        .order_by(generation_progress.c.request_id, generation_progress.c.first_index)
    ).all()
    out: dict[str, list[tuple[list[int], list[str]]]] = {}
    for rid, first, token_ids, texts in rows:
        parts = out.setdefault(str(rid), [])
        have = sum(len(t) for t, _ in parts)
        if first != have:  # a gap cannot happen (one writer, in order); keep what is whole
            continue
        parts.append((list(token_ids), list(texts)))
    return {
        rid: Streamed(
            tuple(i for t, _ in parts for i in t), tuple(x for _, xs in parts for x in xs)
        )
        for rid, parts in out.items()
    }


def finished(conn: Connection, ids: Sequence[str]) -> set[str]:
    """Which of ``ids`` have their final row already (generated before a crash)."""
    if not ids:
        return set()
    rows = conn.execute(select(requests.c.request_id).where(requests.c.request_id == _any(ids)))
    return {str(r[0]) for r in rows}


def _any(ids: Sequence[str]) -> Any:
    return any_(bindparam("ids", list(ids), type_=ARRAY(UUID(as_uuid=False))))
