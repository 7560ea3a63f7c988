"""The dispatch decisions the simulator drives: one pluggable piece.

The simulator asks a scheduler's dispatch core what a free worker runs next and tells
it what came back, exactly as the scheduler service does (scheduler/runtime/service.py). The
default is the project's own ``DispatchCore`` (scheduler/core/dispatch.py), built as a
scheduler builds it; another core that answers the same calls can be put in its place
(``Scenario.dispatch`` names a factory in ``FACTORIES``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from core.load_report import LoadReport
from core.protocol import ModelInfo, WorkResult
from core.vocab import PRIORITY_CLASSES
from scheduler.core.backpressure import BufferBudget
from scheduler.core.batcher import FlushPolicy, Pending
from scheduler.core.dispatch import DispatchCore, InFlight, Lost, Reject, Step, Worker, Write
from scheduler.core.offsets import TopicPartition

if TYPE_CHECKING:
    from gristmill.simulate.scenario import Scenario


class Dispatch(Protocol):
    """The calls the simulator makes, as the scheduler service makes them."""

    def add_worker(self, worker_id: str, models: Sequence[ModelInfo]) -> Worker: ...

    def schedule(self, w: Worker, now: float) -> Step: ...

    def on_result(
        self, w: Worker, entry: InFlight, result: WorkResult, now: float
    ) -> list[Write]: ...

    def on_lost(self, w: Worker, error: str, *, ran: bool, now: float) -> Lost: ...

    def accept(
        self, items: list[Pending], rejects: list[Reject], owned: set[TopicPartition]
    ) -> list[Reject]: ...

    def done(self, offsets: Iterable[tuple[TopicPartition, int]], rows: int = 0) -> None: ...

    def committable(self, only: set[TopicPartition]) -> dict[TopicPartition, int]: ...

    def mark_committed(self, positions: dict[TopicPartition, int]) -> None: ...

    def paused(self, current: frozenset[int]) -> frozenset[int]: ...

    def load(self, lag: dict[str, int]) -> LoadReport: ...


def dispatch_core(sc: Scenario) -> Dispatch:
    """The scheduler's own core, with the scenario's flush policy, SLOs and buffer."""
    return DispatchCore(
        flush=FlushPolicy(sc.linger_ms / 1000, sc.margin_ms / 1000),
        batch_budget_ms=sc.batch_budgets_ms(),
        budget=BufferBudget.default(sc.max_buffered, len(PRIORITY_CLASSES)),
    )


FACTORIES: dict[str, Callable[[Scenario], Dispatch]] = {"core": dispatch_core}
