"""What the API refused and when it gave up, kept for the request log. Pure.

Refusals (401, 429, 503, 504) are counted per second, tenant, tier, status and reason
in the API process and written about once a second (ingest/edge/request_log_flush.py), so
an overload of N refusals a second costs one small insert a second, not N rows. The
reason is the error's own short word (``reason_of``), never the error's text.
A sync request the API gave up on (its 504) is remembered individually (request id,
received_at, when): the request log's late_answers view tells a 504 whose result was
stored later from one answered in time. Both buffers are bounded: past their cap,
new distinct keys fold into the tenant-less count, and timeouts beyond it are dropped
(and counted), so a flood cannot grow an API process's memory.
"""

from __future__ import annotations

import math
import time
from contextvars import ContextVar
from dataclasses import dataclass

from core.errors import GristmillError

# The statuses recorded as refusals.
REFUSED = frozenset({401, 429, 503, 504})
# Distinct (second, tenant, tier, status, reason) keys held between flushes; a few
# seconds of every tenant refused for every reason fits well below it.
MAX_KEYS = 20_000
# Timeouts held between flushes: a second of 504s at several thousand requests/s.
MAX_TIMEOUTS = 20_000

# The tenant of the request being answered (set by authentication), so a refusal raised
# anywhere after it is counted against its tenant; None before (a bad key).
current_tenant: ContextVar[tuple[str, str] | None] = ContextVar("current_tenant", default=None)


def reason_of(err: GristmillError) -> str:
    """A refusal's reason: the error's own word (core/errors.py), the label its
    Prometheus counter carries too, so the log and the metrics agree."""
    return err.reason


@dataclass(frozen=True, slots=True)
class RefusalKey:
    second: int  # epoch seconds
    tenant_id: str | None
    tier: str | None
    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class Timeout:
    request_id: str
    tenant_id: str
    received_at: float  # epoch s: the request log's partition key for this request
    gave_up_at: float  # epoch s


class RefusalCounts:
    """Refusal counts by second and key, drained once their second is over."""

    def __init__(self, max_keys: int = MAX_KEYS):
        self.max_keys = max_keys
        self._counts: dict[RefusalKey, int] = {}
        self.folded = 0  # refusals counted without their tenant because the cap was hit

    def record(self, now: float, status: int, reason: str, tenant: tuple[str, str] | None) -> None:
        tenant_id, tier = tenant if tenant is not None else (None, None)
        key = RefusalKey(math.floor(now), tenant_id, tier, status, reason)
        if key not in self._counts and len(self._counts) >= self.max_keys:
            key = RefusalKey(key.second, None, tier, status, reason)
            self.folded += 1
        self._counts[key] = self._counts.get(key, 0) + 1

    def drain(self, now: float, *, everything: bool = False) -> list[tuple[RefusalKey, int]]:
        """Counts of the seconds that are over (all of them when ``everything``)."""
        current = math.floor(now)
        out = [(k, n) for k, n in self._counts.items() if everything or k.second < current]
        for k, _ in out:
            del self._counts[k]
        return out

    def restore(self, counts: list[tuple[RefusalKey, int]]) -> None:
        """Put back counts a failed write could not store (merged, within the cap)."""
        for k, n in counts:
            if k in self._counts or len(self._counts) < self.max_keys:
                self._counts[k] = self._counts.get(k, 0) + n

    def pending(self) -> int:
        return len(self._counts)


class TimeoutLog:
    """Sync requests the API gave up on, until they are written."""

    def __init__(self, max_pending: int = MAX_TIMEOUTS):
        self.max_pending = max_pending
        self._items: list[Timeout] = []
        self.dropped = 0

    def record(self, t: Timeout) -> None:
        if len(self._items) >= self.max_pending:
            self.dropped += 1
            return
        self._items.append(t)

    def drain(self) -> list[Timeout]:
        out, self._items = self._items, []
        return out

    def restore(self, items: list[Timeout]) -> None:
        room = self.max_pending - len(self._items)
        self.dropped += max(0, len(items) - room)
        self._items[:0] = items[: max(0, room)]


# One of each per API process (like a metrics registry): errors are mapped to answers in
# one place (ingest/edge/http.py), which has no handle on the app's state.
REFUSALS = RefusalCounts()
TIMEOUTS = TimeoutLog()


def note_refusal(err: GristmillError, now: float | None = None) -> None:
    """Count ``err`` if it is a refusal, against the tenant being answered."""
    if err.status in REFUSED:
        REFUSALS.record(
            time.time() if now is None else now, err.status, reason_of(err), current_tenant.get()
        )
