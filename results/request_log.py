"""Writing the API's side of the request log: refusal counts and answer timeouts.

Each is one statement for everything gathered since the last write (about a second's
worth, ingest/edge/request_log_flush.py): arrays in, unnest on the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

_REFUSALS = text("""
    INSERT INTO refusals (at, tenant_id, tier, status, reason, count)
    SELECT * FROM unnest(CAST(:at AS timestamptz[]), CAST(:tenant AS uuid[]),
                         CAST(:tier AS text[]), CAST(:status AS int2[]),
                         CAST(:reason AS text[]), CAST(:n AS int4[]))""")

# A request given up on twice (an idempotent retry that timed out too) keeps the first.
_TIMEOUTS = text("""
    INSERT INTO answer_timeouts (request_id, received_at, tenant_id, gave_up_at)
    SELECT * FROM unnest(CAST(:rid AS uuid[]), CAST(:received AS timestamptz[]),
                         CAST(:tenant AS uuid[]), CAST(:gave_up AS timestamptz[]))
    ON CONFLICT DO NOTHING""")


def _ts(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC)


async def write_refusals(
    conn: AsyncConnection,
    rows: Sequence[tuple[float, str | None, str | None, int, str, int]],
) -> None:
    """(second, tenant_id, tier, status, reason, count) rows."""
    if not rows:
        return
    at, tenant, tier, status, reason, n = zip(*rows, strict=True)
    await conn.execute(
        _REFUSALS,
        {
            "at": [_ts(s) for s in at],
            "tenant": list(tenant),
            "tier": list(tier),
            "status": list(status),
            "reason": list(reason),
            "n": list(n),
        },
    )


async def write_timeouts(
    conn: AsyncConnection, rows: Sequence[tuple[str, float, str, float]]
) -> None:
    """(request_id, received_at, tenant_id, gave_up_at) rows, times in epoch seconds."""
    if not rows:
        return
    rid, received, tenant, gave_up = zip(*rows, strict=True)
    await conn.execute(
        _TIMEOUTS,
        {
            "rid": list(rid),
            "received": [_ts(s) for s in received],
            "tenant": list(tenant),
            "gave_up": [_ts(s) for s in gave_up],
        },
    )
