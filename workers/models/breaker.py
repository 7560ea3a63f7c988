"""A circuit breaker for a service a worker calls. Pure: the clock is an argument.

    closed --(``failures`` calls in a row failed)--> open --(``open_s`` passed)--> half-open
    half-open --(the probe succeeded)--> closed;  --(it failed)--> open again

A failed call is one that still failed after its retries (workers/models/http_backend.py
retries transient errors first), so a blip costs a retry, not the circuit. While open,
no call goes out: the batch is handed back to the scheduler unrun (it waits, or goes to
another worker), and the API answers 503 with the time left as Retry-After. In
half-open, exactly one probe goes out; the worker sends it itself rather than risking a
client's batch on a service that may still be down.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Circuit(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass
class Breaker:
    failures: int  # failed calls in a row that open it
    open_s: float  # how long it stays open before a probe
    _streak: int = 0
    _opened_at: float | None = None  # None: closed
    _probing: bool = False
    opened: int = 0  # times it opened (metrics, tests)

    def state(self, now: float) -> Circuit:
        if self._opened_at is None:
            return Circuit.CLOSED
        if now - self._opened_at >= self.open_s:
            return Circuit.HALF_OPEN
        return Circuit.OPEN

    def allows_calls(self, now: float) -> bool:
        """Whether a client's call may go out now (not while open or probing)."""
        return self.state(now) is Circuit.CLOSED

    def retry_after(self, now: float) -> float:
        """Seconds until the next probe (0 when closed or due)."""
        if self._opened_at is None:
            return 0.0
        return max(0.0, self._opened_at + self.open_s - now)

    def start_probe(self, now: float) -> bool:
        """Half-open and no probe out: the caller sends one (True) and reports it."""
        if self.state(now) is not Circuit.HALF_OPEN or self._probing:
            return False
        self._probing = True
        return True

    def success(self, now: float) -> bool:
        """A call (or the probe) succeeded; True when this closed the circuit."""
        was_open = self._opened_at is not None
        self._streak = 0
        self._opened_at = None
        self._probing = False
        return was_open

    def failure(self, now: float) -> bool:
        """A call failed after its retries; True when this opened the circuit."""
        if self._opened_at is not None:
            if self._probing:  # the probe failed: open for another period
                self._probing = False
                self._opened_at = now
            return False
        self._streak += 1
        if self._streak >= self.failures:
            self._opened_at = now
            self.opened += 1
            return True
        return False
