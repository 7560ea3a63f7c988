"""The generation scenario's load: seeded prompts of mixed lengths, and closed-loop
streams of ``POST /v1/completions`` with ``stream: true`` read as server-sent events
over plain asyncio connections (no HTTP library: what the GPU host has, and cheap
enough that 256 streams leave the cores to the system being measured).

Every stream keeps one request in flight on one kept-alive connection: when its
completion ends (``[DONE]``, an error, a refusal) it sends the next one, until the
window closes. The requests are one seeded list taken in order by whichever stream is
free, so every mode and stream count sends the same prompts in the same order."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bench.gpuhost.genstats import Streamed
from core.models.lm_codec import Codec
from workers.models.causal_lm.corpus import CORPUS_PATH

LM = "gristmill-lm"
CONTEXT = 512  # gristmill-lm's positions: prompt and max_tokens together


@dataclass(frozen=True)
class Mix:
    """Log-normal lengths in tokens, clipped: prompts median 64 (16-256), outputs median
    48 (16-256). Both ranges stay within the model's 512-token context together."""

    prompt_median: float = 64
    prompt_sigma: float = 0.8
    prompt_range: tuple[int, int] = (16, 256)
    output_median: float = 48
    output_sigma: float = 0.9
    output_range: tuple[int, int] = (16, 256)


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: int  # as the API will count them
    max_tokens: int


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(rng.lognormvariate(math.log(median), sigma))))


def prompts(n: int, seed: int = 28, mix: Mix = Mix(), codec: Codec | None = None) -> list[Prompt]:
    """``n`` prompts cut from the model's own corpus at seeded places and lengths."""
    codec = codec or Codec.load()
    rng = random.Random(seed)
    ids = codec.encode(CORPUS_PATH.read_text(encoding="utf-8")[:200_000])
    out: list[Prompt] = []
    while len(out) < n:
        plen = _lognormal(rng, mix.prompt_median, mix.prompt_sigma, *mix.prompt_range)
        start = rng.randrange(len(ids) - plen)
        text = codec.decode(ids[start : start + plen])
        want = _lognormal(rng, mix.output_median, mix.output_sigma, *mix.output_range)
        got = len(codec.encode(text))  # re-encoding a cut can merge differently
        if not text.strip() or got >= CONTEXT - mix.output_range[0]:
            continue
        out.append(Prompt(text, got, min(want, CONTEXT - got)))
    return out


# ---- server-sent events -------------------------------------------------------------


@dataclass
class Event:
    data: bytes
    id: int | None = None


class SseParser:
    """Events from a ``text/event-stream`` body fed in arbitrary pieces: ``id:`` and
    ``data:`` lines up to a blank line; comments (``: waiting``) dropped."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[Event]:
        self._buf += data
        out: list[Event] = []
        while True:
            end = self._buf.find(b"\n\n")
            if end < 0:
                return out
            block, self._buf = self._buf[:end], self._buf[end + 2 :]
            ev_id: int | None = None
            lines = []
            for line in block.split(b"\n"):
                if line.startswith(b"data:"):
                    lines.append(line[5:].removeprefix(b" "))
                elif line.startswith(b"id:"):
                    with contextlib.suppress(ValueError):
                        ev_id = int(line[3:])
            if lines:
                out.append(Event(b"\n".join(lines), ev_id))


def apply(rec: Streamed, ev: Event, at: float, window_end: float) -> bool:
    """One event into its request's record; True at the stream's end."""
    if ev.data == b"[DONE]":
        rec.done = at
        return True
    body: dict[str, Any] = json.loads(ev.data)
    if "error" in body:
        rec.error = f"stream {body['error'].get('type', 'error')}"
        return False
    if body.get("usage"):
        rec.usage_tokens = body["usage"].get("completion_tokens")
    for choice in body.get("choices") or ():
        if choice.get("text"):
            rec.chunk(at, window_end)
        if choice.get("finish_reason"):
            rec.finish_reason = choice["finish_reason"]
    return False


# ---- the client ---------------------------------------------------------------------


class HttpBroke(Exception):
    pass


class Conn:
    """One kept-alive HTTP/1.1 connection, one streamed request at a time."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.path = (u.path or "") + "/v1/completions"
        self.head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.reader is None or self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self.reader, self.writer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def stream(self, p: Prompt, rec: Streamed, window_end: float) -> None:
        body = json.dumps(
            {"model": LM, "prompt": p.text, "max_tokens": p.max_tokens, "temperature": 0,
             "stream": True, "stream_options": {"include_usage": True}}
        ).encode()  # fmt: skip
        raw = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}\r\n{self.head}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        reader, writer = await self._open()
        rec.sent = time.monotonic()
        writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        rec.status = int(lines[0].split(" ", 2)[1])
        fields = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            fields[k.strip().lower()] = v.strip()
        chunked = "chunked" in fields.get("transfer-encoding", "")
        if rec.status != 200:
            rec.error = f"http {rec.status}"
        parser = SseParser()
        if not chunked:  # an error's JSON body, or a whole answer
            await reader.readexactly(int(fields.get("content-length", "0")))
        else:
            while True:
                size_line = await reader.readline()
                if not size_line:
                    raise HttpBroke("connection closed mid-stream")
                size = int(size_line.split(b";")[0].strip(), 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")  # no trailers from the API
                    break
                data = await reader.readexactly(size + 2)
                at = time.monotonic()
                if rec.status == 200:
                    for ev in parser.feed(data[:-2]):
                        apply(rec, ev, at, window_end)
        if fields.get("connection", "").lower() == "close":
            self.close()


async def _stream_loop(
    url: str,
    headers: dict[str, str],
    todo: Iterator[Prompt],
    records: list[Streamed],
    window_end: float,
    timeout_s: float,
) -> None:
    conn = Conn(url, headers)
    try:
        while time.monotonic() < window_end:
            p = next(todo)
            rec = Streamed(sent=time.monotonic(), max_tokens=p.max_tokens, prompt_tokens=p.tokens)
            records.append(rec)
            try:
                await asyncio.wait_for(conn.stream(p, rec, window_end), timeout_s)
            except (OSError, asyncio.IncompleteReadError, HttpBroke, ValueError) as exc:
                rec.error = rec.error or f"connection {type(exc).__name__}"
                conn.close()
                await asyncio.sleep(0.2)
            except TimeoutError:
                rec.error = rec.error or "client timeout"
                conn.close()
    finally:
        conn.close()


def _cycle(pool: list[Prompt]) -> Iterator[Prompt]:
    while True:
        yield from pool


def closed_loop(
    url: str,
    headers: dict[str, str],
    pool: list[Prompt],
    streams: int,
    seconds: float,
    timeout_s: float = 300.0,
) -> tuple[list[Streamed], float, float]:
    """``streams`` closed-loop streams for ``seconds``; the requests in flight when the
    window closes run to their end (their chunks after it are not in tokens/s).
    Returns the records and the window (monotonic start, end)."""

    async def main() -> tuple[list[Streamed], float, float]:
        records: list[Streamed] = []
        todo = _cycle(pool)
        t0 = time.monotonic()
        end = t0 + seconds
        await asyncio.gather(
            *(_stream_loop(url, headers, todo, records, end, timeout_s) for _ in range(streams))
        )
        return records, t0, end

    try:
        import uvloop

        return uvloop.run(main())
    except ImportError:
        return asyncio.run(main())
