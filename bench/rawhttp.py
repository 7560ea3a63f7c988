"""A lean HTTP/1.1 client for load generation: keep-alive connections, one request at a
time on each, responses parsed by hand.

aiohttp spends 0.3-0.7 ms of CPU a request in this benchmark's generator, so driving a
GPU host at 10,000 requests/s would take most of its cores from the system being
measured. This client writes pre-built request bytes and reads the status line, the
Content-Length (or chunks) and the body, about a tenth of that. Only what the API
answers is supported: HTTP/1.1, no redirects, no TLS, no compression.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit


class HttpError(Exception):
    """The connection broke or the answer could not be read."""


class _Stale(HttpError):
    """A kept-alive connection the server had closed (its idle timeout) while it sat in
    the pool, seen before the request was written or as it crossed the server's close
    (the connection lost with not a byte of the answer): the request goes out once more
    on a fresh connection, as HTTP clients do (the openai SDK retries any connection
    error twice)."""


@dataclass
class Answer:
    status: int
    body: bytes
    retry_after: bool  # the answer carried Retry-After


class _Conn(asyncio.Protocol):
    def __init__(self, pool: RawPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[Answer] | None = None
        self.closed = False
        self.answered = 0  # answers read on this connection: a reused one may be stale

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they write the same.
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            stale = self.answered > 0 and not self.buf  # closed idle as the request left
            self.waiter.set_exception((_Stale if stale else HttpError)(f"connection lost: {exc}"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is None or self.waiter.done():
            return
        try:
            answer = self._parse()
        except HttpError as exc:
            self.waiter.set_exception(exc)
            return
        if answer is not None:
            self.answered += 1
            self.waiter.set_result(answer)

    def _parse(self) -> Answer | None:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = bytes(self.buf[:end]).lower()
        try:
            status = int(head[9:12])
        except ValueError as exc:
            raise HttpError(f"bad status line {head[:40]!r}") from exc
        start = end + 4
        k = head.find(b"\ncontent-length:")
        if k >= 0:
            stop = head.find(b"\r", k + 1)
            length = int(head[k + 16 : stop if stop > 0 else len(head)])
            if len(self.buf) < start + length:
                return None
            body = bytes(self.buf[start : start + length])
            del self.buf[: start + length]
        elif b"\ntransfer-encoding: chunked" in head:
            parsed = _chunks(self.buf, start)
            if parsed is None:
                return None
            body, consumed = parsed
            del self.buf[:consumed]
        else:
            raise HttpError("an answer without Content-Length or chunks")
        return Answer(status, body, b"\nretry-after:" in head)

    async def request(self, raw: bytes) -> Answer:
        assert self.transport is not None
        if self.closed or self.transport.is_closing():
            raise _Stale
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            self.transport.write(raw)
        except RuntimeError as exc:  # uvloop: closed between the check and the write
            raise _Stale from exc
        return await self.waiter


def _chunks(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    out = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
        pos = eol + 2
        if len(buf) < pos + size + 2:
            return None
        if size == 0:
            return bytes(out), pos + 2
        out += buf[pos : pos + size]
        pos += size + 2


class RawPool:
    """Keep-alive connections to one host; ``post`` borrows an idle one or opens one."""

    def __init__(self, url: str, headers: dict[str, str], timeout_s: float) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.path = parts.path or "/"
        fixed = {"Host": f"{self.host}:{self.port}", "Content-Type": "application/json"}
        lines = [f"POST {self.path} HTTP/1.1"]
        lines += [f"{k}: {v}" for k, v in {**fixed, **headers}.items()]
        self._head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode()
        self.timeout_s = timeout_s
        self._idle: list[_Conn] = []

    async def _take(self) -> _Conn:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return await self._fresh()

    async def _fresh(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: _Conn(self), self.host, self.port)
        return conn

    async def post(self, body: bytes) -> Answer:
        raw = self._head + str(len(body)).encode() + b"\r\n\r\n" + body
        conn = await self._take()
        try:
            try:
                answer = await asyncio.wait_for(conn.request(raw), self.timeout_s)
            except _Stale:  # once more, on a fresh connection
                conn = await self._fresh()
                answer = await asyncio.wait_for(conn.request(raw), self.timeout_s)
        except BaseException:
            if conn.transport is not None:
                conn.transport.close()  # a half-read answer: the connection is unusable
            raise
        if not conn.closed:
            self._idle.append(conn)
        return answer

    def close(self) -> None:
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()
