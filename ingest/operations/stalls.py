"""The event loop's stalls, named: what the loop's thread was running when it ran no
timer for longer than a threshold, logged once a stall.

The overload guard (ingest/admission/overload.py) sees a stall only as lag after the
fact, and sheds for it; the lag alone does not say what held the loop (a slow callback,
a thread holding the interpreter lock, a collection, a blocking call). A watcher thread
samples the loop thread's Python stack while a stall lasts and logs the frames it saw
most, with the stall's length, when it ends. Off unless ``loop_stall_log_ms`` is set:
for finding a cause (issue 30 item 4), not for every deployment.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections import Counter

log = logging.getLogger(__name__)


def _frames(frame: object, depth: int = 6) -> str:
    """The innermost ``depth`` frames of a stack, innermost last, as file:line function."""
    stack = traceback.extract_stack(frame)[-depth:]  # type: ignore[arg-type]
    return " > ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in stack)


class StallWatch:
    """A heartbeat on the loop and a thread that samples the loop's stack when the
    heartbeat is older than ``threshold_ms``."""

    def __init__(self, threshold_ms: float, period_s: float = 0.005):
        self.threshold_s = threshold_ms / 1000
        self.period_s = period_s
        self._beat = time.monotonic()
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self.stalls: list[tuple[float, str]] = []  # (ms, frames seen most), newest last

    async def run(self) -> None:
        """The heartbeat; starts the watcher on first use and stops it when cancelled."""
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        watcher = threading.Thread(target=self._watch, name="loop-stall-watch", daemon=True)
        watcher.start()
        try:
            while True:
                self._beat = time.monotonic()
                await asyncio.sleep(self.period_s)
        finally:
            self._stop.set()

    def _watch(self) -> None:
        seen: Counter[str] = Counter()
        started = 0.0
        while not self._stop.wait(self.period_s):
            now = time.monotonic()
            stalled = now - self._beat > self.threshold_s
            if stalled:
                frame = sys._current_frames().get(self._loop_thread)
                if frame is not None:
                    started = started or self._beat
                    seen[_frames(frame)] += 1
            elif seen:
                self._report((now - started) * 1000, seen)
                seen, started = Counter(), 0.0

    def _report(self, ms: float, seen: Counter[str]) -> None:
        top, n = seen.most_common(1)[0]
        self.stalls.append((ms, top))
        del self.stalls[:-100]
        log.warning(
            "event loop stalled about %.0f ms; the loop's thread was in (%d of %d samples): %s",
            ms,
            n,
            sum(seen.values()),
            top,
        )
