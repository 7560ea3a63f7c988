"""What crosses Kafka: one message per accepted request.

The message carries everything the scheduler needs to batch and persist the
request without a database lookup: tenant, priority class, the resolved model
version, the deadline and the ingest timestamps. Times are Unix epoch seconds
(floats) because they are compared across processes and hosts.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from core.ids import indexed_uuid7, time_ordered
from core.vocab import ServiceTier

# Stable namespace for the request ids of job items.
_IDEMPOTENCY_NS = uuid.UUID("0b5c0f7e-4f3a-4a39-9c53-6f0c3f6e2a11")


def job_item_request_id(job_id: str, index: int, attempt: int = 0) -> str:
    """Each attempt of a job item has its own, reproducible request id: for a job made
    before decision 72, the UUIDv5 of "job\\0<job id>\\0<index>\\0<attempt>" in the
    namespace above; for a newer one, a UUIDv7 ordered by the job's time and the index."""
    return job_item_request_ids(job_id, attempt)(index)


def job_item_request_ids(job_id: str, attempt: int = 0) -> Callable[[int], str]:
    """``job_item_request_id`` for the items of one job attempt, index by index. A job
    whose id is time-ordered (made since decision 72) names its items in index order
    under its time (core/ids.py); an older job's items keep their UUIDv5s. The hash of
    the prefix they share is computed once: a million-item upload would otherwise spend
    most of its staging time in ``uuid.uuid5`` (2.3 of 5 us an item)."""
    if time_ordered(job_id):
        return indexed_uuid7(job_id, str(attempt))
    prefix = hashlib.sha1(_IDEMPOTENCY_NS.bytes + f"job\x00{job_id}\x00".encode())
    suffix = f"\x00{attempt}".encode()

    def request_id(index: int) -> str:
        h = prefix.copy()
        h.update(str(index).encode() + suffix)
        b = bytearray(h.digest()[:16])
        b[6] = (b[6] & 0x0F) | 0x50  # version 5
        b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
        x = b.hex()
        return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"

    return request_id


# ``extra`` key: a time (epoch s) past the deadline until which the scheduler keeps the
# request instead of expiring it, because its caller takes a partial answer at the
# deadline and fetches the rest later (decision 63). Absent: expire at the deadline.
KEEP_UNTIL = "keep_until"


def keep_until(extra: dict[str, Any]) -> float | None:
    """A message's ``KEEP_UNTIL`` when it is a finite time, else None (absent, or not a
    time: such a request expires at its deadline, as one without it)."""
    v = extra.get(KEEP_UNTIL)
    if (type(v) is float or type(v) is int) and 0 < v < math.inf:
        return float(v)
    return None


# ``extra`` key: the service tier the request is served as (core/vocab.py ServiceTier,
# decision 66), written to its request-log row. Absent: a job item, or a message from
# before the tier existed.
SERVICE_TIER = "service_tier"
_SERVICE_TIERS = frozenset(ServiceTier)


def service_tier(extra: dict[str, Any]) -> str | None:
    """A message's ``SERVICE_TIER`` when it names a tier, else None."""
    v = extra.get(SERVICE_TIER)
    return v if type(v) is str and v in _SERVICE_TIERS else None


# ``extra`` key: the channel of the API process whose caller waits for the answer
# (results/db.py ``reply_channel``, decision 70); the answer is announced there alone.
# Absent (a job item, a message from before it): announced on the shared channel.
REPLY_TO = "reply_to"


def body_hash(model: str, input_: Any, params: dict[str, Any]) -> str:
    """Fingerprint of what was asked, to tell a retry from a reused key (422)."""
    canon = orjson.dumps({"m": model, "i": input_, "p": params}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canon).hexdigest()


@dataclass(slots=True)
class RequestMessage:
    request_id: str
    tenant_id: str
    priority: str  # priority class: enterprise | paid | free | jobs
    model: str
    version: str
    input: Any
    params: dict[str, Any]
    deadline: float  # epoch s: after this the caller no longer waits
    received_at: float  # epoch s: the API accepted the HTTP request
    body_hash: str = ""
    job_id: str | None = None
    item_index: int | None = None
    attempt: int = 0
    job_attempt: int = 0  # which run of its job this item belongs to (retry adds one)
    weight: float = 1.0  # the tenant's fair share inside its tier (from its plan)
    extra: dict[str, Any] = field(default_factory=dict)
    # Who inside the tenant sent it (a gateway's x-gateway-inference-fairness-id): the
    # tenant's requests share its turn by this (decision 58). None: the tenant's default
    # flow, as every message before the field was added reads.
    fairness_id: str | None = None

    def encode(self) -> bytes:
        # orjson writes the dataclass itself, field by field: dataclasses.asdict would
        # deep-copy the input first (4% of the API's CPU at 1,000 requests/s).
        return orjson.dumps(self)

    @classmethod
    def decode(cls, raw: bytes) -> RequestMessage:
        return cls(**orjson.loads(raw))
