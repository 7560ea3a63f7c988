"""The one small interface both of the scheduler's engines answer.

A request is run by one of two engines: the batching engine (batching.py: the dispatch
core's queues, batches on worker processes) or the generation engine
(generation/engine.py: continuous batching, steps on a generation worker). The service
and the lanes' feed treat them alike: each request goes to the engine that runs its
model, revocations to both, and both are started, reported on and stopped the same way.
Whatever an engine does it does in its own threads, started through the supervisor.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from core.load_report import LoadReport
from core.models.readiness import Readiness
from core.vocab import ModelRef
from scheduler.core.batcher import Pending
from scheduler.core.offsets import TopicPartition


class Announcement(NamedTuple):
    """A version live workers serve, for the registry and the planner."""

    ref: ModelRef
    max_batch: int  # the largest batch (or running set) its workers take
    profile_ms: dict[int, float]  # its cost curve as measured (batch size -> ms)


class RequestEngine(Protocol):
    def runs(self, model: str) -> bool:
        """Whether requests for ``model`` are this engine's."""
        ...

    def take(self, items: list[Pending], owned: set[TopicPartition]) -> None:
        """Fetched requests of this engine's models; those of partitions not in ``owned``
        (revoked since the fetch) are dropped."""
        ...

    def revoke(self, tps: list[TopicPartition]) -> None:
        """Another member owns these partitions now: drop their work here."""
        ...

    def start(self) -> None:
        """Spawn the workers and start the threads."""
        ...

    def refresh(self) -> list[Readiness]:
        """Move the workers toward what is wanted; each version's readiness now."""
        ...

    def announced(self) -> list[Announcement]: ...

    def report(self, report: LoadReport) -> None:
        """Add what admission needs from this engine to the load report."""
        ...

    def stop_restarts(self) -> None:
        """Stopping: workers that exit now stay down (safe in a signal handler)."""
        ...

    def finish(self, deadline: float) -> None:
        """After dispatching stopped: let what runs finish (until ``deadline``, epoch s),
        then stop the workers."""
        ...
