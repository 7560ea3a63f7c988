"""Engines and connection strings, built from the one settings object."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

# Results are announced on this channel (results/announce.py says what a payload holds),
# or on the channel of the API process that produced the request (``reply_channel``).
RESULTS_CHANNEL = "gristmill_results"
_REPLY_PREFIX = RESULTS_CHANNEL + "_"
# Generation flushes name the requests they wrote on this channel; payload:
# comma-separated request ids (results/generation.py).
STREAMS_CHANNEL = "gristmill_streams"

T = TypeVar("T")


def reply_channel(instance: str) -> str:
    """The channel on which one API process hears its own requests' answers, its
    ``instance`` a hex token of its own (decision 70)."""
    return _REPLY_PREFIX + instance


def is_reply_channel(name: object) -> bool:
    """Whether a request message's reply channel is one the API could have named: a
    message is data, and the scheduler notifies no other channel for it."""
    if type(name) is not str or not name.startswith(_REPLY_PREFIX):
        return False
    token = name[len(_REPLY_PREFIX) :]
    return 0 < len(token) <= 32 and all(c in "0123456789abcdef" for c in token)


def sqlalchemy_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs (as platforms inject them) and use psycopg 3."""
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres", "postgresql+psycopg2"):
        u = u.set(drivername="postgresql+psycopg")
    return u.render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The same database as a libpq URL, for raw psycopg connections (LISTEN)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


# Statement parameters stay out of exception texts and logs: they hold clients' data and
# secrets (webhook signing secrets, key hashes).
def _pooled(pool_size: int) -> dict[str, Any]:
    return {
        "pool_size": pool_size,
        "max_overflow": pool_size,
        "pool_pre_ping": True,
        "hide_parameters": True,
    }


def make_engine(url: str, *, pool_size: int = 5) -> Engine:
    return create_engine(sqlalchemy_url(url), **_pooled(pool_size))


def make_async_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    return create_async_engine(sqlalchemy_url(url), **_pooled(pool_size))


def make_bulk_engine(url: str) -> AsyncEngine:
    """A connection of its own for each bulk write (a job's COPY), closed after it. libpq
    keeps a connection's buffers at the largest message it carried, so a pooled
    connection that took a COPY of megabytes held them for the life of the process: the
    hour-long soak saw each API process step up at its uploads (issue 30). A connection
    costs a few milliseconds; an upload takes hundreds."""
    return create_async_engine(sqlalchemy_url(url), poolclass=NullPool, hide_parameters=True)


async def in_transaction(engine: AsyncEngine, fn: Callable[[Connection], T]) -> T:
    """A synchronous results/ function of a connection, in one transaction on the API's
    async engine (the registry's writes, which ``gristmill models`` calls too)."""
    async with engine.begin() as conn:
        return await conn.run_sync(fn)


async def ping(engine: AsyncEngine) -> None:
    """One round trip to the database (readiness); raises what the trip raised."""
    async with engine.connect() as conn:
        await conn.execute(text("select 1"))


def ts(epoch_s: float | None) -> datetime | None:
    return None if epoch_s is None else datetime.fromtimestamp(epoch_s, tz=UTC)
