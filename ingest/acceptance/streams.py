"""Token streams: what generating requests wrote, handed to their callers in order.

One task per API process reads, for every open stream at once, what is new
(results/generation.py ``read_streams``: progress rows past what each stream has, then
the final rows of those that ended) and puts it on each stream's queue: its tokens in
index order, then its end. One reader writes every queue, so a caller never sees an
end before a token, nor a token after its end (decision 32).

It reads when a generation flush names one of its streams (``NOTIFY
gristmill_streams``, heard by the result listener, ingest/acceptance/waiters.py), when
a stream opens, and every ``poll_s`` anyway (a notification missed while the listener
reconnects costs at most that long).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence

from ingest.acceptance.ports import End, Token
from ingest.edge.listener import stop
from results.generation import StreamRead, StreamWant

log = logging.getLogger(__name__)

# How often open streams are read without a notification (s): the bound on how late a
# token is when its notification was missed.
POLL_S = 0.5
# After a failed read (PostgreSQL away), streams pause this long (s), then go on.
RETRY_S = 0.5

Reader = Callable[[Sequence[StreamWant]], Awaitable[dict[str, StreamRead]]]


class Subscription:
    """One caller's stream (a ``TokenStream``): filled by the hub, read by the caller."""

    def __init__(self, hub: StreamHub, request_id: str, tenant_id: str, next_index: int):
        self.hub = hub
        self.request_id = request_id
        self.tenant_id = tenant_id
        self.next_index = next_index  # the first token index not put on the queue yet
        self.items: asyncio.Queue[Token | End] = asyncio.Queue()
        self.ended = False

    async def next(self, timeout_s: float) -> Token | End | None:
        try:
            return await asyncio.wait_for(self.items.get(), timeout_s)
        except TimeoutError:
            return None

    def close(self) -> None:
        self.hub.unsubscribe(self)

    def take(self, read: StreamRead) -> None:
        """Put what a read found after this stream's place on its queue (the hub's task
        only: one writer keeps the order)."""
        for index, text in read.tokens:
            if index == self.next_index:
                self.items.put_nowait(Token(index, text))
                self.next_index += 1
        if read.end is not None:
            self.items.put_nowait(End(read.end, self.next_index))
            self.ended = True


class StreamHub:
    def __init__(self, read: Reader, poll_s: float = POLL_S):
        self.read = read
        self.poll_s = poll_s
        self._subs: dict[str, list[Subscription]] = {}
        self._task: asyncio.Task[None] | None = None
        self._due = asyncio.Event()

    def subscribe(self, request_id: str, tenant_id: str, next_index: int) -> Subscription:
        sub = Subscription(self, request_id, tenant_id, next_index)
        self._subs.setdefault(request_id, []).append(sub)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        self._due.set()  # what it already has, at once
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.request_id, [])
        if sub in subs:
            subs.remove(sub)
            if not subs:
                del self._subs[sub.request_id]

    def heard(self, request_ids: Iterable[str]) -> None:
        """A flush wrote these requests' tokens or ends: read now if one is open here."""
        if any(rid in self._subs for rid in request_ids):
            self._due.set()

    def wake(self) -> None:
        """Read now, whatever was written (the listener reconnected: notes were missed)."""
        if self._subs:
            self._due.set()

    async def stop(self) -> None:
        await stop([self._task])

    async def _run(self) -> None:
        while True:
            if not self._subs:
                self._due.clear()
                await self._due.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._due.wait(), self.poll_s)
            self._due.clear()
            try:
                await self.read_once()
            except Exception as exc:  # PostgreSQL away: streams pause, then go on
                log.warning("reading stream tokens failed: %s", type(exc).__name__)
                await asyncio.sleep(RETRY_S)

    async def read_once(self) -> None:
        subs = [s for group in self._subs.values() for s in group]
        if not subs:
            return
        found = await self.read([StreamWant(s.request_id, s.tenant_id, s.next_index) for s in subs])
        for s in subs:
            read = found.get(s.request_id)
            if read is not None and not s.ended:
                s.take(read)
                if s.ended:  # nothing more will come for it
                    self.unsubscribe(s)
