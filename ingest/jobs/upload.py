"""Staging a job's items before anything is written to PostgreSQL (decision 26).

An upload arrives at the client's pace, which may be slow or may stop. It is read
into a temp file, validated item by item as it comes, in the COPY text format; only
once it is complete and valid does one short transaction COPY the file into
``job_items``. A stalled upload therefore holds a file and a few buffers, never a
database connection or an open transaction. Memory per upload: one line (at most
``max_body_bytes``, the cap of a single ``/v1/infer`` body) plus one read chunk.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import orjson
from starlette.requests import ClientDisconnect

from core.config import JobSettings
from core.errors import InvalidInput, PayloadTooLarge, RequestTimeout
from core.limits import check_json
from core.messages import job_item_request_ids
from core.models.spec import ModelSpec
from ingest.jobs.incremental import canonical_input, item_hash
from ingest.jobs.schemas import JobItem, check_custom_id, validate

_WRITE_BUFFER = 256 << 10  # characters of rows buffered before a write to the staged file


class LineSplitter:
    """Splits a byte stream into lines in time linear in its size: each chunk is split
    once, and a line that spans chunks is joined once, when its end arrives (the
    naive ``buf += chunk; buf.split()`` rescans the growing buffer for every chunk,
    quadratic in a long line). Lines longer than ``max_line`` bytes are refused as
    soon as they pass the cap, before more of them is held."""

    def __init__(self, max_line: int):
        self.max_line = max_line
        self.lines = 0  # complete lines returned so far
        self._parts: list[bytes] = []
        self._held = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        pieces = chunk.split(b"\n")
        tail = pieces.pop()
        if pieces:
            if self._parts:
                self._parts.append(pieces[0])
                pieces[0] = b"".join(self._parts)
                self._parts, self._held = [], 0
            if max(map(len, pieces)) > self.max_line:
                for p in pieces:  # name the first line over the cap
                    self.lines += 1
                    self._check(len(p))
            self.lines += len(pieces)
        if tail:
            self._held += len(tail)
            self._check(self._held, pending=True)
            self._parts.append(tail)
        return pieces

    def finish(self) -> bytes | None:
        """The last line, when the stream does not end with a newline."""
        if not self._parts:
            return None
        self.lines += 1
        line = b"".join(self._parts)
        self._parts, self._held = [], 0
        return line

    def _check(self, size: int, pending: bool = False) -> None:
        if size > self.max_line:
            n = self.lines + 1 if pending else self.lines
            raise PayloadTooLarge(
                f"line {n}: a JSONL line (one item) may be at most {self.max_line} bytes",
                field=f"line {n}",
            )


def copy_text(value: str) -> str:
    """``value`` as a field of PostgreSQL's COPY text format (NUL is refused earlier)."""
    if "\\" in value:
        value = value.replace("\\", "\\\\")
    if "\t" in value or "\n" in value or "\r" in value:
        value = value.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return value


_UNESCAPE = re.compile(rb"\\(.)")
_UNESCAPED = {b"\\": b"\\", b"t": b"\t", b"n": b"\n", b"r": b"\r"}

# (item_index, input as JSON, request_id, attempt): what the publisher sends of an item.
Item = tuple[int, bytes | str, str, int]


def copy_unescape(field: bytes) -> bytes:
    """The inverse of ``copy_text`` for one field."""
    if b"\\" not in field:
        return field
    return _UNESCAPE.sub(lambda m: _UNESCAPED[m.group(1)], field)


@dataclass
class Staged:
    file: IO[bytes]
    count: int
    body_hash: str
    # Indexes of items whose result was reused from a base job at recording (decision
    # 61): they are never sent to Kafka.
    reused: frozenset[int] = frozenset()

    def close(self) -> None:
        self.file.close()

    def pages(
        self, page_bytes: int, only: frozenset[int] | None = None
    ) -> Iterator[Sequence[Item]]:
        """The staged items in input order, in pages of about ``page_bytes`` bytes: what
        a new job's publish sends, read back from the file the COPY read (every item of
        a new job is unsent) instead of from PostgreSQL. The items not ``reused``, or
        only those of ``only``."""
        self.file.seek(0)
        tail = b""
        while block := self.file.read(page_bytes):
            lines = (tail + block).split(b"\n")
            tail = lines.pop()
            page: list[Item] = []
            for line in lines:
                _, index, _, value, rid, _ = line.split(b"\t")
                if only is not None:
                    if int(index) not in only:
                        continue
                elif self.reused and int(index) in self.reused:
                    continue
                page.append((int(index), copy_unescape(value), rid.decode(), 0))
            if page:
                yield page
        if tail:  # rows end with a newline: nothing is left unless the file was cut
            raise ValueError("the staged file ends inside a row")


def _plain_item(obj: dict[str, Any]) -> bool:
    """``{"input": ...}`` or ``{"custom_id": <str or null>, "input": ...}``: what
    ``JobItem``'s strict schema accepts without a word to say (a 10th of the staging)."""
    n = len(obj)
    if "input" not in obj or n > 2:
        return False
    return n == 1 or (
        "custom_id" in obj and (obj["custom_id"] is None or type(obj["custom_id"]) is str)
    )


