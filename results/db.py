"""Engines and connection strings, built from the one settings object."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

# Results are announced on this channel; payload: comma-separated request ids.
RESULTS_CHANNEL = "gristmill_results"


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
def make_engine(url: str, *, pool_size: int = 5) -> Engine:
    return create_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        hide_parameters=True,
    )


def make_async_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    return create_async_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        hide_parameters=True,
    )


def ts(epoch_s: float | None) -> datetime | None:
    return None if epoch_s is None else datetime.fromtimestamp(epoch_s, tz=UTC)
