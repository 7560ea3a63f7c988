"""Reading the request log: finished requests' rows, as the API answers them.

The writes are results/store.py's (one transaction per batch) and announced by NOTIFY
(results/announce.py, whose payloads parse into the same ``AnswerRow``); these are the
reads for what a notification did not carry: a row announced by id only, a retry of a
finished request, a caller who fetches its result later.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NotRequired, TypedDict, cast

from sqlalchemy import any_, bindparam, select
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from results.schema import requests


class AnswerRow(TypedDict):
    """A finished request as its caller is answered (``RESULT_COLUMNS``)."""

    request_id: str
    status: str  # a RequestStatus
    output: Any
    output_vector: bytes | None  # a vector output's float32 bytes (results/vectors.py)
    error: str | None
    model: str
    model_version: str
    batch_size: int | None
    received_at: datetime
    consumed_at: datetime | None
    batched_at: datetime | None
    compute_start_at: datetime | None
    compute_end_at: datetime | None
    persisted_at: datetime | None
    # When the answer reached this API instance (epoch s; the waiter sets it): the
    # overload guard's answer delay runs from here (ingest/admission/overload.py).
    arrived_at: NotRequired[float]


# The columns an answer is built from (ingest/native/wire.py's result_body).
RESULT_COLUMNS = (
    requests.c.request_id,
    requests.c.status,
    requests.c.output,
    requests.c.output_vector,
    requests.c.error,
    requests.c.model,
    requests.c.model_version,
    requests.c.batch_size,
    requests.c.received_at,
    requests.c.consumed_at,
    requests.c.batched_at,
    requests.c.compute_start_at,
    requests.c.compute_end_at,
    requests.c.persisted_at,
)

# One statement for any number of ids (= ANY(array)), so it is compiled once and its
# text cached by the driver, instead of an IN list that changes with every batch size.
_BY_IDS = select(*RESULT_COLUMNS).where(
    requests.c.request_id == any_(bindparam("ids", type_=ARRAY(UUID(as_uuid=False))))
)


# The tenant's rows among ids: another tenant's are not seen (nor learned to exist).
_TENANT_BY_IDS = _BY_IDS.where(requests.c.tenant_id == bindparam("tenant_id"))


def answer_row(mapping: Any) -> AnswerRow:
    """A fetched row (a SQLAlchemy ``Row``'s mapping) as an ``AnswerRow``."""
    return cast(AnswerRow, dict(mapping))


# The same with the requests' receipt times bounded: the log is partitioned by
# received_at, and an id alone is looked up in the index of every partition (30 days'
# worth and those made ahead), where a window prunes the lookup to the one or two the
# waiting requests were received in.
_BY_IDS_RECEIVED = _BY_IDS.where(
    requests.c.received_at >= bindparam("lo"), requests.c.received_at <= bindparam("hi")
)


async def fetch_answers(
    engine: AsyncEngine,
    ids: Sequence[str],
    received: tuple[datetime, datetime] | None = None,
) -> list[AnswerRow]:
    """The finished rows among ``ids`` (canonical UUID text), in no particular order.
    ``received``: bounds every one of them was received within, when the caller knows
    them (the partitions to look in)."""
    async with engine.connect() as conn:
        if received is None:
            return await answers_in(conn, ids)
        lo, hi = received
        rows = await conn.execute(_BY_IDS_RECEIVED, {"ids": list(ids), "lo": lo, "hi": hi})
        return [answer_row(r._mapping) for r in rows]


async def answers_in(conn: AsyncConnection, ids: Sequence[str]) -> list[AnswerRow]:
    """``fetch_answers`` on the caller's connection (a statement of its transaction)."""
    rows = await conn.execute(_BY_IDS, {"ids": list(ids)})
    return [answer_row(r._mapping) for r in rows]


async def fetch_tenant_answers(
    engine: AsyncEngine, tenant_id: str, ids: Sequence[str]
) -> list[AnswerRow]:
    """The tenant's finished rows among ``ids`` (canonical UUID text), in no order."""
    async with engine.connect() as conn:
        rows = await conn.execute(_TENANT_BY_IDS, {"ids": list(ids), "tenant_id": tenant_id})
        return [answer_row(r._mapping) for r in rows]


async def fetch_request(engine: AsyncEngine, tenant_id: str, request_id: str) -> AnswerRow | None:
    """The tenant's finished request ``request_id`` (canonical UUID text), or None: not
    finished, or another tenant's (which the caller must not learn exists)."""
    async with engine.connect() as conn:
        return await tenant_answer(conn, tenant_id, request_id)


async def tenant_answer(conn: AsyncConnection, tenant_id: str, request_id: str) -> AnswerRow | None:
    row = (
        await conn.execute(
            select(*RESULT_COLUMNS).where(
                requests.c.request_id == request_id, requests.c.tenant_id == tenant_id
            )
        )
    ).first()
    return None if row is None else answer_row(row._mapping)
