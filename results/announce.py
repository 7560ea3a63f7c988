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

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from results.vectors import from_base64

# Below PostgreSQL's 8000-byte cap, with room for the envelope.
PAYLOAD_MAX = 7000
# A result larger than this is announced by id: a few such would fill a payload alone.
# A 384-value embedding (2,048 base64 characters) and its times fit.
INLINE_MAX = 3000

# The request log's times an answer reports; persisted_at is the database's own.
TIMES = ("received_at", "consumed_at", "batched_at", "compute_start_at", "compute_end_at")
PLAIN = ("request_id", "status", "error", "model", "model_version", "batch_size")


def _epoch(d: datetime | None) -> float | None:
    return None if d is None else d.timestamp()


def inline_result(
    row: Mapping[str, Any],
    persisted_at: datetime,
    output_json: str | None,
    vector_b64: str | None = None,
) -> bytes:
    """One answer as JSON; ``output_json`` is the output as already written to the
    request log and ``vector_b64`` its vector's stored bytes in base64 (so the answer
    decodes to what a fetch of the row would)."""
    out: dict[str, Any] = {k: row[k] for k in PLAIN}
    out["request_id"] = str(out["request_id"])
    for k in TIMES:
        out[k] = _epoch(row[k])
    out["persisted_at"] = persisted_at.timestamp()
    out["output"] = None if output_json is None else orjson.Fragment(output_json)
    if vector_b64 is not None:
        out["output_vector"] = vector_b64
    return orjson.dumps(out)


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


def parse(payload: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(answers as rows, like a fetched row; ids to fetch) from one payload."""
    data = orjson.loads(payload)
    rows = []
    for r in data["results"]:
        for k in (*TIMES, "persisted_at"):
            v = r[k]
            r[k] = None if v is None else datetime.fromtimestamp(v, UTC)
        vector = r.get("output_vector")
        r["output_vector"] = None if vector is None else from_base64(vector)
        rows.append(r)
    return rows, data["ids"]
