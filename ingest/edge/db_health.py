"""Whether PostgreSQL is down, slow or fine, judged from all this API instance sees of
it, not from one probe. Pure; the clock (monotonic seconds) is passed in.

A probe that times out while a checkpoint flushes is a slow database, not a down one:
taking the instance out of its load balancer then refuses every request although
commits still land a moment later (issue 30, decision 39). So the probe is one sign
among several:

* **answered**: a query of this instance came back - the readiness probe, or the load
  watch's heartbeat, a write committed four times a second (its time, and the age of
  one under way, is the commit latency this instance measures: ``commit_s``);
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

from collections import deque
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
        self._commits: deque[tuple[float, float]] = deque()  # (when, seconds) of writes
        self._writing_since: float | None = None  # a timed write under way since

    def answered(self, now: float, seconds: float | None = None) -> None:
        self.answered_at = now
        if seconds is not None:
            ms = seconds * 1000
            self.latency_ms = (
                ms if self.latency_ms is None else self.latency_ms + ALPHA * (ms - self.latency_ms)
            )

    def writing(self, now: float) -> None:
        """A write of this instance (the heartbeat) begins; ``committed`` ends it."""
        self._writing_since = now

    def write_failed(self) -> None:
        """The write under way failed: it is no longer under way (the probe, not the
        heartbeat, judges whether the database fails: a heartbeat can fail for its own
        reasons)."""
        self._writing_since = None

    def committed(self, now: float, seconds: float) -> None:
        self._writing_since = None
        self._commits.append((now, seconds))
        self.answered(now, seconds)

    def stall_s(self, now: float) -> float:
        """How long the write under way has waited so far (0 when none is): a lower
        bound on what any commit takes now, certain rather than remembered."""
        return 0.0 if self._writing_since is None else max(0.0, now - self._writing_since)

    def commit_s(self, now: float) -> float:
        """How long a commit takes now, as measured: the slowest of the writes that ended
        within ``stale_s``, or the age of the one under way if that is longer (during a
        stall no write ends, and this grows with it)."""
        while self._commits and now - self._commits[0][0] > self.stale_s:
            self._commits.popleft()
        done = max((s for _, s in self._commits), default=0.0)
        return max(done, self.stall_s(now))

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


def report_window_s(stale_s: float, commit_s: float) -> float:
    """How old a periodic report in the database may look before its writer counts as
    gone, when commits take ``commit_s``: a report is stamped when its transaction
    starts and shows one commit later, and its writer starts the next one only after
    that commit, so between two that land its stamp ages by up to two commits more
    than with instant commits. A report older than that was not written: its writer
    is gone (decision 39)."""
    return stale_s + 2 * commit_s


def too_slow_to_store(deadline_s: float, commit_s: float, least_s: float) -> str | None:
    """Why a request cannot be answered in time when storing its result alone takes
    ``commit_s`` on top of the least the model takes (``least_s``); None when it can.
    A slow commit that leaves time is no reason to refuse: the answer is only later.
    Admission passes the stall under way (``stall_s``), not the slowest recent commit:
    a refusal must be for a loss that is certain, and ends with the stall."""
    if commit_s <= 0 or deadline_s >= least_s + commit_s:
        return None
    return (
        f"cannot finish within its deadline of {deadline_s * 1000:.0f} ms while the "
        f"database takes {commit_s * 1000:.0f} ms to store a result; retry shortly"
    )
