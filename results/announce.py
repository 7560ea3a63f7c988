"""What a result announcement (NOTIFY on RESULTS_CHANNEL) carries, both ways. Pure.

A payload is a JSON object ``{"results": [...], "ids": [...]}``. ``results`` are whole
answers of sync requests written by this transaction: everything the API needs to reply
(the request log's columns it reads), so the waiting instance answers without a query.
``ids`` are requests whose answer is not inlined (a result too large for a payload, or a
redelivered request whose row was written earlier): their waiter fetches the row.
Timestamps travel as epoch seconds and come back as the aware datetimes a fetched row
has; a vector output travels as ``output_vector`` in base64 (its stored float32 bytes,
results/vectors.py) and comes back as those bytes. PostgreSQL caps a payload at 8000
bytes; payloads are cut to stay below it.
See docs/decisions/0003-results-announced-by-notify.md.
"""

from __future__ import annotations

import binascii
from collections.abc import Container, Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import orjson

from results.vectors import from_base64

if TYPE_CHECKING:  # the shape only: this module stays pure
    from results.requests import AnswerRow

# Below PostgreSQL's 8000-byte cap, with room for the envelope.
PAYLOAD_MAX = 7000
# A result larger than this is announced by id: a few such would fill a payload alone.
# A 384-value embedding (2,048 base64 characters) and its times fit.
INLINE_MAX = 3000

# The request log's times an answer reports; persisted_at is the database's own.
TIMES = ("received_at", "consumed_at", "batched_at", "compute_start_at", "compute_end_at")
PLAIN = ("request_id", "status", "error", "model", "model_version", "batch_size")
# What the rows of one batch share (Answers encodes it once) and what each row has.
_SHARED_PLAIN = ("status", "error", "model", "model_version", "batch_size")
_SHARED_TIMES = ("batched_at", "compute_start_at", "compute_end_at")
_SHARED = (*_SHARED_PLAIN, *_SHARED_TIMES)


def _epoch(d: datetime | None) -> float | None:
    return None if d is None else d.timestamp()


class Answers:
    """The inline answers of one transaction. A batch's rows share their status, model,
    batch size, batch times and the transaction's ``persisted_at``: that part of the
    JSON is made once per distinct set of values, and each row adds only its id, its
    own times and its output. (At tens of thousands of sync rows a second, making each
    answer whole cost the scheduler about a quarter of its time: docs/bench/store.md.)"""

    def __init__(self, persisted_at: datetime):
        self.persisted_at = persisted_at.timestamp()
        self._shared: dict[tuple[Any, ...], bytes] = {}
        self._epochs: dict[datetime, float] = {}

    def _epoch(self, d: datetime | None) -> float | None:
        """Epoch seconds of a time rows often share (consumed in one fetch)."""
        if d is None:
            return None
        t = self._epochs.get(d)
        if t is None:
            t = self._epochs[d] = d.timestamp()
        return t

    def _shared_part(self, row: Mapping[str, Any]) -> bytes:
        key = tuple(row[k] for k in _SHARED)
        part = self._shared.get(key)
        if part is None:
            out: dict[str, Any] = {k: row[k] for k in _SHARED_PLAIN}
            for k in _SHARED_TIMES:
                out[k] = _epoch(row[k])
            out["persisted_at"] = self.persisted_at
            part = self._shared[key] = orjson.dumps(out)[1:-1]  # without its braces
        return part

    def answer(
        self,
        row: Mapping[str, Any],
        output_json: str | None,
        vector: bytes | None,
    ) -> bytes:
        """``row``'s answer; ``output_json`` is the output as written to the request log,
        ``vector`` its stored float32 bytes (the answer carries them in base64)."""
        own = orjson.dumps(
            {
                "request_id": str(row["request_id"]),
                "received_at": _epoch(row["received_at"]),
                "consumed_at": self._epoch(row["consumed_at"]),
                "output": None if output_json is None else orjson.Fragment(output_json),
            }
        )
        if vector is not None:
            b64 = binascii.b2a_base64(vector, newline=False)
            own = own[:-1] + b',"output_vector":"' + b64 + b'"}'
        return own[:-1] + b"," + self._shared_part(row) + b"}"


def payloads(results: Iterable[bytes], ids: Iterable[str]) -> list[str]:
    """Pack inline answers and bare ids into as few payloads as fit under the cap."""
    out: list[str] = []
    res: list[bytes] = []
    rest: list[str] = []
    size = 0

    def flush() -> None:
        nonlocal res, rest, size
        if res or rest:
            body = b'{"results":[' + b",".join(res) + b'],"ids":' + orjson.dumps(rest) + b"}"
            out.append(body.decode())
        res, rest, size = [], [], 0

    for r in results:
        if len(r) > INLINE_MAX:
            raise ValueError("an inline result must be at most INLINE_MAX bytes")
        if size + len(r) + 1 > PAYLOAD_MAX - 40:
            flush()
        res.append(r)
        size += len(r) + 1
    for rid in ids:
        if size + len(rid) + 3 > PAYLOAD_MAX - 40:
            flush()
        rest.append(rid)
        size += len(rid) + 3
    flush()
    return out


# What reading one answer may raise on a payload not written by ``Answers`` (a time out
# of datetime's range raises OverflowError, OSError or ValueError by platform).
_UNREADABLE = (ValueError, KeyError, TypeError, OverflowError, OSError, binascii.Error)


def _row(r: dict[str, Any]) -> dict[str, Any]:
    for k in (*TIMES, "persisted_at"):
        v = r[k]
        r[k] = None if v is None else datetime.fromtimestamp(v, UTC)
    vector = r.get("output_vector")
    r["output_vector"] = None if vector is None else from_base64(vector)
    return r


def parse(payload: str, wanted: Container[str] | None = None) -> tuple[list[AnswerRow], list[str]]:
    """(answers as rows, like a fetched row; ids to fetch) from one payload. With
    ``wanted``, only the answers whose request id it holds are made into rows: every API
    process hears every announcement, and most answers are another process's. An answer
    that cannot be read (a time out of range, say) is fetched by its id instead; a
    payload that is not an announcement at all raises ValueError."""
    data = orjson.loads(payload)
    results, ids = (data.get("results"), data.get("ids")) if isinstance(data, dict) else (0, 0)
    if not isinstance(results, list) or not isinstance(ids, list):
        raise ValueError("not a result announcement")
    rows, fetch = [], [i for i in ids if isinstance(i, str)]
    for r in results:
        rid = r.get("request_id") if isinstance(r, dict) else None
        if not isinstance(rid, str) or (wanted is not None and rid not in wanted):
            continue
        try:
            rows.append(cast("AnswerRow", _row(r)))
        except _UNREADABLE:
            fetch.append(rid)
    return rows, fetch
