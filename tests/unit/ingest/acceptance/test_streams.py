"""ingest/acceptance/streams.py: one reader fills every stream, tokens in index order
then the end, whatever a read finds at once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from ingest.acceptance.ports import End, Token
from ingest.acceptance.streams import StreamHub
from results.generation import StreamRead, StreamWant
from results.requests import AnswerRow

ROW = cast(AnswerRow, {"request_id": "r", "status": "succeeded", "received_at": datetime.now(UTC)})


class Store:
    """What read_streams would find: progress texts per request, final rows."""

    def __init__(self) -> None:
        self.texts: dict[str, list[str]] = {}
        self.ended: dict[str, AnswerRow] = {}
        self.reads: list[list[StreamWant]] = []

    async def read(self, wants: Sequence[StreamWant]) -> dict[str, StreamRead]:
        self.reads.append(list(wants))
        out: dict[str, StreamRead] = {}
        for w in wants:
            texts = self.texts.get(w.request_id, [])
            got = StreamRead(list(enumerate(texts)), self.ended.get(w.request_id))
            if got.tokens or got.end is not None:
                out[w.request_id] = got
        return out


async def drain(stream: Any, n: int) -> list[Token | End]:
    out = []
    for _ in range(n):
        item = await stream.next(1.0)
        assert item is not None
        out.append(item)
    return out


def test_tokens_come_in_order_then_the_end_with_where_they_stopped() -> None:
    async def main() -> None:
        store = Store()
        hub = StreamHub(store.read, poll_s=10)
        store.texts["r"] = ["a", "b"]
        s = hub.subscribe("r", "t", 0)
        assert await drain(s, 2) == [Token(0, "a"), Token(1, "b")]
        # The end and the last token in the same read: the token first.
        store.texts["r"] = ["a", "b", "c"]
        store.ended["r"] = ROW
        hub.heard(["r"])
        assert await drain(s, 2) == [Token(2, "c"), End(ROW, 3)]
        assert hub._subs == {}  # ended: read no more
        await hub.stop()

    asyncio.run(main())


def test_a_stream_from_an_index_skips_what_came_before_it_and_others_are_not_read() -> None:
    async def main() -> None:
        store = Store()
        hub = StreamHub(store.read, poll_s=10)
        store.texts["r"] = ["a", "b", "c"]
        late = hub.subscribe("r", "t", 2)
        early = hub.subscribe("r", "t", 0)
        assert await drain(late, 1) == [Token(2, "c")]
        assert await drain(early, 3) == [Token(0, "a"), Token(1, "b"), Token(2, "c")]
        reads = len(store.reads)
        hub.heard(["someone-else"])  # a flush for a stream not open here: no read
        await asyncio.sleep(0.05)
        assert len(store.reads) == reads
        late.close()
        early.close()
        await hub.stop()

    asyncio.run(main())


def test_a_missed_notification_costs_one_poll() -> None:
    async def main() -> None:
        store = Store()
        hub = StreamHub(store.read, poll_s=0.05)
        s = hub.subscribe("r", "t", 0)
        assert await s.next(0.01) is None  # nothing yet
        store.texts["r"] = ["a"]  # written, its notification lost
        assert await s.next(1.0) == Token(0, "a")
        s.close()
        await hub.stop()

    asyncio.run(main())
