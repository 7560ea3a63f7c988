"""Job writes give way to sync writes while commits are slow. Pure; the clock is passed in.

Every result write ends in a commit, and every commit waits for the WAL to be flushed
up to its own record: one stream, shared by all writers. A job write of thousands of
rows (full-page images of every index page it touches first after a checkpoint) puts
megabytes in that stream, and a sync commit behind it waits for them to reach the
disk. While commits are fast that wait is a millisecond nobody needs to save; while
they are slow (a checkpoint on a busy disk, a vacuum, a replica catching up) it is the
sync answers that wait, and past their deadlines they are lost (issue 30, decision 39).

So the persister measures its own writes and, while commits are slow, starts a job
write only when no sync write is queued or under way, one at a time. Commits are slow
when the sync write under way, or the last one, takes more than ``SLOW_FACTOR`` times
the median of the recent sync writes (this scheduler's own baseline, measured). A job
write already under way finishes. Jobs are backfill: held, their results wait in the
persister and the jobs lane stops reading (scheduler/core/backpressure.py); and a disk that
stays slow becomes the baseline within ``HISTORY`` sync writes, so jobs resume.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque

# Sync writes whose durations make the baseline: a few seconds of traffic.
HISTORY = 64
# A write this many times the median is a slow moment, not the usual noise of a
# commit (the 95th percentile of this machine's fdatasync was 13 times its median,
# one write in twenty; the factor only decides when jobs step aside).
SLOW_FACTOR = 4.0
# Sync writes measured before a baseline is trusted.
MIN_HISTORY = 8


class WriteYield:
    """Told by the persist threads; asked by the pool (its own lock: the threads run at
    once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sync: deque[float] = deque(maxlen=HISTORY)
        self._baseline: float | None = None
        self._sync_since: float | None = None  # a sync write under way since (monotonic)

    def sync_started(self, now: float) -> None:
        with self._lock:
            self._sync_since = now

    def sync_finished(self, seconds: float) -> None:
        with self._lock:
            self._sync_since = None
            self._sync.append(seconds)
            if len(self._sync) >= MIN_HISTORY:
                self._baseline = statistics.median(self._sync)

    def sync_failed(self) -> None:
        """The write under way failed (it is retried, and timed again)."""
        with self._lock:
            self._sync_since = None

    def slow(self, now: float) -> bool:
        with self._lock:
            if self._baseline is None:
                return False
            last = self._sync[-1] if self._sync else 0.0
            running = 0.0 if self._sync_since is None else now - self._sync_since
            return max(last, running) > SLOW_FACTOR * self._baseline

    def hold_job(self, now: float, *, sync_busy: bool, jobs_running: int) -> bool:
        """Whether a job write must wait before it starts: only while commits are slow,
        and then while a sync write is queued or under way, or another job write runs."""
        return self.slow(now) and (sync_busy or jobs_running > 0)
