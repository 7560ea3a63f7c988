"""The one home of the lock around the dispatch core.

The core (scheduler/core/dispatch.py) is pure and not thread-safe; the lanes, the
dispatchers and receivers, the persister, the model loop and the heartbeat all reach it
through ``CoreHost``, whose every method is one short section under one condition
variable: the core's call, the wake-up of whoever waits on its outcome, nothing that
blocks on I/O. No other module takes the lock (decisions 0018 and 0047).

The condition also gives a dispatcher its "wake me when work arrives, or at time t"
(``next_step``) and a receiver its "wake me when a batch was sent" (``next_result``).
Several ``CoreHost`` objects may wrap one core and its condition (the worker threads
make their own from the two, and need no model control): a host holds no state of its
own, so they are one host.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from core.load_report import LoadReport
from core.models.readiness import Readiness
from core.models.registry import VersionRecord
from core.protocol import Hello, ModelCommand, ModelInfo, ModelStatus, WorkResult
from core.vocab import ModelRef
from scheduler.core.batcher import Pending
from scheduler.core.interface import SchedulerInterface
from scheduler.core.model_control import Commandable, ModelControl
from scheduler.core.offsets import TopicPartition
from scheduler.core.plans import InFlight, Lost, Reject, Worker, Write
from scheduler.core.stats import CoreStats

# Longest a dispatcher or receiver sleeps without looking again: a missed wake-up (a
# worker that died without a word) costs at most this.
POLL_S = 0.25

Curves = dict[tuple[ModelRef, str], tuple[int, dict[int, float], int]]
Commands = list[tuple[Commandable, ModelCommand]]


class CoreHost:
    def __init__(
        self,
        core: SchedulerInterface,
        cond: threading.Condition | None = None,
        *,
        control: ModelControl | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.core = core
        self.cond = cond or threading.Condition()
        self.control = control
        self.clock = clock

    def wake(self) -> None:
        """Whoever waits on the core looks again (something it waits for changed)."""
        with self.cond:
            self.cond.notify_all()

    # ---- the consumer lanes (each from its own thread) ---------------------------------
    def accept(
        self, items: list[Pending], rejects: list[Reject], owned: set[TopicPartition]
    ) -> list[Reject]:
        with self.cond:
            kept = self.core.accept(items, rejects, owned)
            self.cond.notify_all()
        return kept

    def rejected(self, rejects: list[Reject], owned: set[TopicPartition]) -> list[Reject]:
        """Messages that cannot be queued: their offsets held until they are recorded."""
        with self.cond:
            return self.core.accept([], rejects, owned)

    def hold(self, items: list[Pending], owned: set[TopicPartition]) -> list[Pending]:
        with self.cond:
            return self.core.hold(items, owned)

    def revoke(self, tps: list[TopicPartition]) -> None:
        with self.cond:
            self.core.revoke(tps)

    def committable(self, only: set[TopicPartition]) -> dict[TopicPartition, int]:
        with self.cond:
            return self.core.committable(only)

    def mark_committed(self, positions: dict[TopicPartition, int]) -> None:
        with self.cond:
            self.core.mark_committed(positions)

    def wanted_paused(self, paused: frozenset[int]) -> frozenset[int]:
        with self.cond:
            return self.core.paused(paused)

    # ---- the persister ---------------------------------------------------------------
    def done(self, offsets: list[tuple[TopicPartition, int]], rows: int) -> None:
        with self.cond:
            self.core.done(offsets, rows)

    # ---- a worker's dispatcher and receiver --------------------------------------------
    def add_worker(self, worker_id: str, models: Sequence[ModelInfo], worker_class: str) -> Worker:
        with self.cond:
            w = self.core.add_worker(worker_id, models, worker_class)
            self.cond.notify_all()
        return w

    def next_step(
        self,
        w: Worker,
        alive: Callable[[], bool],
        submit: Callable[[Sequence[Write]], None],
    ) -> InFlight | None:
        """Block until the core releases a batch for ``w`` (None: stop). The writes each
        step plans meanwhile (expired, cancelled) go to ``submit`` (it only queues)."""
        with self.cond:
            while alive():
                now = self.clock()
                step = self.core.schedule(w, now)
                if step.writes:
                    submit(step.writes)
                if step.stop:
                    return None
                if step.start is not None:
                    self.cond.notify_all()  # a lane may resume paused partitions
                    return step.start
                wait = step.wait_until - now
                self.cond.wait(min(max(wait, 0.001), POLL_S) if wait < math.inf else POLL_S)
        return None

    def sent(self, w: Worker, entry: InFlight) -> None:
        with self.cond:
            self.core.sent(w, entry)
            self.cond.notify_all()  # the receiver awaits it

    def send_failed(self, w: Worker, entry: InFlight) -> None:
        with self.cond:
            self.core.send_failed(w, entry, self.clock())
            self.cond.notify_all()

    def next_result(self, w: Worker, done: threading.Event) -> InFlight | None:
        """Block until a batch on ``w`` was sent (its result comes next); None once the
        dispatcher is ``done`` and nothing is left to await."""
        with self.cond:
            while (head := self.core.awaiting(w)) is None and not done.is_set():
                self.cond.wait(POLL_S)
            return head

    def result(self, w: Worker, entry: InFlight, result: WorkResult) -> list[Write]:
        with self.cond:
            writes = self.core.on_result(w, entry, result, self.clock())
            self.cond.notify_all()
        return writes

    def lost(self, w: Worker, error: str, *, ran: bool) -> Lost:
        with self.cond:
            lost = self.core.on_lost(w, error, ran=ran, now=self.clock())
            self.cond.notify_all()
        return lost

    def retire(self, w: Worker) -> None:
        with self.cond:
            self.core.retire(w)

    # ---- the model control (the batching engine's workers, the registry) ----------------
    def _control(self) -> ModelControl:
        assert self.control is not None, "this host was built without a model control"
        return self.control

    def worker_joined(self, handle: Commandable, w: Worker, hello: Hello) -> Commands:
        """A worker said hello: the model control takes it in; its first commands."""
        ctl = self._control()
        with self.cond:
            now = self.clock()
            ctl.add_worker(handle, w, hello.memory_budget_bytes, hello.accepts, hello.models, now)
            commands = ctl.tick(now)
            self.cond.notify_all()
        return commands

    def worker_status(self, handle: Commandable, status: ModelStatus) -> Commands:
        ctl = self._control()
        with self.cond:
            ctl.on_status(handle, status, self.clock())
            commands = ctl.tick(self.clock())
            self.cond.notify_all()
        return commands

    def models_tick(self) -> tuple[Commands, list[Readiness]]:
        """The model control's commands, and each version's readiness, now."""
        ctl = self._control()
        with self.cond:
            commands = ctl.tick(self.clock())
            readiness = ctl.readiness()
            self.cond.notify_all()
        return commands, readiness

    def set_registry(
        self, records: Iterable[VersionRecord], previous_live: Mapping[str, str]
    ) -> None:
        ctl = self._control()
        with self.cond:
            ctl.set_registry(records, previous_live)

    # ---- reports and observers -------------------------------------------------------
    def stats(self) -> CoreStats:
        with self.cond:
            return self.core.make_stats(self.clock())

    def load(self, lag: dict[str, int]) -> LoadReport:
        with self.cond:
            return self.core.load(lag)

    def live_models(self) -> dict[ModelRef, tuple[int, dict[int, float]]]:
        with self.cond:
            return self.core.live_models()

    def class_curves(self) -> Curves:
        with self.cond:
            return self.core.class_curves()

    def set_cancelled(self, ids: frozenset[tuple[str, int]]) -> None:
        with self.cond:
            self.core.set_cancelled(ids)

    # ---- stopping --------------------------------------------------------------------
    def drain(self, until: float) -> None:
        """Let the workers run what is queued until ``until`` (epoch s) or until nothing
        is left or no worker is; then they take nothing new."""
        with self.cond:
            while not self.core.idle() and self.clock() < until and self.core.any_alive():
                self.cond.wait(0.05)
            self.core.stop_dispatching()
            self.cond.notify_all()
