"""Every long-lived thread of the scheduler starts here; one that dies stops the process.

A thread that ends by an exception nobody expected (a bug, a broken invariant) must not
leave the process running and reporting itself alive with its work undone: a consumer
lane that dies leaves its partitions unread while the group still counts them as this
member's, and the load report still offers its workers. Temporal's worker is the model
(``Worker._run``): its parts run under one owner, and the first failure stops the whole
worker in order, logged once. Here the supervisor logs the exception once, with its
thread's name, and calls the stop it was given; the service then drains, persists,
commits, leaves its consumer groups and exits with status 1, so that its orchestrator
starts it again (docs/decisions/0047-the-schedulers-core-and-runtime.md).

What a thread expects (a worker lost, PostgreSQL away, a rebalance) it handles itself;
only what escapes its target reaches the supervisor. A thread whose target returns
simply ends (a dispatcher whose worker is gone, a reader whose connection closed).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

OnFailure = Callable[[str, BaseException], None]


class Supervisor:
    def __init__(self, on_failure: OnFailure | None = None) -> None:
        self._lock = threading.Lock()
        self._on_failure = on_failure
        # The first thread that failed and how (None: none has).
        self.failure: tuple[str, BaseException] | None = None

    def on_failure(self, stop: OnFailure) -> None:
        """What the first failure calls (the process's orderly stop), from the thread
        that failed."""
        with self._lock:
            self._on_failure = stop

    def start(self, target: Callable[..., Any], *args: Any, name: str) -> threading.Thread:
        """Run ``target(*args)`` in a new daemon thread named ``name``, supervised."""
        t = threading.Thread(target=self._run, args=(name, target, args), name=name, daemon=True)
        t.start()
        return t

    def _run(self, name: str, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            target(*args)
        except BaseException as exc:  # whatever escapes is the thread's end: report it
            self._failed(name, exc)

    def _failed(self, name: str, exc: BaseException) -> None:
        with self._lock:
            first = self.failure is None
            if first:
                self.failure = (name, exc)
            stop = self._on_failure
        if not first:  # the process is stopping already; its cause was logged
            log.error("thread %s failed while stopping: %r", name, exc)
            return
        log.critical("thread %s failed; stopping the process", name, exc_info=exc)
        if stop is not None:
            stop(name, exc)