class ItemStager:
    """Validates items and writes them, with their request ids, as COPY rows (see
    results.job_items.COPY_ITEMS) into a temp file. Synchronous: run it off the loop."""

    def __init__(
        self,
        job_id: str,
        spec: ModelSpec,
        *,
        max_items: int,
        max_line: int,
        max_depth: int,
        folder: str,
        scope: bytes,
    ):
        self.job_id = job_id
        self.scope = scope  # the job's part of each item's content hash (decision 61)
        self.max_depth = max_depth  # nesting of a non-string input (settings.max_json_depth)
        self._request_id = job_item_request_ids(job_id)
        self.spec = spec
        self.max_items = max_items
        self.count = 0
        self.hasher = hashlib.sha256()
        self.splitter = LineSplitter(max_line)
        self.file: IO[bytes] = tempfile.TemporaryFile(dir=folder or None)  # noqa: SIM115
        self._out: list[str] = []
        self._out_size = 0

    def add(self, item: JobItem, where: str) -> None:
        """One validated item (``where``: "items[3]" or "line 4", for errors)."""
        if self.count >= self.max_items:
            raise PayloadTooLarge(f"a job may hold at most {self.max_items} items")
        check_custom_id(item.custom_id, where)
        if not isinstance(item.input, str):  # a string is the model's to check, length first
            check_json(item.input, f"{where}.input", max_depth=self.max_depth)
        try:
            self.spec.validate_input(item.input)
        except InvalidInput as exc:
            raise InvalidInput(f"{where}: {exc.message}", field=f"{where}.input") from exc
        value = orjson.dumps(item.input).decode()
        cid = "\\N" if item.custom_id is None else copy_text(item.custom_id)
        rid = self._request_id(self.count)
        # bytea in COPY text: \x and hex, its backslash escaped as COPY's.
        digest = item_hash(self.scope, canonical_input(item.input, value)).hex()
        row = f"{self.job_id}\t{self.count}\t{cid}\t{copy_text(value)}\t{rid}\t\\\\x{digest}\n"
        self._out.append(row)
        self._out_size += len(row)
        self.count += 1
        if self._out_size >= _WRITE_BUFFER:
            self._flush()

    def add_object(self, obj: Any, where: str) -> None:
        if type(obj) is dict and _plain_item(obj):  # the common line, without pydantic
            self.add(
                JobItem.model_construct(custom_id=obj.get("custom_id"), input=obj["input"]), where
            )
        else:  # anything else is checked, and its error named, by the schema
            self.add(validate(obj, JobItem, where), where)

    def feed(self, chunk: bytes) -> None:
        """The next chunk of a JSONL upload (fingerprinted as it comes)."""
        self.hasher.update(chunk)
        first = self.splitter.lines + 1
        for n, line in enumerate(self.splitter.feed(chunk), start=first):
            self._line(line, n)

    def _line(self, line: bytes, n: int) -> None:
        if not line.strip():
            return
        where = f"line {n}"
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(f"{where}: not valid JSON ({exc})", field=where) from exc
        self.add_object(obj, where)

    def finish(self) -> Staged:
        last = self.splitter.finish()
        if last is not None:
            self._line(last, self.splitter.lines)
        if self.count == 0:
            raise InvalidInput("a job needs at least one item", field="items")
        self._flush()
        self.file.flush()
        return Staged(self.file, self.count, self.hasher.hexdigest())

    def _flush(self) -> None:
        if self._out:
            self.file.write("".join(self._out).encode())
            self._out, self._out_size = [], 0

    def close(self) -> None:
        self.file.close()


async def body_chunks(
    stream: AsyncIterator[bytes],
    *,
    idle_timeout_s: float,
    max_bytes: int,
    what: str,
    min_rate_bps: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[bytes]:
    """The request body's chunks; 408 when none arrives for ``idle_timeout_s`` seconds
    or, once that long has passed, the body has averaged under ``min_rate_bps`` bytes/s
    (a trickle that never quite stalls); 413 past ``max_bytes`` (counted as the bytes
    arrive, before they are kept)."""
    it = stream.__aiter__()
    size = 0
    start = clock()
    while True:
        try:
            chunk = await asyncio.wait_for(it.__anext__(), idle_timeout_s)
        except StopAsyncIteration:
            return
        except ClientDisconnect as exc:  # nobody reads the answer; nothing was written
            raise InvalidInput("the client closed the upload before it was complete") from exc
        except TimeoutError as exc:
            raise RequestTimeout(
                f"the upload stalled: no data for {idle_timeout_s:g} s",
                headers={"Connection": "close"},
            ) from exc
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"{what} may be at most {max_bytes} bytes")
        elapsed = clock() - start
        if elapsed > idle_timeout_s and size < min_rate_bps * elapsed:
            raise RequestTimeout(
                f"the upload is arriving slower than {min_rate_bps / 1024:g} KiB/s",
                headers={"Connection": "close"},
            )
        if chunk:
            yield chunk


def upload_chunks(
    stream: AsyncIterator[bytes], settings: JobSettings, *, max_bytes: int, what: str
) -> AsyncIterator[bytes]:
    """``body_chunks`` with the uploads' settings: the idle timeout and the least rate."""
    return body_chunks(
        stream,
        idle_timeout_s=settings.upload_idle_timeout_s,
        max_bytes=max_bytes,
        what=what,
        min_rate_bps=settings.upload_min_bytes_per_s,
    )
