"""SIGINT and SIGTERM for a command that runs services: the first asks for an orderly
stop, another one later asks to stop at once (decision 28).

Two signals that arrive within ``REPEAT_S`` of each other are one request: ``make``
forwards SIGTERM to its child, so a SIGTERM to the process group of ``make dev`` reaches
``gristmill dev`` twice at the same moment, and must not cut its orderly stop short.

The handler never raises: an exception thrown into whatever the main thread is doing
(a Popen, a cleanup) is how processes get lost. It sets events the command polls, and
on "now" it calls ``on_now``, which must only send signals (no locks, no waiting).
"""

from __future__ import annotations

import enum
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

# Signals closer together than this are one request (make's forwarded SIGTERM lands
# within milliseconds of the original); a person's second Ctrl-C comes later than this.
REPEAT_S = 0.5
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stop(enum.Enum):
    RUN = "run"
    ORDERLY = "orderly"
    NOW = "now"


def after_signal(state: Stop, first_at: float | None, now: float) -> Stop:
    """What a stop signal at ``now`` asks for, given the state and when the first came."""
    if state is Stop.RUN:
        return Stop.ORDERLY
    if state is Stop.ORDERLY and first_at is not None and now - first_at >= REPEAT_S:
        return Stop.NOW
    return state


class StopSignals:
    """Install once, in the main thread, before anything is started."""

    def __init__(
        self, on_now: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.on_now = on_now
        self.clock = clock
        self.state = Stop.RUN
        self.first_at: float | None = None
        self.orderly = threading.Event()  # set by the first signal
        self.now = threading.Event()  # set by a later one

    def install(self) -> None:
        # SIGINT explicitly too: a process started in the background inherits it ignored.
        for sig in SIGNALS:
            signal.signal(sig, self.handle)

    def handle(self, signum: int = signal.SIGTERM, frame: FrameType | None = None) -> None:
        at = self.clock()
        before = self.state
        self.state = after_signal(before, self.first_at, at)
        if before is Stop.RUN:
            self.first_at = at
            self.orderly.set()
        elif before is not Stop.NOW and self.state is Stop.NOW:
            self.now.set()
            self.on_now()
