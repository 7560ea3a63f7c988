"""Token streams: the progress rows of generating requests, handed to their callers.

One task per API process reads, for every open stream at once, the progress rows
(results/generation.py) past what each stream has (one query per ``POLL_S``,
however many streams are open), and puts each new token's text on its stream's
queue. A stream's end comes from its request-log row, through the result waiter
(ingest/acceptance/waiters.py), as a non-streaming answer does (decision 32).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, INTEGER, UUID
from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("gristmill.ingest.streams")

# How often the open streams' new tokens are read (s): one step of the model on this
# CPU is 10-30 ms (docs/bench/generation.md), so a token waits at most about one
# step more here, and the database sees 50 queries/s per API process while any
# stream is open.
POLL_S = 0.02

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


@dataclass(eq=False)
class Subscription:
    request_id: str
    tenant_id: str
    next_index: int  # the first token index this stream has not received
    tokens: asyncio.Queue[tuple[int, str]] = field(default_factory=asyncio.Queue)


class StreamHub:
    def __init__(self, engine: AsyncEngine, poll_s: float = POLL_S):
        self.engine = engine
        self.poll_s = poll_s
        self._subs: set[Subscription] = set()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def subscribe(self, request_id: str, tenant_id: str, next_index: int) -> Subscription:
        sub = Subscription(request_id, tenant_id, next_index)
        self._subs.add(sub)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        self._wake.set()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subs.discard(sub)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        while True:
            if not self._subs:
                self._wake.clear()
                await self._wake.wait()
            subs = list(self._subs)
            try:
                await self._read(subs)
            except Exception as exc:  # PostgreSQL away: streams pause, then go on
                log.warning("reading stream tokens failed: %s", type(exc).__name__)
                await asyncio.sleep(0.5)
            await asyncio.sleep(self.poll_s)

    async def _read(self, subs: list[Subscription]) -> None:
        params = {
            "ids": [s.request_id for s in subs],
            "tenants": [s.tenant_id for s in subs],
            "nexts": [s.next_index for s in subs],
        }
        async with self.engine.connect() as conn:
            rows = (await conn.execute(_NEW_TOKENS, params)).all()
        by_id: dict[str, list[Subscription]] = {}
        for s in subs:
            by_id.setdefault(s.request_id, []).append(s)
        for rid, first, texts in rows:
            for s in by_id.get(str(rid), ()):
                for i, t in enumerate(texts):
                    if first + i == s.next_index:
                        s.tokens.put_nowait((s.next_index, t))
                        s.next_index += 1
