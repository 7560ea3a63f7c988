"""A LISTEN connection that stays up: PostgreSQL's notifications to a handler, for as
long as the task runs. Three listen here, each on its own connection: the result
waiter (answers, stream wake-ups), the key cache (revocations) and the model catalog
(registry changes).

A lost connection is retried with backoff from 0.1 s, doubling to 1 s, so a restarted
database is found within about a second; the owner hears of each loss (``lost``: what
it heard before may no longer be all there is) and of each new connection
(``connected``: catch up on what was missed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

import psycopg

FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 1.0


async def _nothing() -> None:
    return None


async def listen(
    dsn: str,
    channels: Sequence[str],
    hear: Callable[[psycopg.Notify], Awaitable[None]],
    *,
    connected: Callable[[], Awaitable[None]] = _nothing,
    lost: Callable[[BaseException], None] = lambda exc: None,
) -> None:
    """Runs until cancelled (``lost`` is told then too, with the CancelledError)."""
    backoff = FIRST_BACKOFF_S
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                for channel in channels:
                    await conn.execute(f"LISTEN {channel}")
                backoff = FIRST_BACKOFF_S
                await connected()
                async for note in conn.notifies():
                    await hear(note)
        except asyncio.CancelledError as exc:
            lost(exc)
            raise
        except Exception as exc:
            lost(exc)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)


async def stop(tasks: Sequence[asyncio.Task[None] | None]) -> None:
    """Cancel background tasks and wait for each to end (whatever it ends with: the
    process is stopping)."""
    for task in tasks:
        if task is not None:
            task.cancel()
    for task in tasks:
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
