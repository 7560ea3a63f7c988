"""Sending one webhook: connect-time checks, one deadline, a bounded answer, status
classes. A real socket server on loopback plays the receiver; the resolver is passed
in, so a name can be made to answer what DNS rebinding would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from ipaddress import ip_address

from ingest.jobs.destinations import AllowList, IPAddress
from ingest.jobs.webhook_client import (
    DNS_ERROR,
    REFUSED_DESTINATION,
    TIMEOUT,
    NotResolved,
    new_pool,
    post,
)

LOOPBACK = AllowList.parse(["127.0.0.0/8"])
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    fields = [h.split(b":", 1) for h in head.split(b"\r\n") if b":" in h]
    length = next((int(v) for k, v in fields if k.lower() == b"content-length"), 0)
    return head + await reader.readexactly(length)


def answer(status: int, body: bytes = b"", seen: list[bytes] | None = None) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        req = await _request(reader)
        if seen is not None:
            seen.append(req)
        head = b"HTTP/1.1 %d X\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        writer.write(head % (status, len(body)) + body)
        await writer.drain()
        writer.close()

    return handle


def resolver(*answers: str) -> Callable[[str, int], Awaitable[list[IPAddress]]]:
    """Answers in turn, the last one forever (a name whose DNS answer changes)."""
    seq = [ip_address(a) for a in answers]

    async def resolve(host: str, port: int) -> list[IPAddress]:
        return [seq.pop(0) if len(seq) > 1 else seq[0]]

    return resolve


def deliver(
    handler: Handler,
    *,
    allow: AllowList = LOOPBACK,
    resolve: Callable[[str, int], Awaitable[list[IPAddress]]] | None = None,
    host: str = "hooks.example",
    deadline_s: float = 2.0,
    max_response: int = 65536,
) -> tuple[str | None, float]:
    async def run() -> tuple[str | None, float]:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with new_pool(allow, resolve or resolver("127.0.0.1")) as pool:
                t0 = time.monotonic()
                out = await post(
                    pool,
                    f"http://{host}:{port}/hook",
                    b'{"x": 1}',
                    {"Content-Type": "application/json"},
                    deadline_s=deadline_s,
                    max_response_bytes=max_response,
                )
                return out, time.monotonic() - t0
        finally:
            server.close()

    return asyncio.run(run())


def test_delivered_to_the_checked_address_with_the_name_in_host() -> None:
    seen: list[bytes] = []
    out, _ = deliver(answer(204, seen=seen))
    assert out is None
    assert b"\r\nHost: hooks.example:" in seen[0] or b"\r\nhost: hooks.example:" in seen[0].lower()
    assert seen[0].endswith(b'{"x": 1}')


def test_internal_address_is_refused_at_connect_time() -> None:
    seen: list[bytes] = []
    out, _ = deliver(answer(204, seen=seen), allow=AllowList())
    assert out == REFUSED_DESTINATION and not seen


def test_dns_rebinding_reaches_nothing() -> None:
    # Public when checked at submission, loopback by the time of the delivery: the
    # delivery resolves and checks itself, and connects to what it checked.
    seen: list[bytes] = []
    rebinding = resolver("93.184.216.34", "127.0.0.1")
    asyncio.run(rebinding("hooks.example", 80))  # the submission's look-up
    out, _ = deliver(answer(204, seen=seen), allow=AllowList(), resolve=rebinding)
    assert out == REFUSED_DESTINATION and not seen


def test_literal_forms_of_loopback_are_refused() -> None:
    for host in ("127.0.0.1", "2130706433", "0177.0.0.1", "0x7f.1", "[::ffff:127.0.0.1]"):
        out, _ = deliver(answer(204), allow=AllowList(), host=host)
        assert out == REFUSED_DESTINATION, host


def test_unresolvable_name_is_a_dns_error() -> None:
    async def nothing(host: str, port: int) -> list[IPAddress]:
        raise NotResolved(host)

    out, _ = deliver(answer(204), resolve=nothing)
    assert out == DNS_ERROR


def test_status_classes() -> None:
    assert deliver(answer(200))[0] is None
    assert deliver(answer(302))[0] == "http_3xx"
    assert deliver(answer(404))[0] == "http_4xx"
    assert deliver(answer(503))[0] == "http_5xx"


def test_one_deadline_for_the_whole_delivery() -> None:
    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(1000):  # a byte every 50 ms: every read is quick, the whole is not
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.05)

    out, took = deliver(trickle, deadline_s=1.0)
    assert out == TIMEOUT and 0.9 < took < 2.0


def test_a_receiver_that_never_answers_times_out() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    out, took = deliver(silent, deadline_s=0.5)
    assert out == TIMEOUT and took < 1.5


def test_a_huge_answer_is_read_only_up_to_the_cap() -> None:
    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
        try:
            for _ in range(100_000):
                writer.write(b"x" * 10_000)
                await writer.drain()
        except (ConnectionError, OSError):
            pass

    out, took = deliver(flood, max_response=64 * 1024)
    assert out is None and took < 1.5
