"""Request ids that sort by time (UUIDv7, RFC 9562), and ids derived from them.

The request log's primary key is a B-tree on the request id. Random ids (UUIDv4) put
every new row on a random leaf page of it, so once the index outgrows PostgreSQL's
shared buffers each insert and each fetch of a fresh answer evicts and reads a page, and
after every checkpoint each touched page is written to the WAL whole. Ids that start
with their creation time put new rows on the index's right edge, a few hot pages, at any
size (docs/decisions/0072-time-ordered-request-ids.md).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable

_MS = (1 << 48) - 1
_RAND_A = (1 << 12) - 1
_RAND_B = (1 << 62) - 1
_VERSION_7 = 0x7 << 76
_VARIANT = 0b10 << 62


def _text(n: int) -> str:
    x = f"{n:032x}"
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def _compose(ms: int, rand: int) -> str:
    """A v7 id: 48 bits of Unix ms, the version, 12 random bits, the variant, 62 more."""
    head = (ms & _MS) << 80 | _VERSION_7 | ((rand >> 62) & _RAND_A) << 64
    return _text(head | _VARIANT | rand & _RAND_B)


def uuid7(now_ms: int | None = None) -> str:
    """A new request id in canonical text form, ordered by ``now_ms`` (Unix ms; now when
    None) and unique by its 74 random bits."""
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    return _compose(ms, int.from_bytes(os.urandom(10)))


def time_ordered(request_id: str) -> bool:
    """Whether ``request_id`` (canonical text) is a v7 id, whose first 48 bits are a time."""
    return len(request_id) == 36 and request_id[14] == "7"


def _ms_of(first: str) -> int:
    return int(first[:8] + first[9:13], 16)


def indexed_uuid7(first: str, salt: str) -> Callable[[int], str]:
    """Ids for the items of ``first`` (a v7 id: a job's) by their index: the time of
    ``first``, then the index in the 32 bits after the version (so a job's rows go to
    its index's edge in item order), then 42 bits of SHA-1 of ``first``, ``salt`` (an
    attempt) and the index, so two jobs of one millisecond, or two attempts of an item,
    still differ. Reproducible: a retry names the same rows."""
    time_text = first[:14] + "7"  # the job's time and the version, as text
    prefix = hashlib.sha1(f"{first}\x00{salt}\x00".encode())

    def item_id(index: int) -> str:
        h = prefix.copy()
        h.update(str(index).encode())
        tail = int.from_bytes(h.digest()[:6]) >> 6  # 42 bits
        i = index & 0xFFFF_FFFF
        y = f"{_VARIANT | (i & 0xFFFFF) << 42 | tail:016x}"
        return f"{time_text}{i >> 20:03x}-{y[:4]}-{y[4:]}"

    return item_id


def derived_uuid7(first: str, salt: str) -> str:
    """A v7 id for ``salt`` under ``first`` (a v7 id): the same time as ``first``, and
    74 bits of SHA-1 of both, so that it is reproducible (a retry names the same row)
    and lands beside ``first`` in the index."""
    ms = _ms_of(first)
    digest = hashlib.sha1(f"{first}\x00{salt}".encode()).digest()
    return _compose(ms, int.from_bytes(digest[:10]))
