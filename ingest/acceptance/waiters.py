"""The way back: results heard by LISTEN/NOTIFY first, polling as the fallback; finished
rows fetched; token streams (ingest/acceptance/streams.py). Every read is results/'s.

One LISTEN connection per API process hears its own requests' answers: each message
it produces names the process's own channel (``reply_to``), and the scheduler
announces the answer there alone (decision 70; before it every process heard and
parsed every answer, and PostgreSQL copied each answer to every listener, which
limited a host's sync rate as processes were added). The shared channel is heard
too: messages produced before the change, and anything announced without a reply
channel. A notification carries the sync answers themselves (results/announce.py): a
waiter here gets its row straight from the payload, no query. Requests announced by id
only (a large answer, a redelivery) are fetched: the listener collects those ids
and a resolver task fetches whatever has gathered in one query (up to 1,000 ids),
so under load one round trip serves many notifications instead of each waiting
for the one before. A slow poll covers anything a notification missed (the
listener reconnecting, a result persisted before the waiter registered). The same
connection hears generation flushes (``gristmill_streams``) and wakes the stream
readers.

While the listener is cut off from PostgreSQL no result can reach a caller, so
new requests are refused with 503 + Retry-After instead of being accepted into
Kafka and left to time out; the listener reconnects on its own (within about a
second of the database coming back) and requests are taken again. No payload drops
it: one it cannot read is logged and left to the poll.

Several callers may wait for one request in one process (a retry with the same
Idempotency-Key while the first attempt waits; a resumed completion stream beside the
first). They share one future, which stays registered until the last of them lets go
(``discard``), answered or not: one caller giving up never leaves another waiting
for an answer that already came. A retry taken by another process than the one whose
message is still queued waits on the slow poll: its answer goes to the first.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, cast

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine

from core.errors import Unavailable
from ingest.acceptance.streams import StreamHub, Subscription
from ingest.edge.listener import listen, stop
from results import announce, generation
from results.db import RESULTS_CHANNEL, STREAMS_CHANNEL, libpq_url, reply_channel
from results.requests import AnswerRow, fetch_answers

log = logging.getLogger(__name__)

# The key under which a delivered row carries the time it reached this instance.
ARRIVED_AT: Final = "arrived_at"
# An answered entry whose holders never let go (a stream whose generator never ran) is
# dropped after this long (s): only new registrations would have found it.
FORGET_ANSWERED_S = 600.0


@dataclass(eq=False)
class _Wait:
    fut: asyncio.Future[AnswerRow]
    since: float  # monotonic: when the first holder registered
    holders: int = 1
    received_at: float | None = None  # epoch s: the request log's partition key


def received_window(times: Iterable[float | None]) -> tuple[datetime, datetime] | None:
    """Bounds of the receipt times of requests to fetch (with a second's slack either
    side), or None when any is unknown: the fetch then looks in every partition. Pure."""
    known = list(times)
    if not known or any(t is None for t in known):
        return None
    ts = cast(list[float], known)
    return (
        datetime.fromtimestamp(min(ts) - 1.0, UTC),
        datetime.fromtimestamp(max(ts) + 1.0, UTC),
    )


class ResultWaiter:
    """The ``Waiter`` of an API process, on PostgreSQL."""

    def __init__(self, engine: AsyncEngine, database_url: str, *, poll_interval_s: float):
        self.engine = engine
        self.dsn = libpq_url(database_url)
        self.poll_interval_s = poll_interval_s
        # This process's own: the answers of the requests it produces come here.
        self.channel = reply_channel(uuid.uuid4().hex[:16])
        self._waiting: dict[str, _Wait] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.listening = asyncio.Event()
        self._heard: list[str] = []  # announced ids with a waiter here, not yet fetched
        self._heard_event = asyncio.Event()
        self.streams = StreamHub(lambda wants: generation.read_streams(self.engine, wants))
        # Told of every announcement (monotonic time): someone's commit went through.
        self.on_heard: Callable[[float], None] | None = None

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._listen()),
            asyncio.create_task(self._resolver()),
            asyncio.create_task(self._poll()),
        ]

    async def stop(self) -> None:
        await self.streams.stop()
        await stop(self._tasks)

    def register(
        self, request_id: str, received_at: float | None = None
    ) -> asyncio.Future[AnswerRow]:
        """Register before producing, so a fast result cannot slip past. ``received_at``:
        the time its message carries (epoch s), which bounds the fetch to its partition."""
        if not self.listening.is_set():
            raise Unavailable(
                "results cannot be delivered right now: the database is unreachable",
                retry_after_s=2,
                reason="results_unreachable",
            )
        entry = self._waiting.get(request_id)
        if entry is not None:
            entry.holders += 1  # shared: answered for every holder, or already
            return entry.fut
        fut: asyncio.Future[AnswerRow] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = _Wait(fut, time.monotonic(), received_at=received_at)
        return fut

    def discard(self, request_id: str) -> None:
        """One holder lets go (each ``register`` is matched by one ``discard``)."""
        entry = self._waiting.get(request_id)
        if entry is not None:
            entry.holders -= 1
            if entry.holders <= 0:
                del self._waiting[request_id]

    def _open(self, request_id: str) -> bool:
        entry = self._waiting.get(request_id)
        return entry is not None and not entry.fut.done()

    async def fetch(self, ids: list[str]) -> list[AnswerRow]:
        waits = [self._waiting.get(i) for i in ids]
        window = received_window(None if w is None else w.received_at for w in waits)
        return await fetch_answers(self.engine, ids, window)

    async def progress(self, request_id: str, tenant_id: str) -> generation.Progress:
        return await generation.progress(self.engine, request_id, tenant_id)

    def follow(self, request_id: str, tenant_id: str, next_index: int) -> Subscription:
        return self.streams.subscribe(request_id, tenant_id, next_index)

    def _answer(self, rows: list[AnswerRow]) -> None:
        # When each row reached this instance (epoch s): the overload guard's answer delay
        # runs from here, so the database's commit time is not taken for the API's own.
        arrived = time.time()
        for row in rows:
            row[ARRIVED_AT] = arrived
            # Answered, not removed: its holders let go themselves (``discard``).
            entry = self._waiting.get(str(row["request_id"]))
            if entry is not None and not entry.fut.done():
                entry.fut.set_result(row)

    async def _resolve(self, ids: list[str]) -> None:
        ids = [i for i in ids if self._open(i)]
        if ids:
            self._answer(await self.fetch(ids))

    async def _listen(self) -> None:
        await listen(
            self.dsn,
            (self.channel, RESULTS_CHANNEL, STREAMS_CHANNEL),
            self._note,
            connected=self._connected,
            lost=self._lost,
        )

    async def _connected(self) -> None:
        self.listening.set()
        # Catch up on anything persisted while we were not listening.
        self.streams.wake()
        await self._resolve(list(self._waiting))

    def _lost(self, exc: BaseException) -> None:
        if isinstance(exc, asyncio.CancelledError):
            return
        self.listening.clear()
        log.warning("result listener lost its connection (%s); retrying", exc)

    async def _note(self, note: psycopg.Notify) -> None:
        if note.channel == STREAMS_CHANNEL:
            self.streams.heard(note.payload.split(","))
        else:
            self._hear(note.payload)

    def _hear(self, payload: str) -> None:
        if self.on_heard is not None:
            self.on_heard(time.monotonic())
        try:
            rows, ids = announce.parse(payload, self._waiting)
            self._answer(rows)
        except Exception as exc:  # not ours: the poll covers it; the listener goes on
            log.warning("unreadable result announcement (%s)", type(exc).__name__)
            return
        mine = [i for i in ids if self._open(i)]
        if mine:
            self._heard.extend(mine)
            self._heard_event.set()

    async def _resolver(self) -> None:
        """Fetch what the listener heard, everything gathered so far in one query."""
        while True:
            await self._heard_event.wait()
            self._heard_event.clear()
            while self._heard:
                ids, self._heard = self._heard[:1000], self._heard[1000:]
                try:
                    await self._resolve(ids)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the slow poll picks these up
                    log.warning("result fetch failed: %s", exc)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            now = time.monotonic()
            self._forget_answered(now)
            cutoff = now - self.poll_interval_s
            stale = [
                rid for rid, e in self._waiting.items() if e.since < cutoff and not e.fut.done()
            ]
            if not stale:
                continue
            try:
                for i in range(0, len(stale), 1000):
                    await self._resolve(stale[i : i + 1000])
            except Exception as exc:
                log.warning("result poll failed: %s", exc)

    def _forget_answered(self, now: float) -> None:
        old = [
            rid
            for rid, e in self._waiting.items()
            if e.fut.done() and now - e.since > FORGET_ANSWERED_S
        ]
        for rid in old:
            del self._waiting[rid]
