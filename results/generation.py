"""Generation in PostgreSQL: a request's streamed tokens until it ends, then its row.

The scheduler that runs a request writes, in one transaction per flush
(``write_flush``), the new tokens of requests still generating (progress rows) and
the final request-log rows of those that ended, deleting their progress rows in the
same transaction; so a request always has either progress rows or its final row,
never both (decision 32). The same transaction names every request it wrote on
``STREAMS_CHANNEL``: a wake-up for the API's stream readers, which read what is new
with ``read_streams`` (progress first, then final rows: a request not seen generating
by the first statement is seen finished by the second). A stream's tokens and its end
therefore come from one read, in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, any_, bindparam, delete, exists, select, text
from sqlalchemy.dialects.postgresql import ARRAY, INTEGER, UUID, insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from results.db import STREAMS_CHANNEL
from results.requests import RESULT_COLUMNS, AnswerRow, answer_row, tenant_answer
from results.schema import RequestRow, generation_progress, requests
from results.store import write_results

_INSERT_PROGRESS = insert(generation_progress).on_conflict_do_nothing()
# Below PostgreSQL's 8000-byte cap on a payload: about 190 request ids each.
_PAYLOAD_MAX = 7000
_WAKE = text("SELECT pg_notify(:channel, p) FROM unnest(CAST(:payloads AS text[])) AS p")


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
    transaction, and the wake-up of their streams; returns the final rows' ids that
    were newly written."""
    if progress:
        conn.execute(_INSERT_PROGRESS, list(progress))
    written: list[str] = []
    if final_rows:
        written = write_results(conn, final_rows, None)
        ids = [r["request_id"] for r in final_rows]
        conn.execute(
            delete(generation_progress).where(generation_progress.c.request_id == _any(ids))
        )
    woken = list(dict.fromkeys([*(p["request_id"] for p in progress), *written]))
    if woken:
        conn.execute(_WAKE, {"channel": STREAMS_CHANNEL, "payloads": wake_payloads(woken)})
    return written


def wake_payloads(ids: Sequence[str]) -> list[str]:
    """``ids`` comma-separated, in as few payloads as fit under the cap. Pure."""
    out: list[str] = []
    part: list[str] = []
    size = 0
    for rid in ids:
        if part and size + len(rid) + 1 > _PAYLOAD_MAX:
            out.append(",".join(part))
            part, size = [], 0
        part.append(rid)
        size += len(rid) + 1
    if part:
        out.append(",".join(part))
    return out


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


# ---- the API's reads ---------------------------------------------------------------------


@dataclass(frozen=True)
class StreamWant:
    """An open stream: the tenant's request, and the first token index it lacks."""

    request_id: str
    tenant_id: str
    next_index: int


@dataclass
class StreamRead:
    """What one read found for a request's streams: tokens ``(index, text)`` in index
    order (from its progress rows that reach past the least index its streams lack),
    then its final row if it has ended (which holds every token's text)."""

    tokens: list[tuple[int, str]] = field(default_factory=list)
    end: AnswerRow | None = None


_NEW_TOKENS = text(
    """
    SELECT p.request_id, p.first_index, p.texts
    FROM generation_progress p
    JOIN unnest(:ids, :tenants, :nexts) AS w(id, tenant, nxt)
      ON p.request_id = w.id AND p.tenant_id = w.tenant
    WHERE p.first_index + jsonb_array_length(p.texts) > w.nxt
    ORDER BY p.request_id, p.first_index
    """
).bindparams(
    bindparam("ids", type_=ARRAY(UUID(as_uuid=False))),
    bindparam("tenants", type_=ARRAY(UUID(as_uuid=False))),
    bindparam("nexts", type_=ARRAY(INTEGER)),
)
_ENDED = select(*RESULT_COLUMNS, requests.c.tenant_id).where(
    requests.c.request_id == any_(bindparam("ids", type_=ARRAY(UUID(as_uuid=False))))
)


async def read_streams(engine: AsyncEngine, wants: Sequence[StreamWant]) -> dict[str, StreamRead]:
    """What is new for ``wants``, by request id: the tokens from the least index any of
    its streams lacks, then its final row if it has ended. Progress is read first, then
    the final rows, so nothing between a request's last progress and its end is missed."""
    least: dict[tuple[str, str], int] = {}
    for w in wants:
        key = (w.request_id, w.tenant_id)
        least[key] = min(least.get(key, w.next_index), w.next_index)
    params = {
        "ids": [rid for rid, _ in least],
        "tenants": [tenant for _, tenant in least],
        "nexts": list(least.values()),
    }
    async with engine.connect() as conn:
        progress = (await conn.execute(_NEW_TOKENS, params)).all()
        ended = (await conn.execute(_ENDED, {"ids": params["ids"]})).all()
    out: dict[str, StreamRead] = {}
    for rid, first, texts in progress:
        got = out.setdefault(str(rid), StreamRead())
        got.tokens.extend((first + i, t) for i, t in enumerate(texts))
    for row in ended:
        m = dict(row._mapping)
        rid = str(m["request_id"])
        if (rid, str(m.pop("tenant_id"))) in least:  # another tenant's: not theirs to see
            out.setdefault(rid, StreamRead()).end = answer_row(m)
    return out


@dataclass(frozen=True)
class Progress:
    """Where a tenant's generation request stands: generating (it has progress rows),
    finished (its final row), or neither (still queued, unknown or another tenant's)."""

    generating: bool
    row: AnswerRow | None


async def _generating(conn: AsyncConnection, request_id: str, tenant_id: str) -> bool:
    stmt = select(
        exists().where(
            and_(
                generation_progress.c.request_id == request_id,
                generation_progress.c.tenant_id == tenant_id,
            )
        )
    )
    return bool((await conn.execute(stmt)).scalar_one())


async def generating(engine: AsyncEngine, request_id: str, tenant_id: str) -> bool:
    """Whether the tenant's request has streamed tokens and not ended."""
    async with engine.connect() as conn:
        return await _generating(conn, request_id, tenant_id)


async def progress(engine: AsyncEngine, request_id: str, tenant_id: str) -> Progress:
    """Progress first: its rows go in the transaction that writes the final row, so a
    request not seen generating by this statement is seen finished by the next."""
    async with engine.connect() as conn:
        started = await _generating(conn, request_id, tenant_id)
        row = await tenant_answer(conn, tenant_id, request_id)
    return Progress(started, row)


def _any(ids: Sequence[str]) -> Any:
    return any_(bindparam("ids", list(ids), type_=ARRAY(UUID(as_uuid=False))))
