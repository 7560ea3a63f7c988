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
from core.request_row import RequestRow
from core.vocab import PRIORITY_CLASSES, PriorityClass, RequestStatus
from scheduler.core.batcher import BatchKey, Pending
from scheduler.core.plans import Reject

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
    ("fairness_id", _STR, False),
)
# Optional fields whose null means "none" (RequestMessage's ``X | None``). In the others,
# null is a wrong type: it would pass here and fail later, in a retry's count
# (attempt), a row (attempts = attempt + 1) or the queueing of the request itself.
_NULLABLE = frozenset({"job_id", "item_index", "fairness_id"})
_KNOWN = frozenset(f.name for f in fields(RequestMessage))
# The form the API writes ids in (str(uuid4())); anything else is parsed the slow way.
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_RANKS: dict[str, int] = {c.value: c.rank for c in PRIORITY_CLASSES}
# Batch keys and tenant ids seen, each kept once (shared by the lanes' threads: a dict's
# get and set are atomic). Bounded: more distinct values than this (keys that vary per
# message, a flood of tenants) empties the cache, which then costs what it saves,
# nothing more. A scheduler serves a handful of keys and at most thousands of tenants.
KEY_CACHE_SIZE = 4096
TENANT_CACHE_SIZE = 65_536
_KEYS: dict[tuple[str, str, tuple[tuple[str, Any], ...]], BatchKey] = {}
_TENANTS: dict[str, str] = {}


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
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return Reject(tp, offset, raw, f"not JSON: {exc}", priority=_urgency(tp))
    if not isinstance(data, dict):
        why = f"not a JSON object but {type(data).__name__}"
        return Reject(tp, offset, raw, why, priority=_urgency(tp))
    try:
        req = _message(data)
        spec = specs.get(req.model, {}).get(req.version)
        key = _batch_key(req.model, req.version, req.params, spec)
    except (Malformed, KeyError, TypeError) as exc:
        reason = f"{type(exc).__name__}: {exc}" if not isinstance(exc, Malformed) else str(exc)
        row = _failed_row(data, tp, offset, produced_at, now, reason)
        return Reject(tp, offset, raw, reason, row, priority=_urgency(tp))
    req.extra["produced_at"] = produced_at
    return Pending(req, key, _RANKS.get(req.priority, DEFAULT_RANK), tp, offset, now)


def _urgency(tp: tuple[str, int]) -> int:
    """A reject is recorded at its topic's priority: it holds that partition's commits."""
    return _RANKS.get(topic_class(tp[0]), DEFAULT_RANK)


def topic_class(topic: str) -> str:
    """The priority class a request topic is named for: its last part (decision 2)."""
    return topic.rsplit(".", 1)[-1]


def _batch_key(
    model: str, version: str, params: dict[str, Any], spec: ModelSpec | None
) -> BatchKey:
    """The queue a request waits in. Equal keys are one object, made once: the key
    cache saves building and hashing a ``BatchKey`` per message (0.4 us of 0.6)."""
    bp = spec.batch_params(params) if spec is not None else tuple(sorted(params.items()))
    # Hashing raises TypeError for a list or object in a batching parameter: such a
    # value cannot key a queue.
    cached = (model, version, bp)
    key = _KEYS.get(cached)
    if key is None:
        key = BatchKey(model, version, bp)
        if len(_KEYS) >= KEY_CACHE_SIZE:  # keys that vary per message: start over
            _KEYS.clear()
        _KEYS[cached] = key
    return key


def _message(data: dict[str, Any]) -> RequestMessage:
    """The message as the API writes it, checked field by field without a loop and
    built without ``**``; anything else (a field missing, null, of another type, out of
    range, an id not in the canonical form) is left to ``_strict_message``, which names
    the first bad field. Every message accepted here is accepted there as the same
    ``RequestMessage`` (tests/unit/scheduler/test_intake.py holds the two together)."""
    get = data.get
    request_id = get("request_id")
    tenant_id = get("tenant_id")
    priority = get("priority")
    model = get("model")
    version = get("version")
    params = get("params")
    deadline = get("deadline")
    received_at = get("received_at")
    body_hash = get("body_hash", "")
    job_id = get("job_id")
    item_index = get("item_index")
    attempt = get("attempt", 0)
    job_attempt = get("job_attempt", 0)
    weight = get("weight", 1.0)
    extra: Any = get("extra", _MISSING)
    fairness_id = get("fairness_id")
    if (
        type(request_id) is str
        and type(tenant_id) is str
        and type(priority) is str
        and type(model) is str
        and type(version) is str
        and type(params) is dict
        and (type(deadline) is float or type(deadline) is int)
        and 0 < deadline < MAX_EPOCH_S
        and (type(received_at) is float or type(received_at) is int)
        and 0 < received_at < MAX_EPOCH_S
        and type(body_hash) is str
        and (job_id is None or (type(job_id) is str and _canonical_uuid(job_id)))
        and (item_index is None or (type(item_index) is int and 0 <= item_index <= INT4_MAX))
        and type(attempt) is int
        and 0 <= attempt <= INT4_MAX
        and type(job_attempt) is int
        and 0 <= job_attempt <= INT4_MAX
        # NaN fails the comparison; orjson reads no integer beyond 64 bits.
        and (
            (type(weight) is float and 0 < weight < math.inf)
            or (type(weight) is int and weight > 0)
        )
        and (extra is _MISSING or type(extra) is dict)
        and (fairness_id is None or type(fairness_id) is str)
        and "input" in data
        and _canonical_uuid(request_id)
        and (tenant_id in _TENANTS or _new_tenant(tenant_id))
    ):
        return RequestMessage(
            request_id,
            _TENANTS[tenant_id],  # one string per tenant, shared by its queued requests
            priority,
            model,
            version,
            data["input"],
            params,
            deadline,
            received_at,
            body_hash,
            job_id,
            item_index,
            attempt,
            job_attempt,
            weight,
            extra if type(extra) is dict else {},  # a dict, or absent
            fairness_id,
        )
    return _strict_message(data)


def _canonical_uuid(v: str) -> bool:
    return _CANONICAL_UUID.fullmatch(v) is not None


def _new_tenant(tenant_id: str) -> bool:
    """Remember a tenant id in canonical form (True), or leave it to the strict path."""
    if not _canonical_uuid(tenant_id):
        return False
    if len(_TENANTS) >= TENANT_CACHE_SIZE:
        _TENANTS.clear()
    _TENANTS[tenant_id] = tenant_id
    return True


def _strict_message(data: dict[str, Any]) -> RequestMessage:
    """Any message: the first field that is missing or bad is named (``Malformed``)."""
    for name, kinds, required in _FIELDS:
        v = data.get(name, _MISSING)
        if v is _MISSING or (v is None and name in _NULLABLE):
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
        "priority": text("priority", topic_class(tp[0])),
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
        "produced_at": None if produced_at is None else datetime.fromtimestamp(produced_at, UTC),
        "consumed_at": datetime.fromtimestamp(now, UTC),
        "batched_at": None,
        "compute_start_at": None,
        "compute_end_at": None,
        "deadline_at": None,
        "kafka_topic": tp[0],
        "kafka_partition": tp[1],
        "kafka_offset": offset,
        "service_tier": None,  # unread: the message's own may be what is wrong
    }
