"""How a job's intake gives way to the sync requests its API instance serves. Pure.

A job's intake runs in the API process that took the upload, in threads beside the
event loop: every item is validated and staged, then encoded and produced to Kafka.
That is CPU-bound Python, and while a thread runs it the event loop waits for the
interpreter lock before each step of every sync request. At 600 sync requests/s on the
2-core box, a 72,000-item job submitted at once held one of the two API processes for
the five seconds of its intake: half the sync requests of those seconds ended 504, and
the lag it left set the overload guard shedding for twenty more (issue 30, decision 40).

So the intake works in slices and, after each, pauses while the event loop lags: not
below half the lowest tier's shed threshold (decision 15; the guard never sees it),
above it for as long as the slice took, scaled by how far past that the lag is, at
most ``MAX_PAUSE_S``, so a job on a busy instance slows down but never stops. On an
idle instance the lag stays low and the intake runs at full speed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

# Messages produced (or bytes staged) between two looks at the event loop's lag.
PUBLISH_SLICE = 500
# The longest pause after one slice (s): the intake keeps at least this pace.
MAX_PAUSE_S = 0.25


def target_lag_ms(loop_lag_shed_ms: Mapping[str, tuple[float, float]]) -> float:
    """Half the lowest tier's shed start: the lag the intake keeps the loop under."""
    return min(lo for lo, _ in loop_lag_shed_ms.values()) / 2


def pause_s(lag_ms: float, target_ms: float, slice_s: float) -> float:
    """The pause after a slice that took ``slice_s`` while the loop lags ``lag_ms``."""
    if target_ms <= 0 or lag_ms <= target_ms:
        return 0.0
    return min(MAX_PAUSE_S, slice_s * lag_ms / target_ms)


class Pacer:
    """``pause_s`` with its inputs bound: the instance's lag (a callable read from any
    thread) and its target."""

    def __init__(self, lag_ms: Callable[[], float], target_ms: float):
        self.lag_ms = lag_ms
        self.target_ms = target_ms
        self.paused_s = 0.0  # in all, for tests and logs

    def after(self, slice_s: float) -> float:
        p = pause_s(self.lag_ms(), self.target_ms, slice_s)
        self.paused_s += p
        return p
