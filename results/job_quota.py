"""Each tenant's job-item budget: one token bucket per tenant, in PostgreSQL, so that
every API instance charges the same bucket and concurrent submissions are charged one
after another (the row lock), never all against the same balance.

The bucket's arithmetic is the tenant policy's (ingest/jobs/quota.py); this module only
reads and writes the row. Times come from PostgreSQL's clock (``clock_timestamp()``),
the one clock every instance shares."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


@dataclass(frozen=True)
class Budget:
    tokens: float | None  # None: never charged (a full bucket)
    age_s: float  # seconds since the tokens were written


_READ = (
    "SELECT tokens, greatest(0, extract(epoch FROM clock_timestamp() - updated_at))::float8 "
    "FROM job_item_budgets WHERE tenant_id = :t"
)


async def peek_budget(engine: AsyncEngine, tenant_id: str) -> Budget:
    """The budget without a lock: the cheap early look before an upload is read."""
    async with engine.connect() as conn:
        row = (await conn.execute(text(_READ), {"t": tenant_id})).first()
    return Budget(None, 0.0) if row is None else Budget(row[0], float(row[1]))


async def lock_budget(conn: AsyncConnection, tenant_id: str) -> Budget:
    """The budget, locked until the caller's transaction ends."""
    await conn.execute(
        text(
            "INSERT INTO job_item_budgets (tenant_id, tokens, updated_at) "
            "VALUES (:t, NULL, clock_timestamp()) ON CONFLICT (tenant_id) DO NOTHING"
        ),
        {"t": tenant_id},
    )
    row = (await conn.execute(text(_READ + " FOR UPDATE"), {"t": tenant_id})).one()
    return Budget(row[0], float(row[1]))


async def store_budget(conn: AsyncConnection, tenant_id: str, tokens: float) -> None:
    await conn.execute(
        text(
            "UPDATE job_item_budgets SET tokens = :n, updated_at = clock_timestamp() "
            "WHERE tenant_id = :t"
        ),
        {"t": tenant_id, "n": tokens},
    )
