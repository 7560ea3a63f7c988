"""The load generator's lean HTTP client against a server on loopback: keep-alive
reuse, Content-Length and chunked answers, Retry-After, a server that hangs up."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from bench.rawhttp import HttpError, RawPool


async def _server(answers: list[bytes]) -> tuple[asyncio.Server, int, list[bytes]]:
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while answers:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            seen.append(head + await reader.readexactly(length))
            answer = answers.pop(0)
            writer.write(answer)
            await writer.drain()
            if answer.endswith(b"CLOSE"):
                writer.close()
                return
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


def _ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_answers_come_back_over_one_kept_connection(loop: str) -> None:
    async def run() -> None:
        chunked = (
            b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n"
            b"Retry-After: 2\r\n\r\n4\r\nbusy\r\n3\r\n!!!\r\n0\r\n\r\n"
        )
        server, port, seen = await _server([_ok(b'{"a":1}'), chunked, _ok(b"x" * 70000)])
        pool = RawPool(f"http://127.0.0.1:{port}/v1/infer", {"Authorization": "Bearer k"}, 5.0)
        a = await pool.post(b'{"input":"one"}')
        b = await pool.post(b"{}")
        c = await pool.post(b"{}")
        assert (a.status, a.body, a.retry_after) == (200, b'{"a":1}', False)
        assert (b.status, b.body, b.retry_after) == (503, b"busy!!!", True)
        assert c.status == 200 and len(c.body) == 70000
        assert seen[0].startswith(b"POST /v1/infer HTTP/1.1\r\n")
        assert b"Authorization: Bearer k" in seen[0] and seen[0].endswith(b'{"input":"one"}')
        assert len(seen) == 3
        pool.close()
        server.close()

    if loop == "uvloop":  # the generator's own loop: its transports are not asyncio's
        import uvloop

        uvloop.run(run())
    else:
        asyncio.run(run())


def test_a_server_that_hangs_up_is_a_client_error() -> None:
    async def run() -> None:
        server, port, _ = await _server([b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nCLOSE"])
        pool = RawPool(f"http://127.0.0.1:{port}/x", {}, 5.0)
        with pytest.raises(HttpError):
            await pool.post(b"{}")
        server.close()

    asyncio.run(run())


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_kept_connection_the_server_closed_while_idle_is_replaced(loop: str) -> None:
    """A keep-alive connection the server closed (its idle timeout) before the pool saw
    it go: the request goes out on a fresh connection and is answered, not lost."""

    async def run() -> None:
        served: list[int] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    await _read_request(reader)
                    served.append(1)
                    writer.write(_ok(b"fine"))
                    await writer.drain()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = RawPool(f"http://127.0.0.1:{port}/x", {}, 5.0)
        first = await pool.post(b"{}")
        (stale,) = pool._idle
        assert stale.transport is not None
        stale.transport.close()  # closing: the protocol has not yet been told it is lost
        assert not stale.closed
        second = await pool.post(b"{}")
        assert pool._idle and pool._idle[-1] is not stale
        assert (first.status, second.status, second.body) == (200, 200, b"fine")
        assert len(served) == 2
        server.close()

    if loop == "uvloop":
        import uvloop

        uvloop.run(run())
    else:
        asyncio.run(run())


def test_a_request_that_crosses_the_servers_idle_close_is_sent_again_on_a_fresh_one() -> None:
    """The server closes a kept-alive connection as a request goes out on it (no byte of
    an answer comes back): the request is sent once more, on a new connection."""

    async def run() -> None:
        conns: list[int] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conns.append(1)
            first_conn = len(conns) == 1
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                served = 0
                while True:
                    await _read_request(reader)
                    if first_conn and served == 1:
                        writer.close()  # its idle timeout, as the second request came in
                        return
                    served += 1
                    writer.write(_ok(b"fine"))
                    await writer.drain()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = RawPool(f"http://127.0.0.1:{port}/x", {}, 5.0)
        first = await pool.post(b"{}")
        second = await pool.post(b"{}")
        assert (first.status, second.status, second.body) == (200, 200, b"fine")
        assert len(conns) == 2
        server.close()

    asyncio.run(run())
