"""A fetched Kafka message becomes a queued request, or a reject. Pure.

Only the API produces to the request topics, but anything that reaches them (an older
or newer producer, an operator's tool, a damaged record) must not stall a partition. A
message is queued only if every field the scheduler relies on has its type: what would
otherwise fail later (a batch key that cannot be hashed, a time that cannot become a
timestamp, an id PostgreSQL refuses) is caught here. The rest becomes a ``Reject``:
copied to the dead-letter topic, recorded as a failed row when the message names its
request and tenant (so a waiting caller gets an answer), and skipped. Fields this
version does not know are ignored, so a newer API can add one without a lockstep
upgrade. Content that only PostgreSQL refuses (a NUL in a string) is queued and run:
the persister isolates such a row (docs/decisions/0019-bad-rows-and-bad-messages.md).
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

import orjson

from core.messages import RequestMessage
from core.models.spec import ModelSpec
from core.vocab import PRIORITY_CLASSES, PriorityClass, RequestStatus
from results.db import ts
from results.schema import RequestRow
from scheduler.batcher import BatchKey, Pending
from scheduler.dispatch import Reject

# An unknown class is queued as free traffic: never ahead of a tier that pays.
DEFAULT_RANK = PriorityClass.FREE.rank
INT4_MAX = 2**31 - 1
# Times PostgreSQL's timestamptz and Python's datetime both hold (years 1970..5138).
MAX_EPOCH_S = 1e11

_NUMBER = (int, float)
_STR = (str,)
_MISSING = object()
# (field, the types it may have, required). Exact types: true is not a number here.
_FIELDS: tuple[tuple[str, tuple[type, ...], bool], ...] = (
    ("request_id", _STR, True),
    ("tenant_id", _STR, True),
    ("priority", _STR, True),
    ("model", _STR, True),
    ("version", _STR, True),
    ("params", (dict,), True),
    ("deadline", _NUMBER, True),
    ("received_at", _NUMBER, True),
    ("body_hash", _STR, False),
    ("job_id", _STR, False),
    ("item_index", (int,), False),
    ("attempt", (int,), False),
    ("job_attempt", (int,), False),
    ("weight", _NUMBER, False),
    ("extra", (dict,), False),
)
_KNOWN = frozenset(f.name for f in fields(RequestMessage))
# The form the API writes ids in (str(uuid4())); anything else is parsed the slow way.
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Malformed(ValueError):
    """The message lacks a field the scheduler relies on, or has one of the wrong type."""


def decode(
    value: bytes | None,
    *,
    tp: tuple[str, int],
    offset: int,
    produced_at: float | None,
    now: float,
    specs: Mapping[str, Mapping[str, ModelSpec]],
) -> Pending | Reject:
    """The request in ``value`` (read from ``tp`` at ``offset`` at time ``now``)."""
    raw = value or b""
    # A reject is recorded at its topic's priority: it holds that partition's commits.
    klass = tp[0].rsplit(".", 1)[-1]
    urgency = PRIORITY_CLASSES.index(klass) if klass in PRIORITY_CLASSES else DEFAULT_RANK
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return Reject(tp, offset, raw, f"not JSON: {exc}", priority=urgency)
    if not isinstance(data, dict):
        why = f"not a JSON object but {type(data).__name__}"
        return Reject(tp, offset, raw, why, priority=urgency)
    try:
        req = _message(data)
        spec = specs.get(req.model, {}).get(req.version)
        params = spec.batch_params(req.params) if spec else tuple(sorted(req.params.items()))
        key = BatchKey(req.model, req.version, params)
        hash(key)  # a list or object in a batching parameter cannot key a queue
    except (Malformed, KeyError, TypeError) as exc:
        reason = f"{type(exc).__name__}: {exc}" if not isinstance(exc, Malformed) else str(exc)
        row = _failed_row(data, tp, offset, produced_at, now, reason)
        return Reject(tp, offset, raw, reason, row, priority=urgency)
    req.extra["produced_at"] = produced_at
    rank = (
        PRIORITY_CLASSES.index(req.priority) if req.priority in PRIORITY_CLASSES else DEFAULT_RANK
    )
    return Pending(msg=req, key=key, rank=rank, tp=tp, offset=offset, consumed_at=now)


def _message(data: dict[str, Any]) -> RequestMessage:
    for name, kinds, required in _FIELDS:
        v = data.get(name, _MISSING)
        if v is _MISSING or (v is None and not required):
            if required:
                raise Malformed(f"missing field {name}")
            continue
        if type(v) not in kinds:
            raise Malformed(f"field {name} has type {type(v).__name__}")
    if "input" not in data:
        raise Malformed("missing field input")
    _check_uuid("request_id", data["request_id"])
    _check_uuid("tenant_id", data["tenant_id"])
    if data.get("job_id") is not None:
        _check_uuid("job_id", data["job_id"])
    for name in ("deadline", "received_at"):
        if not 0 < data[name] < MAX_EPOCH_S:
            raise Malformed(f"field {name} is not a time: {data[name]!r}")
    for name in ("item_index", "attempt", "job_attempt"):
        v = data.get(name)
        if v is not None and not 0 <= v <= INT4_MAX:
            raise Malformed(f"field {name} out of range: {v!r}")
    weight = data.get("weight", 1.0)
    if not (math.isfinite(weight) and weight > 0):
        raise Malformed(f"field weight must be a positive number, not {weight!r}")
    try:
        return RequestMessage(**data)
    except TypeError:  # a field this version does not know
        return RequestMessage(**{k: v for k, v in data.items() if k in _KNOWN})


def _check_uuid(name: str, v: str) -> None:
    if _CANONICAL_UUID.fullmatch(v) is None:
        try:
            uuid.UUID(v)
        except ValueError:
            raise Malformed(f"field {name} is not a UUID") from None


def _failed_row(
    data: dict[str, Any],
    tp: tuple[str, int],
    offset: int,
    produced_at: float | None,
    now: float,
    reason: str,
) -> RequestRow | None:
    """The request log's row for a rejected message that names a valid request and
    tenant; the rest is what can be read of it, or None."""
    try:
        request_id, tenant_id = str(data["request_id"]), str(data["tenant_id"])
        uuid.UUID(request_id)
        uuid.UUID(tenant_id)
    except (KeyError, ValueError):
        return None

    def text(name: str, default: str) -> str:
        v = data.get(name)
        return v if isinstance(v, str) else default

    job_id = data.get("job_id")
    try:
        job_id = str(uuid.UUID(job_id)) if isinstance(job_id, str) else None
    except ValueError:
        job_id = None
    index = data.get("item_index")
    if not (isinstance(index, int) and 0 <= index <= INT4_MAX) or isinstance(index, bool):
        index = None
    given: Any = data.get("received_at")
    ok = type(given) in _NUMBER and 0 < given < MAX_EPOCH_S
    received: float = given if ok else (produced_at or now)
    return {
        "request_id": request_id,
        "tenant_id": tenant_id,
        "priority": text("priority", tp[0].rsplit(".", 1)[-1]),
        "model": text("model", ""),
        "model_version": text("version", ""),
        "params": data["params"] if isinstance(data.get("params"), dict) else {},
        "input": None,
        "status": RequestStatus.FAILED,
        "output": None,
        "output_vector": None,
        "error": f"the request message could not be read: {reason}",
        "attempts": 1,
        "batch_id": None,
        "batch_size": None,
        # A job item's row counts toward its job, which can then finish.
        "job_id": job_id,
        "item_index": index,
        "received_at": datetime.fromtimestamp(received, UTC),
        "produced_at": ts(produced_at),
        "consumed_at": ts(now),
        "batched_at": None,
        "compute_start_at": None,
        "compute_end_at": None,
        "deadline_at": None,
        "kafka_topic": tp[0],
        "kafka_partition": tp[1],
        "kafka_offset": offset,
    }
