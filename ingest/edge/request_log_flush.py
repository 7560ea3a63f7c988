"""Writes the API process's refusal counts and answer timeouts about once a second.

A failed write (PostgreSQL away) puts its rows back, within the buffers' caps, for the
next attempt; the last flush runs when the API stops.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy.ext.asyncio import AsyncEngine

from ingest.edge.refusal_counts import REFUSALS, TIMEOUTS, RefusalCounts, TimeoutLog
from results.request_log import write_refusals, write_timeouts

log = logging.getLogger(__name__)

# How often the buffers are written: the request log's refusal counts are per second,
# and a second's delay is nothing to an analyst.
FLUSH_S = 1.0


async def flush_once(
    engine: AsyncEngine,
    refusals: RefusalCounts = REFUSALS,
    timeouts: TimeoutLog = TIMEOUTS,
    *,
    everything: bool = False,
) -> int:
    """Write what is due; returns the rows written."""
    counts = refusals.drain(time.time(), everything=everything)
    gave_up = timeouts.drain()
    if not counts and not gave_up:
        return 0
    try:
        async with engine.begin() as conn:
            await write_refusals(
                conn, [(k.second, k.tenant_id, k.tier, k.status, k.reason, n) for k, n in counts]
            )
            await write_timeouts(
                conn, [(t.request_id, t.received_at, t.tenant_id, t.gave_up_at) for t in gave_up]
            )
    except Exception:
        refusals.restore(counts)
        timeouts.restore(gave_up)
        raise
    return len(counts) + len(gave_up)


async def flush_loop(engine: AsyncEngine) -> None:
    while True:
        await asyncio.sleep(FLUSH_S)
        try:
            await flush_once(engine)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("request log write failed (kept for the next): %s", exc)
