"""A job's items: written by COPY from a staged upload, paged in input order, given
new request ids for a retry, and read back for producing to Kafka."""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, Any

from sqlalchemy import Engine, false, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from results.schema import job_items, requests

# COPY text format, in the column order the staging writes (ingest/jobs/upload.py).
COPY_ITEMS = (
    "COPY job_items (job_id, item_index, custom_id, input, request_id, content_hash) FROM STDIN"
)
_COPY_BLOCK = 1 << 20  # bytes handed to the driver at a time


async def copy_items(conn: AsyncConnection, staged: IO[bytes]) -> None:
    """COPY a staged file (COPY text format, ``COPY_ITEMS``'s columns) into job_items,
    in the caller's transaction. The file is complete before this starts, so the
    transaction lasts as long as PostgreSQL takes, never as long as a client's upload."""
    raw = await conn.get_raw_connection()
    driver: Any = raw.driver_connection  # psycopg.AsyncConnection, same transaction
    staged.seek(0)
    async with driver.cursor() as cur, cur.copy(COPY_ITEMS) as copy:
        while block := staged.read(_COPY_BLOCK):
            await copy.write(block)


# An item's place, its current attempt and that attempt's result (null until it has one).
_ITEM_RESULT = (
    job_items.c.item_index,
    job_items.c.custom_id,
    job_items.c.attempt,
    job_items.c.request_id,
    requests.c.status,
    requests.c.output,
    requests.c.output_vector,  # an embedding's float32 bytes, where stored so
    requests.c.error,
    requests.c.attempts,
    # Reused from a base job (decision 61): its row was copied at submission with
    # attempts 0, which no computed attempt has (results/job_reuse.py).
    func.coalesce(requests.c.attempts == 0, false()).label("reused"),
)


async def items_page(
    engine: AsyncEngine, job_id: str, start: int, limit: int, *, inputs: bool = False
) -> Sequence[Any]:
    """Items from index ``start`` in input order, with their current attempt's result
    (the job API's items; with ``inputs``, the Batch API's result files, whose lines
    count an input's tokens)."""
    columns = (*_ITEM_RESULT, job_items.c.input) if inputs else _ITEM_RESULT
    return await page_with_results(engine, job_id, start, limit, *columns)


async def page_with_results(
    engine: AsyncEngine, job_id: str, start: int, limit: int, *columns: Any
) -> Sequence[Any]:
    """``columns`` of a job's items from index ``start`` in input order, each joined to
    its current attempt's row in the request log (none yet: the row's columns are null)."""
    q = (
        select(*columns)
        .select_from(job_items.outerjoin(requests, requests.c.request_id == job_items.c.request_id))
        .where(job_items.c.job_id == job_id, job_items.c.item_index >= start)
        .order_by(job_items.c.item_index)
        .limit(limit)
    )
    async with engine.connect() as conn:
        return (await conn.execute(q)).all()


_NEW_ATTEMPT = text("""
    UPDATE job_items i SET attempt = :attempt, request_id = u.request_id
    FROM unnest(CAST(:idx AS int4[]), CAST(:rids AS uuid[])) AS u(item_index, request_id)
    WHERE i.job_id = :job_id AND i.item_index = u.item_index""")


async def give_new_request_ids(
    conn: AsyncConnection,
    job_id: str,
    attempt: int,
    indexes: Sequence[int],
    request_ids: Sequence[str],
) -> None:
    """Move the items to a new attempt: new request ids, so their results are new rows
    (the old attempt's rows stay in the request log)."""
    await conn.execute(
        _NEW_ATTEMPT,
        {"job_id": job_id, "attempt": attempt, "idx": list(indexes), "rids": list(request_ids)},
    )


def unsent_page(
    engine: Engine, job_id: str, after: int, width: int
) -> list[tuple[int, str, str, int]]:
    """(item_index, input as JSON text, request_id, attempt) of the items with an index
    in ``after`` + 1 .. ``after`` + ``width`` whose current attempt has no result yet, in
    input order. Each page is its own short read: publishing a million items holds no
    transaction open. The input stays JSON text: it goes into the Kafka message as it is.

    A window of indexes, not ``item_index > after ... LIMIT``: on a ``job_items`` that
    PostgreSQL has not analysed since a large COPY (a fresh database) the planner
    expected a thousand rows after ``after`` and sorted all of them for every page,
    which made reading back a million items quadratic (21 s for 300,000 items, 4.4 s once
    analysed); a bounded window costs its width whatever the statistics."""
    q = text(
        "SELECT i.item_index, i.input::text, i.request_id::text, i.attempt FROM job_items i "
        "WHERE i.job_id = :job_id AND i.item_index > :after AND i.item_index <= :last "
        "AND NOT EXISTS (SELECT 1 FROM requests r WHERE r.request_id = i.request_id) "
        "ORDER BY i.item_index"
    )
    with engine.connect() as conn:
        rows = conn.execute(q, {"job_id": job_id, "after": after, "last": after + width}).all()
    return [(r[0], r[1], r[2], r[3]) for r in rows]
