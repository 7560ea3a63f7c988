"""Whether PostgreSQL is down, slow or fine, judged from all this API instance sees of
it, not from one probe. Pure; the clock (monotonic seconds) is passed in.

A probe that times out while a checkpoint flushes is a slow database, not a down one:
taking the instance out of its load balancer then refuses every request although
commits still land a moment later (issue 30, decision 39). So the probe is one sign
among several:

* **answered**: a query of this instance came back - the readiness probe, or the load
  watch's heartbeat, a write committed four times a second (its time is the commit
  latency this instance measures);
* **heard**: a result announcement arrived - someone's commit went through;
* **timed out**: a probe got no answer in time;
* **failed**: a query of this instance failed outright (refused, reset, an error).

The database is *down* when a failure came after the last answer (a refused connection
stays refused until something works again), or when no sign of life - an answer or an
announcement - came for ``stale_s``: the age past which peers stop counting this
instance's heartbeat (``load_report_stale_s``), so the instance leaves its load balancer
exactly when it leaves its peers' count. It is *slow* while the last probe timed out
and nothing answered since, and *ok* otherwise. Only *down* makes the instance unready.
"""

from __future__ import annotations

from typing import Literal

State = Literal["ok", "slow", "down"]

# Smoothing of the measured query latency (a reading, not a threshold: one commit's
# weight in the reported figure).
ALPHA = 0.2


class DatabaseHealth:
    def __init__(self, *, stale_s: float):
        self.stale_s = stale_s
        self.answered_at: float | None = None
        self.heard_at: float | None = None
        self.timed_out_at: float | None = None
        self.failed_at: float | None = None
        self.latency_ms: float | None = None  # smoothed, of answered queries that were timed

    def answered(self, now: float, seconds: float | None = None) -> None:
        self.answered_at = now
        if seconds is not None:
            ms = seconds * 1000
            self.latency_ms = (
                ms if self.latency_ms is None else self.latency_ms + ALPHA * (ms - self.latency_ms)
            )

    def heard(self, now: float) -> None:
        self.heard_at = now

    def timed_out(self, now: float) -> None:
        self.timed_out_at = now

    def failed(self, now: float) -> None:
        self.failed_at = now

    def state(self, now: float) -> State:
        answered = self.answered_at
        if self.failed_at is not None and (answered is None or self.failed_at >= answered):
            return "down"
        alive = max((t for t in (answered, self.heard_at) if t is not None), default=None)
        if alive is None or now - alive > self.stale_s:
            return "down"
        if self.timed_out_at is not None and (answered is None or self.timed_out_at >= answered):
            return "slow"
        return "ok"
