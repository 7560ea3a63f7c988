"""The calls the dispatch core answers: what the runtime and the simulator may ask. Pure.

vLLM's ``SchedulerInterface`` is the example: one protocol names every event the core
hears and every view it gives, so the runtime's threads (scheduler/runtime/) and the
discrete-event simulator (gristmill/simulate/) drive the same object the same way, and
another core that answers these calls can take its place (``Scenario.dispatch``).

Events go in with the time they happened (``now``, epoch s) and plans come out as plain
data (scheduler/core/plans.py). Observers read ``make_stats`` (or the narrower views
below), never the core's fields. Not thread-safe: the runtime makes every call under
one lock (scheduler/runtime/host.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from core.load_report import LoadReport
from core.protocol import ModelInfo, WorkResult
from core.vocab import ModelRef
from scheduler.core.batcher import Pending
from scheduler.core.offsets import TopicPartition
from scheduler.core.plans import DEFAULT_CLASS, InFlight, Lost, Reject, Step, Worker, Write
from scheduler.core.stats import CoreStats, WorkerStats


class SchedulerInterface(Protocol):
    # ---- workers -----------------------------------------------------------------------
    def add_worker(
        self, worker_id: str, models: Sequence[ModelInfo], worker_class: str = DEFAULT_CLASS
    ) -> Worker:
        """A worker said hello; the handle is what every later call about it passes.
        ``worker_class`` names its cost curves (a CPU and a GPU worker differ)."""
        ...

    def set_served(self, w: Worker, models: Sequence[ModelInfo]) -> None:
        """The versions ``w`` takes batches of from now on (the model control's say)."""
        ...

    def retire(self, w: Worker) -> None:
        """The worker's threads are done with it."""
        ...

    # ---- a free worker, and what comes back ------------------------------------------
    def schedule(self, w: Worker, now: float) -> Step:
        """Start this batch, wait until a time, or stop; plus writes for what expired."""
        ...

    def sent(self, w: Worker, entry: InFlight) -> None:
        """The batch's bytes went out: its result may be awaited."""
        ...

    def awaiting(self, w: Worker) -> InFlight | None:
        """The oldest batch on ``w`` once it was sent (its result comes next), else None."""
        ...

    def send_failed(self, w: Worker, entry: InFlight, now: float) -> None:
        """The batch never reached the worker: it goes back unchanged."""
        ...

    def on_result(self, w: Worker, entry: InFlight, result: WorkResult, now: float) -> list[Write]:
        """The oldest batch on ``w`` came back: its rows to write, or its failure plan."""
        ...

    def on_lost(self, w: Worker, error: str, *, ran: bool, now: float) -> Lost:
        """The worker died or hung: what it held goes back, the computing batch blamed."""
        ...

    def done(self, offsets: Iterable[tuple[TopicPartition, int]], rows: int = 0) -> None:
        """Rows (or dead-letter copies) are durable: these offsets may be committed."""
        ...

    # ---- what the consumer lanes report ----------------------------------------------
    def accept(
        self, items: list[Pending], rejects: list[Reject], owned: set[TopicPartition]
    ) -> list[Reject]:
        """Queue fetched requests of owned partitions; returns the rejects to record."""
        ...

    def hold(self, items: list[Pending], owned: set[TopicPartition]) -> list[Pending]:
        """Track the offsets of requests another engine runs; returns those kept."""
        ...

    def revoke(self, tps: list[TopicPartition]) -> None:
        """Another member owns these partitions now: drop their queued work."""
        ...

    def committable(self, only: set[TopicPartition]) -> dict[TopicPartition, int]:
        """Per partition of ``only``, the position everything before which is durable."""
        ...

    def mark_committed(self, positions: dict[TopicPartition, int]) -> None: ...

    def paused(self, current: frozenset[int]) -> frozenset[int]:
        """The classes whose buffer is full (hysteresis from ``current``)."""
        ...

    def set_cancelled(self, ids: frozenset[tuple[str, int]]) -> None:
        """Jobs cancelled by a client (job id, attempt): their queued items are not run."""
        ...

    # ---- views -------------------------------------------------------------------------
    def make_stats(self, now: float) -> CoreStats:
        """A snapshot for metrics and logs."""
        ...

    def worker_stats(self, w: Worker) -> WorkerStats:
        """One worker's part of the snapshot (the model control reads it per tick)."""
        ...

    def demanded(self) -> frozenset[ModelRef]:
        """The versions with requests queued or waiting for a retry."""
        ...

    def batch_limits(self) -> Mapping[ModelRef, int]:
        """The largest batch each model's workers take: a live, read-only view."""
        ...

    def load(self, lag: dict[str, int]) -> LoadReport:
        """Capacity and backlog for the API's admission control."""
        ...

    def class_curves(self) -> dict[tuple[ModelRef, str], tuple[int, dict[int, float], int]]:
        """Per (model, worker class): batch limit, measured curve, live workers."""
        ...

    def live_models(self) -> dict[ModelRef, tuple[int, dict[int, float]]]:
        """Per model live workers serve: the largest batch they take, its curve."""
        ...

    # ---- stopping ------------------------------------------------------------------------
    def idle(self) -> bool:
        """Nothing queued and nothing waiting to be retried."""
        ...

    def any_alive(self) -> bool: ...

    def stop_dispatching(self) -> None:
        """Workers take nothing new; what they hold finishes."""
        ...
